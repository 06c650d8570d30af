"""The real Triton server (the one nvidia-pytriton bundles, started by :mod:`vcam.runtime.serve`) on
127.0.0.1, serving tiny ONNX stand-ins exported by ``vcam serve export``'s code, for the remote
engine tests. The serving environment is made once per machine (``vcam serve setup``; CI does it)."""

from __future__ import annotations

import socket
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


def start(repo: Path, log: Path | None = None, ports: list[int] | None = None):
    """A started :class:`~vcam.runtime.serve.TritonServer` on ``repo`` (skips, or fails under
    VCAM_REQUIRE=triton, where the client or the serving environment is missing)."""
    skip_on_windows(TRITON_SERVER)
    try:
        import tritonclient.grpc  # noqa: F401
    except ImportError as exc:
        require("triton", f"tritonclient not installed ({exc})")
    from vcam.errors import VcamError
    from vcam.runtime.serve import TritonServer

    grpc, http, metrics = ports or free_ports(3)
    try:
        server = TritonServer(repo, grpc_port=grpc, http_port=http, metrics_port=metrics, threads=1, log=log)
        server.wait_ready(180)
    except VcamError as exc:
        require("triton", str(exc))
    return server
