"""Arrivals, the dynamic batcher, and the engine that times each stage of each request."""
