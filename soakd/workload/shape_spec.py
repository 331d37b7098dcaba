"""The ``--input-shapes`` syntax for tensors, parsed without torch (config validation uses it).

``x`` joins the dimensions of one request's shape (``3x224x224``); ``,`` separates the entries of
a weighted mix (``3x224x224=0.6,3x96x96=0.4``; an entry without ``=W`` weighs 1). So
``3,224,224`` would be three 1-D shapes; nobody means that, and a model fed it fails far from
the typo, so a mix of bare 1-D shapes is refused with the ``x`` spelling suggested. A real mix
of 1-D shapes gives its weights (``16=1,32=1``).
"""

from __future__ import annotations

import re

Shape = tuple[int, ...]

_ITEM = re.compile(r"^(\d+(?:x\d+)*)(?:=(\d+(?:\.\d*)?|\.\d+))?$")
_HINT = "use e.g. 3x224x224 or 3x224x224=0.6,3x96x96=0.4"


def parse_shape_mix(spec: str) -> list[tuple[Shape, float]]:
    """``"3x224x224=0.6,3x96x96=0.4"`` -> [((3,224,224), 0.6), ((3,96,96), 0.4)]; weights
    normalised. Raises ValueError naming ``input.shapes`` and the offending entry."""
    parts = [p for p in spec.replace(" ", "").split(",") if p]
    if not parts:
        raise ValueError("input.shapes: no shape given")
    items: list[tuple[Shape, float]] = []
    for part in parts:
        m = _ITEM.match(part)
        if m is None:
            raise ValueError(f"input.shapes: cannot parse {part!r} ({_HINT})")
        shape = tuple(int(d) for d in m.group(1).split("x"))
        if any(d <= 0 for d in shape):
            raise ValueError(f"input.shapes: dimensions must be positive in {part!r}")
        w = float(m.group(2)) if m.group(2) else 1.0
        if w <= 0:
            raise ValueError(f"input.shapes: weight must be > 0 in {part!r}")
        items.append((shape, w))
    if len(parts) > 1 and all("x" not in p and "=" not in p for p in parts):
        joined = "x".join(parts)
        raise ValueError(
            f"input.shapes: {spec.strip()!r} reads as {len(parts)} one-dimensional shapes; dimensions of one "
            f"shape are joined by 'x' (did you mean {joined!r}?); a mix of 1-D shapes needs weights "
            f"({'=1,'.join(parts)}=1)")
    total = sum(w for _, w in items)
    return [(s, w / total) for s, w in items]
