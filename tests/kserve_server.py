"""A KServe ``ModelServer`` hosting a small torch model over the Open Inference Protocol (KServe v2),
REST and gRPC, for the kserve-v2 target tests. Run with the servers' venv's python (the ``kserve``
package is not soakd's dependency):

    .venv-servers/bin/python tests/kserve_server.py HTTP_PORT GRPC_PORT [--leak-mib N] [--stall-ms MS --stall-every N]
        [--lengths-file F]

Four models. Three are a 16 -> 4 linear layer, input ``x`` FP32 ``[-1, 16]``, output ``y``: ``tiny``;
``leaky``, which keeps ``--leak-mib`` MiB of host memory per request (a list that only grows);
``stally``, whose every ``--stall-every``-th request sleeps ``--stall-ms`` first (holding the
event loop, as a model stuck in a kernel would hold the server); and ``seqy``, token ids INT64
``[-1, -1]`` of any length, each request's length appended to ``--lengths-file`` (replay sizes).
One process for all four: the tests share one server start. Ready when ``/v2/health/ready``
answers and the gRPC port accepts.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

# kserve parses sys.argv when it is imported: take ours off first, then hand it none.
parser = argparse.ArgumentParser()
parser.add_argument("http_port", type=int)
parser.add_argument("grpc_port", type=int)
parser.add_argument("--leak-mib", type=float, default=1.0)  # fractional: a faint leak (KiB a request)
parser.add_argument("--stall-ms", type=float, default=200.0)
parser.add_argument("--stall-every", type=int, default=40)
parser.add_argument("--lengths-file", default=None)
opts = parser.parse_args()
sys.argv = sys.argv[:1]

import kserve  # noqa: E402
import torch  # noqa: E402
from kserve.errors import InvalidInput  # noqa: E402
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse  # noqa: E402


class Tiny(kserve.Model):  # type: ignore[misc]
    def __init__(self, name: str, *, leak_mib: float = 0.0, stall_ms: float = 0.0, stall_every: int = 0) -> None:
        super().__init__(name)
        self.leak_mib, self.stall_ms, self.stall_every = leak_mib, stall_ms, stall_every
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.net = torch.nn.Linear(16, 4).eval()
        self.kept: list[bytearray] = []  # --leak-mib: never freed
        self.calls = 0
        self.ready = True

    def get_input_types(self) -> list[dict[str, Any]]:
        return [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]

    async def predict(self, payload: InferRequest, headers: Any = None, response_headers: Any = None) -> InferResponse:
        self.calls += 1
        if self.stall_every and self.calls % self.stall_every == 0:
            time.sleep(self.stall_ms / 1000)  # blocks the loop: every request behind it waits too
        if self.leak_mib:
            block = bytearray(int(self.leak_mib * (1 << 20)))
            block[::4096] = b"\x01" * len(block[::4096])  # touch each page: resident, not just mapped
            self.kept.append(block)
        data = payload.inputs[0].as_numpy()
        if data.size % 16:  # a handled error: HTTP 400 / gRPC INVALID_ARGUMENT, the connection kept
            raise InvalidInput(f"x: expected rows of 16 values, got {data.size}")
        x = torch.from_numpy(data.reshape(-1, 16).astype("float32"))
        with torch.no_grad():
            y = self.net(x).numpy()
        out = InferOutput(name="y", shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[out])


class Seq(kserve.Model):  # type: ignore[misc]
    """``seqy``: token ids, INT64 ``[-1, -1]`` (any length); each request's length is appended
    to ``--lengths-file``, so a replay test can check the sizes it sent."""

    def __init__(self, name: str, path: str | None) -> None:
        super().__init__(name)
        self.path = path
        self.ready = True

    def get_input_types(self) -> list[dict[str, Any]]:
        return [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]}]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [{"name": "n", "datatype": "INT64", "shape": [-1, 1]}]

    async def predict(self, payload: InferRequest, headers: Any = None, response_headers: Any = None) -> InferResponse:
        n = int(payload.inputs[0].as_numpy().shape[-1])
        if self.path:
            with open(self.path, "a") as fh:
                fh.write(f"{n}\n")
        out = InferOutput(name="n", shape=[1, 1], datatype="INT64")
        out.set_data_from_numpy(torch.tensor([[n]]).numpy(), binary_data=False)
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=[out])


if __name__ == "__main__":
    kserve.ModelServer(
        http_port=opts.http_port,
        grpc_port=opts.grpc_port,
        enable_grpc=True,
        workers=1,
        enable_latency_logging=False,
    ).start(
        [
            Tiny("tiny"),
            Tiny("leaky", leak_mib=opts.leak_mib),
            Tiny("stally", stall_ms=opts.stall_ms, stall_every=opts.stall_every),
            Seq("seqy", opts.lengths_file),
        ]
    )
