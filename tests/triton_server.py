"""The real Triton server (the one nvidia-pytriton bundles, started by :mod:`vcam.runtime.serve`) on
127.0.0.1, serving tiny ONNX stand-ins exported by ``vcam serve export``'s code, for the remote
engine tests. The serving environment is made once per machine (``vcam serve setup``; CI does it)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from conftest import TRITON_SERVER, require, skip_on_windows

from vcam.models import registry, standin
from vcam.models.download import crc32_text

#: What the shared server serves: (registry model, served name, fp16 edges, uint8 image input).
SERVED = (
    ("inswapper_128", "inswapper_128", False, False),
    ("inswapper_128", "inswapper_128_u8", True, True),
    ("arcface_w600k_r50", "arcface_w600k_r50", False, False),
)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def place_standins(models_dir: Path, names=("inswapper_128", "arcface_w600k_r50")) -> Path:
    """Tiny stand-ins with their .hash files in ``models_dir`` (as a user places models)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        p = standin.write(name, models_dir, tiny=True)
        (models_dir / registry.get(name).hash_file).write_text(crc32_text(p.read_bytes()))
    return models_dir


def export(models_dir: Path, repo: Path, served=SERVED, max_batch: int = 8) -> Path:
    from vcam.models.serving import export_repository

    for name, as_name, fp16, u8 in served:
        src = models_dir / registry.get(name).file
        export_repository(repo, name, src, fp16=fp16, uint8_input=u8, max_batch=max_batch, gpu=False, served_as=as_name)
    return repo


def start(repo: Path, log: Path | None = None, ports: list[int] | None = None, kind: str = ""):
    """A started :class:`~vcam.runtime.serve.TritonServer` on ``repo``, of ``kind`` (default: vcam
    serve's; skips, or fails under VCAM_REQUIRE=triton, where the client or the serving environment
    is missing)."""
    skip_on_windows(TRITON_SERVER)
    try:
        import tritonclient.grpc  # noqa: F401
    except ImportError as exc:
        require("triton", f"tritonclient not installed ({exc})")
    from vcam.errors import VcamError
    from vcam.runtime.serve import DEFAULT_SERVER, TritonServer

    grpc, http, metrics = ports or free_ports(3)
    try:
        server = TritonServer(
            repo, grpc_port=grpc, http_port=http, metrics_port=metrics, threads=1, log=log, server=kind or DEFAULT_SERVER
        )
        server.wait_ready(180)
    except VcamError as exc:
        require("triton", str(exc))
    return server


#: The faults :class:`FaultProxy` injects into the server's inference replies.
FAULTS = ("shape", "short", "dtype", "bytes", "extra", "missing", "nan", "no-output", "error", "slow")


class FaultProxy:
    """A gRPC (HTTP/2) proxy on 127.0.0.1 in front of a KServe V2 server: every call goes through to
    ``target`` as it is, and the ``ModelInfer`` replies are rewritten while :attr:`fault` names one of
    :data:`FAULTS` (a wrong shape of the same size, half the data, INT32 for FP32, BYTES, a row too
    many or too few, NaN in the first row, the output left out, an INTERNAL error, an answer
    :attr:`delay` seconds late); ``""``: replies as they are. :attr:`url` is what a client takes."""

    def __init__(self, target: str, delay: float = 1.5) -> None:
        from concurrent import futures

        import grpc

        self.fault = ""
        self.delay = delay
        self.rewritten = 0
        self._grpc = grpc
        self._channel = grpc.insecure_channel(target)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self._server.add_generic_rpc_handlers((_Forward(self),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def forward(self, method: str, request: bytes, context) -> bytes:
        try:
            reply = self._channel.unary_unary(method)(request, timeout=30)
        except self._grpc.RpcError as exc:
            context.abort(exc.code(), exc.details())
        fault = self.fault
        if not fault or not method.endswith("/ModelInfer"):
            return reply
        self.rewritten += 1
        if fault == "slow":
            time.sleep(self.delay)
            return reply
        if fault == "error":
            context.abort(self._grpc.StatusCode.INTERNAL, "injected fault")
        return self.rewrite(reply, fault)

    @staticmethod
    def rewrite(reply: bytes, fault: str) -> bytes:
        import numpy as np
        from tritonclient.grpc import service_pb2

        r = service_pb2.ModelInferResponse.FromString(reply)
        out, raw = r.outputs[0], r.raw_output_contents
        rows = int(out.shape[0])
        row = len(raw[0]) // max(rows, 1)
        if fault == "shape":  # as many values, another shape
            out.shape[2], out.shape[3] = out.shape[2] // 2, out.shape[3] * 2
        elif fault == "short":
            raw[0] = raw[0][: len(raw[0]) // 2]
        elif fault == "dtype":
            out.datatype = "INT32"
        elif fault == "bytes":
            out.datatype = "BYTES"
        elif fault == "extra":
            out.shape[0] = rows + 1
            raw[0] = raw[0] + raw[0][:row]
        elif fault == "missing":
            out.shape[0] = rows - 1
            raw[0] = raw[0][row:]
        elif fault == "nan":
            values = np.frombuffer(raw[0], np.float32).copy()
            values[: row // 4 : 97] = np.nan
            raw[0] = values.tobytes()
        elif fault == "no-output":
            del r.outputs[0]
            del r.raw_output_contents[0]
        return r.SerializeToString()

    def close(self) -> None:
        self._server.stop(0)
        self._channel.close()


class _Forward:
    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy

    def service(self, details):
        import grpc

        method = details.method
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self.proxy.forward(method, req, ctx))
