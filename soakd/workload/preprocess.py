"""Pre-processing: what a server does to a request body before the model sees it.

Read the file, then by kind: decode an image with Pillow, resize it to the model's input and
normalise it (ImageNet mean and std) into a CHW tensor; parse a JSON body carrying a base64
image, an array or text; or tokenize a line of text. Anything that cannot be turned into a
tensor raises :class:`BadInput`, which the engine counts as ``outcome="bad_input"``.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from soakd.workload.seqlen import PAD_KEY

if TYPE_CHECKING:  # torch is loaded when a tensor is first made: a served target's soak never does
    import torch

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp"})
JSON_EXTENSIONS = frozenset({".json"})
TEXT_EXTENSIONS = frozenset({".txt"})
DEFAULT_MAX_SAMPLE_BYTES = 64 * 1024 * 1024  # input.max_sample_bytes' default
# Normalisation as one multiply-add per pixel: (x / 255 - mean) / std = x * scale - offset, per
# channel (ImageNet statistics for RGB; mean 0.5, std 0.25 for grey).
_MEAN = {3: np.array([0.485, 0.456, 0.406]), 1: np.array([0.5])}
_STD = {3: np.array([0.229, 0.224, 0.225]), 1: np.array([0.25])}
_SCALE = {c: (1.0 / (255.0 * _STD[c])).astype(np.float32)[:, None, None] for c in (1, 3)}
_OFFSET = {c: (_MEAN[c] / _STD[c]).astype(np.float32)[:, None, None] for c in (1, 3)}


class BadInput(ValueError):
    """A sample that cannot become a model input (corrupt, empty, wrong layout)."""


@dataclass(frozen=True)
class TextLine:
    """One line of a text sample file (the source reads lines; tokenizing is preprocessing)."""

    path: str
    text: str
    error: str | None = None  # set when the line could not be read whole (too long): bad input


def decode_image(data: bytes, shape: tuple[int, int, int]) -> torch.Tensor:
    """Encoded image bytes -> normalised float32 tensor ``shape`` (C, H, W), C = 1 or 3."""
    if not data:
        raise BadInput("empty image")
    c, h, w = shape
    try:
        with Image.open(io.BytesIO(data)) as src:
            rgb = src.convert("RGB" if c == 3 else "L")  # decodes; raises on truncated data
            resized = rgb.resize((w, h), Image.Resampling.BILINEAR)
            pixels = np.asarray(resized)  # uint8, HxWxC (HxW for grey)
    except UnidentifiedImageError:
        raise BadInput("not an image format Pillow recognises") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise BadInput(f"cannot decode image: {exc}") from None
    chw = pixels.transpose(2, 0, 1) if c == 3 else pixels[None]
    # Convert while copying into CHW order, then scale in place: about 6x faster than
    # normalising in HWC float and transposing after.
    arr = chw.astype(np.float32, order="C")
    arr *= _SCALE[c]
    arr -= _OFFSET[c]
    import torch  # in-process only: a served target's soak never loads torch

    return torch.from_numpy(arr)


def tokenize(text: str, vocab: int, max_tokens: int) -> torch.Tensor:
    """Whitespace tokens hashed to ids in [1, vocab) (0 is padding): a stand-in tokenizer whose
    cost and output lengths follow the text."""
    words = text.split(None, max_tokens)[:max_tokens]  # never splits more of a long line than it keeps
    if not words:
        raise BadInput("no tokens")
    import torch  # in-process only: a served target's soak never loads torch

    return torch.tensor([zlib.crc32(w.encode()) % (vocab - 1) + 1 for w in words], dtype=torch.int64)


class Preprocessor:
    """Turns a sample (a file path or a :class:`TextLine`) into ``(batch key, tensor)``.

    ``image_shape`` is the (C, H, W) images are resized to (None: images are bad input);
    ``pad``: token sequences share one batch key and are padded to the batch's longest;
    ``max_sample_bytes``: a larger file is bad input, read no further than that.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int] | None,
        dtype: torch.dtype | None = None,  # None: float32
        *,
        pad: bool = False,
        vocab: int = 30522,
        max_tokens: int = 512,
        max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES,
    ) -> None:
        self.image_shape = image_shape
        self.max_sample_bytes = max_sample_bytes
        import torch  # in-process only: a served target's soak never loads torch

        self.dtype = torch.float32 if dtype is None else dtype
        self.pad = pad
        self.vocab = vocab
        self.max_tokens = max_tokens

    def __call__(self, item: str | TextLine) -> tuple[Any, torch.Tensor]:
        if isinstance(item, TextLine):
            if item.error is not None:
                raise BadInput(item.error)
            if self.image_shape is not None:  # a labels.txt beside the images: token ids would fail in forward
                raise BadInput("a line of text, but the model takes images (CxHxW)")
            return self._text(item.text)
        path = Path(item)
        data = self._read(path)
        suffix = path.suffix.lower()
        if suffix in JSON_EXTENSIONS:
            return self._json(data)
        if suffix in IMAGE_EXTENSIONS:
            return self._image(data)
        raise BadInput(f"unsupported sample type {suffix!r}")

    def _read(self, path: Path) -> bytes:
        """The whole file, or BadInput when it is larger than ``max_sample_bytes``: the read is
        bounded, so a file that grows (or lies in its size) still costs at most the limit."""
        limit = self.max_sample_bytes
        try:
            with path.open("rb") as fh:
                if os.fstat(fh.fileno()).st_size > limit:
                    raise BadInput(f"larger than input.max_sample_bytes ({limit} bytes)")
                data = fh.read(limit + 1)
        except OSError as exc:
            raise BadInput(f"cannot read: {exc.strerror}") from None
        if len(data) > limit:
            raise BadInput(f"larger than input.max_sample_bytes ({limit} bytes)")
        return data

    def _text(self, text: str) -> tuple[Any, torch.Tensor]:
        return self._tokens(tokenize(text, self.vocab, self.max_tokens))

    def _image(self, data: bytes) -> tuple[Any, torch.Tensor]:
        if self.image_shape is None:
            raise BadInput("an image, but the model input is not CxHxW (set input.shapes)")
        tensor = decode_image(data, self.image_shape).to(self.dtype)
        return self.image_shape, tensor

    def _tokens(self, ids: torch.Tensor) -> tuple[Any, torch.Tensor]:
        return (PAD_KEY if self.pad else tuple(ids.shape)), ids

    def _json(self, data: bytes) -> tuple[Any, torch.Tensor]:
        """Bodies: ``{"image": "<base64>"}``, ``{"array": [[...]]}`` or ``{"text": "..."}``."""
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadInput(f"not valid JSON: {exc}") from None
        except RecursionError:
            raise BadInput("not valid JSON: nested too deeply") from None
        if not isinstance(body, dict):
            raise BadInput("JSON body is not an object")
        if isinstance(body.get("image"), str):
            b64 = body["image"]
            if b64.startswith("data:"):  # data URL: data:image/png;base64,....
                b64 = b64.partition(",")[2]
            try:
                raw = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise BadInput(f"image is not valid base64: {exc}") from None
            return self._image(raw)
        if "array" in body:
            try:
                arr = np.asarray(body["array"], dtype=np.float32)
            except (ValueError, TypeError, RecursionError) as exc:
                raise BadInput(f"array is not a numeric nd-array: {type(exc).__name__}: {exc}") from None
            if arr.size == 0:
                raise BadInput("array is empty")
            import torch  # in-process only: a served target's soak never loads torch

            return tuple(arr.shape), torch.from_numpy(arr).to(self.dtype)
        if isinstance(body.get("text"), str):
            return self._text(body["text"])
        raise BadInput("JSON body has none of the keys image (base64), array, text")
