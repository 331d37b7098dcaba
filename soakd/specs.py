"""The strings a config holds, parsed without torch, numpy or a scheduler.

Model SPECs (``builtin:NAME``, ``torchscript:PATH``, ``export:PATH``, ``python:MODULE:FACTORY``),
input shape mixes (``3x224x224=0.6,3x96x96=0.4``), sequence-length specs
(``seq:lognormal(mean=128,sigma=0.5)``) and crontab lines. :mod:`soakd.config` validates with
these, and the modules that build from them (models, workload, phases) parse with the same
functions, so a spec check-config accepts is one the run accepts. Imports only the standard
library and :mod:`soakd.errors`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from soakd.errors import ConfigError

# --------------------------------------------------------------------------- model specs

KINDS = ("builtin", "torchscript", "export", "python")

# Builtin model names and their default input shape (one request, no batch dimension).
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
            '(--input-shapes 3x224x224, or [input] shapes = "3x224x224") or --samples DIR'
        )


# --------------------------------------------------------------------------- shape mixes
#
# ``x`` joins the dimensions of one request's shape (``3x224x224``); ``,`` separates the entries of
# a weighted mix (``3x224x224=0.6,3x96x96=0.4``; an entry without ``=W`` weighs 1). So
# ``3,224,224`` would be three 1-D shapes; nobody means that, and a model fed it fails far from
# the typo, so a mix of bare 1-D shapes is refused with the ``x`` spelling suggested. A real mix
# of 1-D shapes gives its weights (``16=1,32=1``).

Shape = tuple[int, ...]

_SHAPE_ITEM = re.compile(r"^(\d+(?:x\d+)*)(?:=(\d+(?:\.\d*)?|\.\d+))?$")
_SHAPE_HINT = "use e.g. 3x224x224 or 3x224x224=0.6,3x96x96=0.4"


def parse_shape_mix(spec: str) -> list[tuple[Shape, float]]:
    """``"3x224x224=0.6,3x96x96=0.4"`` -> [((3,224,224), 0.6), ((3,96,96), 0.4)]; weights
    normalised. Raises ValueError naming ``input.shapes`` and the offending entry."""
    parts = [p for p in spec.replace(" ", "").split(",") if p]
    if not parts:
        raise ValueError("input.shapes: no shape given")
    items: list[tuple[Shape, float]] = []
    for part in parts:
        m = _SHAPE_ITEM.match(part)
        if m is None:
            raise ValueError(f"input.shapes: cannot parse {part!r} ({_SHAPE_HINT})")
        shape = tuple(int(d) for d in m.group(1).split("x"))
        if any(d <= 0 for d in shape):
            raise ValueError(f"input.shapes: dimensions must be positive in {part!r}")
        w = float(m.group(2)) if m.group(2) else 1.0
        if not (w > 0 and math.isfinite(w)):
            raise ValueError(f"input.shapes: weight must be a finite number > 0 in {part!r}")
        items.append((shape, w))
    if len(parts) > 1 and all("x" not in p and "=" not in p for p in parts):
        joined = "x".join(parts)
        raise ValueError(
            f"input.shapes: {spec.strip()!r} reads as {len(parts)} one-dimensional shapes; dimensions of one "
            f"shape are joined by 'x' (did you mean {joined!r}?); a mix of 1-D shapes needs weights "
            f"({'=1,'.join(parts)}=1)"
        )
    total = sum(w for _, w in items)
    return [(s, w / total) for s, w in items]


# --------------------------------------------------------------------------- KServe v2 tensors

# The Open Inference Protocol's tensor datatypes soakd can make (``[target] datatype``), each with
# the numpy dtype its data is made and sent in (raw little-endian bytes over gRPC, numbers in JSON).
# BYTES (strings) and BF16 have no numpy dtype: a model taking them is soaked with --samples.
V2_DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
}


# --------------------------------------------------------------------------- sequence lengths

SEQ_PREFIX = "seq:"
MAX_VOCAB = 2**62  # token ids are int64; torch.randint's bound must fit one
_SEQ_RE = re.compile(r"^seq:(fixed|uniform|lognormal)\(([^)]*)\)$")
_SEQ_PARAMS = {
    "fixed": ({"n"}, set()),
    "uniform": ({"min", "max"}, set()),
    "lognormal": ({"mean", "sigma"}, {"min", "max"}),
}


@dataclass(frozen=True)
class SeqLenSpec:
    dist: str
    params: dict[str, float]
    low: int
    high: int
    vocab: int


def is_seq_spec(spec: str) -> bool:
    return spec.replace(" ", "").startswith(SEQ_PREFIX)


def parse_seq_spec(spec: str) -> SeqLenSpec:
    """Parse ``seq:DIST(k=v,...)``; ValueError names ``input.shapes`` and what is wrong."""
    text = spec.replace(" ", "")
    m = _SEQ_RE.match(text)
    if not m:
        raise ValueError(
            f"input.shapes: cannot parse {spec!r} (use seq:fixed(n=128), seq:uniform(min=8,max=512) "
            "or seq:lognormal(mean=128,sigma=0.5,min=8,max=512))"
        )
    dist, body = m.group(1), m.group(2)
    params: dict[str, float] = {}
    for item in filter(None, body.split(",")):
        key, sep, value = item.partition("=")
        try:
            params[key] = float(value) if sep else math.nan
        except ValueError:
            raise ValueError(f"input.shapes: {key}={value!r} is not a number in {spec!r}") from None
    required, optional = _SEQ_PARAMS[dist]
    vocab_f = params.pop("vocab", 30522.0)
    unknown = set(params) - required - optional
    missing = required - set(params)
    if unknown or missing:
        what = f"unknown {sorted(unknown)}" if unknown else f"missing {sorted(missing)}"
        raise ValueError(f"input.shapes: {dist}: {what} parameter(s) in {spec!r}")
    if any(not math.isfinite(v) or v <= 0 for v in (*params.values(), vocab_f)) or vocab_f < 2:
        raise ValueError(f"input.shapes: parameters must be finite positive numbers in {spec!r}")
    if vocab_f > MAX_VOCAB:
        raise ValueError(
            f"input.shapes: vocab={vocab_f:g} is over the bound of {MAX_VOCAB} (token ids are int64) in {spec!r}"
        )
    vocab = int(vocab_f)
    if dist == "fixed":
        low = high = int(params["n"])
    elif dist == "uniform":
        low, high = int(params["min"]), int(params["max"])
    else:
        mean = params["mean"]
        low = int(params.get("min", 1))
        high = int(params.get("max", math.ceil(mean * 8)))
    if low < 1 or high < low:
        raise ValueError(f"input.shapes: need 1 <= min <= max in {spec!r}")
    return SeqLenSpec(dist, params, low, high, vocab)


# --------------------------------------------------------------------------- crontab

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
# (field, low, high, names): APScheduler 3's CronTrigger.from_crontab fields and ranges
# (its day of week counts 0 = Monday; names are the safe way to write one).
_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _WEEKDAYS),
)
_CRON_ITEM_RE = re.compile(r"^(\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(\d+))?$")


def check_crontab(expr: str) -> None:
    """Check a five-field crontab line (minute hour day month weekday) as APScheduler 3 reads it:
    ``*``, ``N``, ``A-B``, ``*/STEP``, ``A-B/STEP`` and comma lists; month and weekday names.
    ValueError says which field is wrong."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"wrong number of fields: got {len(fields)}, expected 5")
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        for item in text.lower().split(","):
            m = _CRON_ITEM_RE.match(item)
            if m is None:
                raise ValueError(f"{name}: cannot parse {item!r}")
            if m.group(2) is not None and int(m.group(2)) < 1:
                raise ValueError(f"{name}: step must be >= 1 in {item!r}")
            if m.group(1) == "*":
                continue
            bounds = []
            for part in m.group(1).split("-"):
                if part.isdigit():
                    value = int(part)
                elif part in names:
                    value = names.index(part) + (low if names is _MONTHS else 0)
                else:
                    raise ValueError(
                        f"{name}: {part!r} is not a number" + (f" or a name ({', '.join(names)})" if names else "")
                    )
                if not low <= value <= high:
                    raise ValueError(f"{name}: {value} is outside [{low}, {high}]")
                bounds.append(value)
            if len(bounds) == 2 and bounds[0] > bounds[1]:
                raise ValueError(f"{name}: range {item!r} runs backwards")
