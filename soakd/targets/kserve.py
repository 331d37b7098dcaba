"""``--api kserve-v2``: a model behind the Open Inference Protocol (KServe v2: KServe's
ModelServer, Triton, MLServer, ...), over REST (:class:`KServeRestTarget`, aiohttp) or gRPC
(:class:`KServeGrpcTarget`, grpc.aio with the protocol's ``GRPCInferenceService`` stubs as the
``tritonclient`` package ships them: Triton's service is a superset of KServe's, same package
``inference``, same messages).

At start both ask what the protocol offers: is the server ready, is the model ready, and the
model's metadata (its input's name, datatype and shape). The configured shapes and datatype are
checked against it (a mismatch is TargetError naming both, exit 2) and the payloads are encoded
once from the pooled tensors (:meth:`encode`): JSON bytes for REST, ``ModelInferRequest``
messages for gRPC, so the hot path only sends.

gRPC answers are sorted into the HTTP response classes of the summary and
``soakd_target_responses_total`` with the mapping of Google's API design guide (google.rpc.Code
to HTTP): OK 2xx; INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED,
PERMISSION_DENIED, NOT_FOUND, ABORTED, ALREADY_EXISTS, RESOURCE_EXHAUSTED, CANCELLED 4xx; the
rest 5xx. UNAVAILABLE is not an answer but the server gone (target down, class none), and
DEADLINE_EXCEEDED is outcome ``timeout`` (class none), as a refused connection and a timeout
are over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

from soakd.config import TENSOR_OVERHEAD_BYTES, InputConfig, format_bytes
from soakd.errors import TargetError
from soakd.host_limits import host_memory_bytes
from soakd.specs import V2_DATATYPES, Shape, parse_shape_mix
from soakd.targets.aiohttp_client import AiohttpTarget, read_body
from soakd.targets.answers import MAX_BODY_BYTES, BadAnswer, parse_json, short, status_class
from soakd.targets.client import CHECK_TIMEOUT, ClientTarget, Failure, Sent

if TYPE_CHECKING:  # the tensors come made (shapes.py): an early exit never loads torch
    import torch

log = logging.getLogger("soakd.target")

_C = grpc.StatusCode
GRPC_CLASSES: dict[grpc.StatusCode, str] = {
    _C.OK: "2xx",
    **dict.fromkeys(
        (
            _C.INVALID_ARGUMENT,
            _C.FAILED_PRECONDITION,
            _C.OUT_OF_RANGE,
            _C.UNAUTHENTICATED,
            _C.PERMISSION_DENIED,
            _C.NOT_FOUND,
            _C.ABORTED,
            _C.ALREADY_EXISTS,
            _C.RESOURCE_EXHAUSTED,
            _C.CANCELLED,
        ),
        "4xx",
    ),
}  # any other answered code: 5xx (UNKNOWN, INTERNAL, UNIMPLEMENTED, DATA_LOSS)

# gRPC's own reconnect back-off starts at 1 s and grows to 120 s: a server back after an outage
# would wait minutes for the channel. These keep it to soakd's own back-off (client.BACKOFF_*).
GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", -1),
    # An answer past this fails its call (RESOURCE_EXHAUSTED, class 4xx): never held whole.
    ("grpc.max_receive_message_length", MAX_BODY_BYTES),
]
MAX_DIM = 2**63 - 1  # a dimension of a v2 shape is an int64


@dataclass(frozen=True)
class V2Input:
    """The input tensor the payloads are made for, as the start check settled it."""

    name: str
    datatype: str
    declared: tuple[int, ...] | None  # the metadata's shape (-1: variable), None when not declared
    spec: str  # the per-request shape mix the tensors are made of (--input-shapes, or the metadata's)
    sent: dict[Shape, list[int]]  # each request shape -> the tensor shape sent (batch dimension added)


class V2Model:
    """The served model's name and what soakd was told to send it; :meth:`settle` checks that
    against the model's metadata."""

    def __init__(
        self,
        url: str,
        name: str,
        shapes: str,
        datatype: str | None,
        *,
        samples: bool,
        pool: int = InputConfig.pool,
    ) -> None:
        self.url = url
        self.name = name
        self.shapes = shapes
        self.datatype = datatype
        self.samples = samples  # whole requests from --samples: no tensor is made
        self.pool = pool  # tensors made per shape (input.pool)
        self.input: V2Input | None = None

    def settle(self, inputs: Any, source: str | None = None) -> None:
        """Name the input and fit the configured shapes and datatype to the metadata's ``inputs``;
        TargetError naming both sides when they do not fit, or naming ``source`` (where the
        metadata came from) and the key when the metadata is malformed."""
        where = f"model {self.name!r} at {self.url}"
        inputs = _check_inputs(inputs, source or where)
        if self.samples:
            return
        if len(inputs) > 1:
            names = ", ".join(str(i.get("name")) for i in inputs)
            raise TargetError(
                f"target.model: {where} takes {len(inputs)} inputs ({names}); --input-shapes makes one "
                "tensor: give whole requests with --samples"
            )
        meta = inputs[0] if inputs else {}
        name = str(meta.get("name") or "input-0")
        declared_dt = meta.get("datatype")
        datatype = self.datatype or (str(declared_dt) if declared_dt else "FP32")
        if declared_dt and datatype != declared_dt:
            raise TargetError(
                f"target.datatype: {datatype}, but {where} declares input {name!r} as {declared_dt} "
                f'(set [target] datatype = "{declared_dt}")'
            )
        if datatype not in V2_DATATYPES:
            raise TargetError(
                f"target.datatype: {where} declares input {name!r} as {datatype}, which soakd cannot make "
                "(give whole requests with --samples)"
            )
        raw_shape = meta.get("shape")
        declared = tuple(raw_shape) if raw_shape else None
        spec = self.shapes or _default_spec(declared, where, name)
        if not self.shapes:  # the metadata's shape: the bound --input-shapes is held to (docs/limits.md)
            _check_memory(spec, datatype, self.pool, where, name)
        sent = {}
        for shape, _ in parse_shape_mix(spec):
            fitted = _fit(shape, declared)
            if fitted is None:
                raise TargetError(
                    f"input.shapes: {'x'.join(map(str, shape))} does not fit {where}: input {name!r} has shape "
                    f"{list(declared or ())} (-1: any size; the first dimension may be the batch)"
                )
            sent[shape] = fitted
        self.input = V2Input(name, datatype, declared, spec, sent)
        log.info(
            "target model %s: input %r %s %s; sending %s",
            self.name,
            name,
            datatype,
            list(declared) if declared else "(shape not declared)",
            ", ".join(str(s) for s in sent.values()),
        )

    @property
    def sequence_axis(self) -> Shape | None:
        """The first configured request shape when its last dimension may vary (the model declares
        -1 there, or no shape): a replayed trace then sets it to each row's length. None: fixed."""
        assert self.input is not None, "settle() first"
        shape = parse_shape_mix(self.input.spec)[0][0]
        fitted = _fit((*shape[:-1], 1), self.input.declared) if shape else None
        return shape if fitted is not None and shape[-1] > 1 else None

    def array(self, shape: Shape, tensor: torch.Tensor) -> tuple[list[int], np.ndarray[Any, Any]]:
        """One request tensor as the array sent: the settled datatype and shape (a pooled shape,
        or a replayed row's length along :attr:`sequence_axis`)."""
        assert self.input is not None, "settle() first"
        dtype = np.dtype(V2_DATATYPES[self.input.datatype]).newbyteorder("<")
        arr = tensor.numpy()
        if dtype.kind == "b":
            arr = arr > 0
        elif dtype.kind in "iu":  # small non-negative values: valid as ids or indices
            arr = np.abs(arr) * 2
        sent = self.input.sent.get(shape) or _fit(shape, self.input.declared)
        assert sent is not None, f"{shape} does not fit {self.input.declared}"
        return sent, np.ascontiguousarray(arr.astype(dtype).reshape(sent))


def _check_inputs(inputs: Any, source: str) -> list[dict[str, Any]]:
    """The metadata's ``inputs`` as a list of ``{name, datatype, shape}`` objects; TargetError
    naming ``source`` and the key when it is not one (a server's metadata is untrusted input)."""

    def bad(key: str, value: Any, want: str) -> TargetError:
        return TargetError(f"target.url: {source}: malformed model metadata: {key} is {short(value)}, not {want}")

    if inputs is None:
        return []
    if not isinstance(inputs, list):
        raise bad("inputs", inputs, "a list of tensor descriptions")
    for i, meta in enumerate(inputs):
        if not isinstance(meta, dict):
            raise bad(f"inputs[{i}]", meta, "an object with name, datatype and shape")
        for key in ("name", "datatype"):
            value = meta.get(key)
            if value is not None and not isinstance(value, str):
                raise bad(f"inputs[{i}].{key}", value, "a string")
        shape = meta.get("shape")
        if shape is None:
            continue
        if not isinstance(shape, list) or any(type(d) is not int or not -1 <= d <= MAX_DIM for d in shape):
            raise bad(f"inputs[{i}].shape", shape, "a list of integer dimensions (-1: any size)")
    return inputs


def _check_memory(spec: str, datatype: str, pool: int, where: str, name: str) -> None:
    """The tensors a shape taken from the metadata makes must fit the bound that config validation
    holds ``--input-shapes`` to: ``input.pool`` of each within half this host's RAM."""
    itemsize = np.dtype(V2_DATATYPES[datatype]).itemsize
    need = sum(pool * (math.prod(shape) * itemsize + TENSOR_OVERHEAD_BYTES) for shape, _ in parse_shape_mix(spec))
    host = host_memory_bytes()
    if need > host // 2:
        raise TargetError(
            f"input.shapes: {where} declares input {name!r} as {spec} {datatype}: {pool} pooled tensors of it need "
            f"{format_bytes(need)}, over the bound of half this host's RAM, {format_bytes(host // 2)} of "
            f"{format_bytes(host)} (give --input-shapes)"
        )


def _default_spec(declared: tuple[int, ...] | None, where: str, name: str) -> str:
    """Without --input-shapes: the metadata's shape, its leading batch dimension dropped."""
    if not declared:
        raise TargetError(f"input.shapes: {where} declares no shape for input {name!r}; give --input-shapes")
    dims = declared[1:] if len(declared) > 1 and declared[0] in (-1, 1) else declared
    if any(d < 1 for d in dims):
        raise TargetError(
            f"input.shapes: {where}: input {name!r} has shape {list(declared)}, not a fixed size; give --input-shapes"
        )
    return "x".join(map(str, dims))


def _fit(shape: Shape, declared: tuple[int, ...] | None) -> list[int] | None:
    """The tensor shape to send for one request of ``shape``: a batch of one in front when the
    model's shape has one dimension more (or none is declared); None when it cannot fit."""
    if declared is None:
        return [1, *shape]
    if len(declared) == len(shape) + 1:
        candidate = [1, *shape]
    elif len(declared) == len(shape):
        candidate = list(shape)
    else:
        return None
    ok = all(d == -1 or d == c for d, c in zip(declared, candidate, strict=True))
    return candidate if ok else None


class KServeRestTarget(AiohttpTarget):
    """KServe v2 over REST: ``POST {url}/v2/models/NAME/infer`` with JSON tensors."""

    api = "kserve-v2"

    def __init__(self, url: str, *args: Any, model: V2Model, **kwargs: Any) -> None:
        super().__init__(url, *args, **kwargs)
        self.model = model
        self._base = url.rstrip("/")
        self._model_url = f"{self._base}/v2/models/{quote(model.name, safe='')}"
        self._infer_url = f"{self._model_url}/infer"
        self._headers = {"Content-Type": "application/json"}

    async def _get_json(self, url: str) -> tuple[int, Any]:
        resp = await self._reachable("GET", url)
        async with resp:
            try:
                body = await read_body(resp, self.max_body_bytes)
            except (BadAnswer, aiohttp.ClientError) as exc:
                raise TargetError(f"target.url: {url}: {exc}") from None
        try:
            return resp.status, parse_json(body)
        except ValueError as exc:
            if resp.status == 200:
                raise TargetError(f"target.url: {url}: not a KServe v2 server? ({exc})") from None
            return resp.status, {}

    async def _check(self) -> None:
        status, _ = await self._get_json(f"{self._base}/v2/health/ready")
        if status != 200:
            raise TargetError(f"target.url: {self._base}/v2/health/ready: server not ready (HTTP {status})")
        status, body = await self._get_json(f"{self._model_url}/ready")
        if status == 404:
            said = body.get("error", "") if isinstance(body, dict) else ""
            raise TargetError(f"target.model: {self.model.name!r}: no such model at {self.url} ({said or 'HTTP 404'})")
        if status != 200 or (isinstance(body, dict) and body.get("ready") is False):
            raise TargetError(f"target.model: {self.model.name!r} at {self.url}: not ready (HTTP {status})")
        status, meta = await self._get_json(self._model_url)
        if status != 200 or not isinstance(meta, dict):
            raise TargetError(f"target.url: {self._model_url}: no model metadata (HTTP {status})")
        self.model.settle(meta.get("inputs"), self._model_url)

    def encode(self, shape: Shape, tensor: torch.Tensor) -> bytes:
        assert self.model.input is not None
        sent, arr = self.model.array(shape, tensor)
        tensor_json = {"name": self.model.input.name, "shape": sent, "datatype": self.model.input.datatype}
        return json.dumps({"inputs": [{**tensor_json, "data": arr.reshape(-1).tolist()}]}).encode()

    async def _exchange(self, payload: Any, sent: Sent | None) -> str:
        self.sending(sent)
        async with self.session.post(self._infer_url, data=payload, headers=self._headers) as resp:
            body = await read_body(resp, self.max_body_bytes)
            cls = status_class(resp.status)
            if not 200 <= resp.status < 300:  # the server's "error" text says why, once
                said = body[:200].decode("utf-8", "replace")
                self._log_once(f"status {resp.status}", f"target answered HTTP {resp.status}: {said}")
                return cls
            _check_answer(body, cls)
            return cls


def _check_answer(body: bytes, cls: str) -> None:
    """A 2xx infer answer is a v2 response (a JSON object with an ``outputs`` list and no
    ``error``); anything else (HTML, ``{"error": ...}``) is BadAnswer: outcome ``error``."""
    try:
        doc = parse_json(body)
    except ValueError as exc:
        raise BadAnswer(str(exc), cls) from None
    if not isinstance(doc, dict):
        raise BadAnswer(f"not a v2 infer response: {short(doc)}", cls)
    err = doc.get("error")
    if err is not None:
        raise BadAnswer(f"error: {err if isinstance(err, str) else short(err)}"[:300], cls)
    if not isinstance(doc.get("outputs"), list):
        raise BadAnswer(f"not a v2 infer response (no outputs list): {short(doc)}", cls)


class KServeGrpcTarget(ClientTarget):
    """KServe v2 over gRPC: ``ModelInfer`` on one HTTP/2 channel, at most ``max_connections``
    calls in flight (past that a request waits: its queue stage)."""

    api = "kserve-v2"

    def __init__(self, url: str, *args: Any, model: V2Model, **kwargs: Any) -> None:
        super().__init__(url, *args, **kwargs)
        self.model = model
        self._address = urlsplit(url).netloc  # host:port as written ([::1]:8081 included)
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._slots: asyncio.Semaphore | None = None

    async def _open_client(self) -> None:
        self._channel = grpc.aio.insecure_channel(self._address, options=GRPC_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._slots = asyncio.Semaphore(self.max_connections)

    async def _close_client(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _ask(self, method: str, request: Any) -> Any:
        """One start-check RPC; TargetError naming the URL (or the model) when it fails."""
        try:
            return await getattr(self._stub, method)(request, timeout=CHECK_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == _C.UNAVAILABLE:
                raise TargetError(f"target.url: {self.url}: cannot connect ({self._reason(exc)})") from None
            if code == _C.DEADLINE_EXCEEDED:
                raise TargetError(f"target.url: {self.url}: no answer within {CHECK_TIMEOUT:.0f}s") from None
            if code == _C.NOT_FOUND and method.startswith("Model"):
                raise TargetError(
                    f"target.model: {self.model.name!r}: no such model at {self.url} ({exc.details()})"
                ) from None
            raise TargetError(
                f"target.url: {self.url}: not a KServe v2 gRPC server? ({method}: {self._reason(exc)})"
            ) from None

    async def _check(self) -> None:
        ready = await self._ask("ServerReady", service_pb2.ServerReadyRequest())
        if not ready.ready:
            raise TargetError(f"target.url: {self.url}: server not ready (ServerReady: false)")
        ready = await self._ask("ModelReady", service_pb2.ModelReadyRequest(name=self.model.name))
        if not ready.ready:
            raise TargetError(f"target.model: {self.model.name!r} at {self.url}: not ready (ModelReady: false)")
        meta = await self._ask("ModelMetadata", service_pb2.ModelMetadataRequest(name=self.model.name))
        inputs = [{"name": i.name, "datatype": i.datatype, "shape": list(i.shape)} for i in meta.inputs]
        self.model.settle(inputs, f"{self.url} (ModelMetadata)")

    def encode(self, shape: Shape, tensor: torch.Tensor) -> Any:
        assert self.model.input is not None
        sent, arr = self.model.array(shape, tensor)
        request = service_pb2.ModelInferRequest(model_name=self.model.name)
        request.inputs.add(name=self.model.input.name, datatype=self.model.input.datatype, shape=sent)
        request.raw_input_contents.append(arr.tobytes())
        return request

    def encode_body(self, path: str, body: bytes) -> Any:
        """A ``--samples`` file, a v2 JSON infer request (``{"inputs": [{"name", "shape",
        "datatype", "data"}]}``), as the gRPC message it stands for; TargetError naming the file."""
        request = service_pb2.ModelInferRequest(model_name=self.model.name)
        try:
            doc = json.loads(body)
            for item in doc["inputs"]:
                datatype = str(item["datatype"])
                if datatype not in V2_DATATYPES:
                    raise ValueError(f"datatype {datatype} is not one of {', '.join(V2_DATATYPES)}")
                shape = [int(d) for d in item["shape"]]
                dtype = np.dtype(V2_DATATYPES[datatype]).newbyteorder("<")
                arr = np.asarray(item["data"], dtype=dtype).reshape(shape)
                request.inputs.add(name=str(item["name"]), datatype=datatype, shape=shape)
                request.raw_input_contents.append(arr.tobytes())
        except (ValueError, KeyError, TypeError) as exc:
            raise TargetError(
                f"input.samples: {path}: not a KServe v2 JSON infer request ({type(exc).__name__}: {exc})"
            ) from None
        return request

    async def _exchange(self, payload: Any, sent: Sent | None) -> str:
        assert self._slots is not None
        t0 = self._clock()
        async with self._slots:  # past max_connections calls in flight: wait here (queue stage)
            now = self._clock()
            left = self.timeout - (now - t0)  # the wait for a slot counts, as for a pooled connection
            if left <= 0:
                raise TimeoutError("no call slot within the timeout")
            if sent is not None:
                sent.t = now  # grpc.aio writes the call at once: this is as near the wire as it shows
            try:
                await self._stub.ModelInfer(payload, timeout=left)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code in (_C.UNAVAILABLE, _C.DEADLINE_EXCEEDED):
                    raise
                self._log_once(f"grpc {code.name}", f"target answered gRPC {code.name}: {exc.details()}")
                return GRPC_CLASSES.get(code, "5xx")
        return "2xx"

    def _failure(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, grpc.aio.AioRpcError):
            return "timeout" if exc.code() == _C.DEADLINE_EXCEEDED else "down"
        return super()._failure(exc)

    def _reason(self, exc: BaseException) -> str:
        if isinstance(exc, grpc.aio.AioRpcError):
            details = (exc.details() or "").splitlines()[0] if exc.details() else ""
            if "connection refused" in details.lower():
                return "connection refused"
            return f"{exc.code().name.lower()}: {details[:200]}"
        return super()._reason(exc)


def kserve_target(url: str, *args: Any, model: V2Model, **kwargs: Any) -> KServeRestTarget | KServeGrpcTarget:
    """REST for ``http(s)://``, gRPC for ``grpc://`` (the URL scheme picks)."""
    if urlsplit(url).scheme == "grpc":
        return KServeGrpcTarget(url, *args, model=model, **kwargs)
    return KServeRestTarget(url, *args, model=model, **kwargs)


__all__ = ["GRPC_CLASSES", "KServeGrpcTarget", "KServeRestTarget", "V2Input", "V2Model", "kserve_target"]
