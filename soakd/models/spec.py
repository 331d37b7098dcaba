"""Model SPEC strings: parsed in :mod:`soakd.specs` (free of torch, so config validation can use
them); re-exported here for the loader and the models package."""

from __future__ import annotations

from soakd.specs import (
    BUILTIN_DEFAULT_SHAPES,
    KINDS,
    ModelSpec,
    ModelSpecError,
    check_model_input,
    check_model_spec,
    parse_model_spec,
)

__all__ = ["BUILTIN_DEFAULT_SHAPES", "KINDS", "ModelSpec", "ModelSpecError", "check_model_input",
           "check_model_spec", "parse_model_spec"]
