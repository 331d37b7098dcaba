"""Model loading: builtin models, TorchScript, torch.export programs, Python factories."""

from soakd.specs import ModelSpec, parse_model_spec

__all__ = ["ModelSpec", "parse_model_spec"]
