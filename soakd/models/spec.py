"""Model SPEC strings (``builtin:NAME``, ``torchscript:PATH``, ``export:PATH``,
``python:MODULE:FACTORY``), parsed and checked without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from soakd.errors import ConfigError

KINDS = ("builtin", "torchscript", "export", "python")

# Builtin model names and their default input shape (one request, no batch dimension).
# Kept here, free of torch, so config validation and `soakd analyze` stay light.
BUILTIN_DEFAULT_SHAPES: dict[str, str] = {
    "convnet": "3x224x224",
    "noop": "16",
    "sleep": "16",
    "flaky": "16",
    "hang": "16",
    "detector": "3x320x320",
    "leak_host": "16",
    "leak_cuda": "16",
    "fragment_cuda": "16",
}


class ModelSpecError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    kind: str
    target: str  # builtin name, file path, or module
    factory: str | None = None  # python: the callable's name

    @property
    def path(self) -> Path | None:
        if self.kind in ("torchscript", "export"):
            return Path(self.target)
        if self.kind == "python" and self.target.endswith(".py"):
            return Path(self.target)
        return None


def parse_model_spec(spec: str) -> ModelSpec:
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in KINDS or not rest:
        raise ModelSpecError(
            f"model.spec: cannot parse {spec!r} (use builtin:NAME, torchscript:PATH, export:PATH "
            "or python:MODULE:FACTORY)"
        )
    if kind == "python":
        module, sep, factory = rest.rpartition(":")
        if not sep or not module or not factory.isidentifier():
            raise ModelSpecError(f"model.spec: {spec!r}: expected python:MODULE:FACTORY")
        return ModelSpec(kind, module, factory)
    return ModelSpec(kind, rest)


def check_model_spec(spec: str) -> ModelSpec:
    """Parse and check what can be checked before loading: builtin names, files that exist."""
    try:
        parsed = parse_model_spec(spec)
    except ModelSpecError as exc:
        raise ConfigError(str(exc)) from None
    if parsed.kind == "builtin" and parsed.target not in BUILTIN_DEFAULT_SHAPES:
        raise ConfigError(
            f"model.spec: unknown builtin model {parsed.target!r} (known: {', '.join(sorted(BUILTIN_DEFAULT_SHAPES))})"
        )
    path = parsed.path
    if path is not None and not path.is_file():
        raise ConfigError(f"model.spec: {path}: model file not found")
    return parsed


def check_model_input(spec: str, shapes: str, samples: str | None) -> None:
    """A model file carries no input shape soakd can read before loading it: a TorchScript or
    torch.export model needs ``input.shapes`` (or ``input.samples``), or every run fails at
    warm-up. Builtins have defaults; a python factory may set ``soakd_input_shape``."""
    kind = spec.partition(":")[0]
    if kind in ("torchscript", "export") and not shapes.strip() and samples is None:
        raise ConfigError(
            f"input.shapes: {spec} has no default input shape; give one per request "
            "(--input-shapes 3x224x224, or [input] shapes = \"3x224x224\") or --samples DIR")
