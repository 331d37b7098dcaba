"""Turn a model SPEC into a callable on a batch, placed on a device, with its fingerprint."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from soakd import __version__
from soakd.config import ConfigError
from soakd.errors import ModelLoadError
from soakd.models.builtin import BUILTINS
from soakd.models.spec import BUILTIN_DEFAULT_SHAPES, ModelSpec, parse_model_spec

BatchFn = Callable[[torch.Tensor], Any]


@dataclass
class LoadedModel:
    spec: str
    fn: BatchFn
    device: torch.device
    dtype: torch.dtype
    sha256: str
    default_shape: str | None
    load_seconds: float
    module: nn.Module | None


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"model.device: {device!r} requested but CUDA is not available here")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"model.device: {device!r} but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    return dev


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _module_sha256(module: nn.Module, name: str, options: dict[str, Any]) -> str:
    """A builtin has no file: hash its spec and options, the soakd version that defines it, and
    its parameters and buffers in order (seeded, so the same on every run; models/seeded.py)."""
    opts = json.dumps(options, sort_keys=True, default=str)
    h = hashlib.sha256(f"{name}\0{opts}\0soakd {__version__}\0".encode())
    for key, tensor in module.state_dict().items():
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _call_with_options(factory: Callable[..., Any], options: dict[str, Any], where: str) -> Any:
    params = inspect.signature(factory).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_kwargs:
        for key in options:
            if key not in params:
                known = ", ".join(params) or "none"
                raise ConfigError(f"model.options.{key}: {where} takes no such option (known: {known})")
    try:
        return factory(**options)
    except TypeError as exc:
        raise ConfigError(f"model.options: {where}: {exc}") from None
    except ConfigError:  # the factory's own check of an option names its key already
        raise
    except Exception as exc:  # the user's factory failed: a load error to fix, not a crash to restart
        raise ModelLoadError(f"{where}: factory raised {type(exc).__name__}: {exc}") from exc


def _one_line(exc: BaseException) -> str:
    """The error as one line: a SyntaxError's file:line and message, else ``Type: message``
    (``SystemExit`` too: a module that calls sys.exit() on import is a load error, not an exit)."""
    if isinstance(exc, SyntaxError):
        return f"{type(exc).__name__} at {exc.filename}:{exc.lineno}: {exc.msg}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _import_python(spec: ModelSpec) -> tuple[Callable[..., Any], Path | None]:
    assert spec.factory is not None
    path: Path | None
    if spec.target.endswith(".py"):
        path = Path(spec.target).resolve()
        mod_name = f"soakd_user_model_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ModelLoadError(f"{path}: cannot import as a Python module")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            del sys.modules[mod_name]
            raise ModelLoadError(f"{path}: cannot import: {_one_line(exc)}") from None
    else:
        try:
            module = importlib.import_module(spec.target)
        except ImportError as exc:
            raise ModelLoadError(f"model.spec: cannot import module {spec.target!r}: {exc}") from None
        except (Exception, SystemExit) as exc:
            raise ModelLoadError(f"model.spec: cannot import module {spec.target!r}: {_one_line(exc)}") from None
        path = Path(module.__file__) if module.__file__ else None
    factory = getattr(module, spec.factory, None)
    if factory is None or not callable(factory):
        raise ModelLoadError(f"model.spec: {spec.target} has no callable {spec.factory!r}")
    return factory, path


def load_model(
    spec_text: str, device: str = "auto", dtype: str = "float32", options: dict[str, Any] | None = None
) -> LoadedModel:
    """Load, move to the device and put in eval mode; time it (cold start is part of the truth)."""
    options = dict(options or {})
    spec = parse_model_spec(spec_text)
    dev = resolve_device(device)
    tdtype = getattr(torch, dtype)
    t0 = time.perf_counter()
    module: nn.Module | None = None
    fn: Any
    default_shape: str | None = None
    if spec.kind == "builtin":
        factory = BUILTINS.get(spec.target)
        if factory is None:
            raise ConfigError(f"model.spec: unknown builtin model {spec.target!r}")
        fn = _call_with_options(factory, options, f"builtin:{spec.target}")
        default_shape = BUILTIN_DEFAULT_SHAPES.get(spec.target)
    elif spec.kind == "torchscript":
        try:
            fn = torch.jit.load(spec.target, map_location=dev)  # type: ignore[no-untyped-call]
        except Exception as exc:
            raise ModelLoadError(f"{spec.target}: not a loadable TorchScript file: {exc}") from None
    elif spec.kind == "export":
        try:
            fn = torch.export.load(spec.target).module()
        except Exception as exc:
            raise ModelLoadError(f"{spec.target}: not a loadable torch.export program: {exc}") from None
    else:
        factory, _ = _import_python(spec)
        fn = _call_with_options(factory, options, spec_text)
        if not callable(fn):
            raise ModelLoadError(f"{spec_text}: factory returned {type(fn).__name__}, not a module or callable")
        default_shape = getattr(fn, "soakd_input_shape", None)
    if isinstance(fn, nn.Module):
        module = fn
        if spec.kind != "export":  # exported programs reject .eval()/.to(); they carry their own placement
            module = module.to(device=dev, dtype=tdtype if any(True for _ in module.parameters()) else None)
            module.eval()
        fn = module
    if spec.kind == "builtin":
        assert module is not None
        sha = _module_sha256(module, spec_text, options)
    else:
        path = spec.path
        if spec.kind == "python" and path is None:
            _, path = _import_python(spec)
        sha = _file_sha256(path) if path is not None else ""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    load_seconds = time.perf_counter() - t0
    return LoadedModel(spec_text, fn, dev, tdtype, sha, default_shape, load_seconds, module)
