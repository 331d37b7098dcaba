"""The ``--input-shapes`` syntax for tensors: parsed in :mod:`soakd.specs` (torch-free, where
config validation reads it); re-exported here for the workload modules."""

from __future__ import annotations

from soakd.specs import Shape, parse_shape_mix

__all__ = ["Shape", "parse_shape_mix"]
