"""Request sources: synthetic shape mixes and sample replay, with their pre/post-processing."""
