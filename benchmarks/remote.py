"""The swap on a Triton server (loopback) against the local swap, one face and 4 / 8 clients (issue 30).

    python -m benchmarks.remote OUT [--model-dir DIR] [--clients 4,8] [--seconds 8] [--size 1080p]
        [--server-engine vcam|onnxruntime] [--client-device cpu] [--fp16-wire]

Every stream plays the one-face demo clip at 30 fps (out of step, as cameras are), to the null
output; capture-to-publish latency per frame. Rows, all in one run:

- ``local 1``: one daemon, one stream, the swap on this machine's GPU (the baseline);
- ``remote 1``: the same daemon (its pipeline on the same device) with ``[engines.swapper] backend =
  "remote"`` on the Triton server below: what the remote swap adds for one face;
- ``local N``: one daemon with N streams, every stream's faces in one swapper batch;
- ``remote N``: N client processes of one stream each (``--client-device``, CPU detection by
  default), all swapping on the one server; its statistics give requests and batch executions.

The server is the Triton bundled in the nvidia-pytriton wheel (``vcam serve``'s environment), on
127.0.0.1, serving the swapper exported by ``vcam serve export`` (dynamic batch, the dynamic batcher,
``--fp16-wire``: FP16 on the wire). ``--server-engine vcam``: each batch runs in vcam's own PyTorch
engine on the GPU (CUDA graphs, FP16: the local swap's code), which needs the environment made with
``VCAM_SERVE_SYSTEM_SITE=1`` so it sees torch; ``onnxruntime``: the CPU (or onnxruntime-gpu where
installed there). The table names which. Prints a table and writes OUT/remote.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import streams as S
from benchmarks import write_report

BUDGET_MS = 33.0


def _models(out: Path, model_dir: str, tiny: bool = False) -> Path:
    """A folder with the swapper and the recogniser: ``model_dir``, else stand-ins (full size, or
    ``tiny`` for a smoke run on a CPU)."""
    if model_dir:
        return Path(model_dir)
    from vcam.models import registry, standin
    from vcam.models.download import crc32_text

    d = out / "models"
    d.mkdir(parents=True, exist_ok=True)
    for name in ("inswapper_128", "arcface_w600k_r50"):
        spec = registry.get(name)
        if not (d / spec.file).is_file():
            p = standin.write(name, d, tiny=tiny)
            (d / spec.hash_file).write_text(crc32_text(p.read_bytes()))
    return d


def _remote(cfg: Any, url: str) -> Any:
    e = cfg.engines
    sw = replace(e.swapper, backend="remote", url=url, timeout=0.5)
    return cfg.replace(engines=replace(e, swapper=sw))


def _daemon(args: argparse.Namespace, streams: int, device: str, url: str = "") -> Any:
    """:func:`benchmarks.streams._daemon`'s paced daemon, its swapper remote at ``url`` if given."""
    from vcam.runtime.daemon import Daemon
    from vcam.stages.outputs import NullOutput

    ns = argparse.Namespace(
        size=args.size, device=device, epoch=args.epoch, fp16=True, max_faces=8, swapper="inswapper_128",
        model_dir=str(args.models), deadline=None, faces=1, compile="auto", phases="out",
    )  # fmt: skip
    cfg = S._config(ns, streams, True)
    cfg = _remote(cfg, url) if url else cfg
    w, h = S._size(args.size)
    frames = S._Frames(w, h)
    index, of = (None, None) if args.index is None else (args.index, args.of)
    sources = {
        name: S._Camera(frames, S._phase(ns, i if index is None else index, streams if of is None else of, frames.fps), loop=True)
        for i, (name, _) in enumerate(cfg.per_stream())
    }
    outputs = {name: NullOutput(w, h) for name, _ in cfg.per_stream()}
    return Daemon(cfg, sources=sources, outputs=outputs, control=False)


def _over(daemon: Any) -> int:
    return sum(int((np.fromiter(s.latencies_ms, float) > BUDGET_MS).sum()) for s in daemon.summaries.values())


def _passed(daemon: Any) -> int:
    """Faces that went out unswapped (no answer from the server in time, or NaN)."""
    return sum(sum(s.guarded.values()) for s in daemon.summaries.values())


def _one(args: argparse.Namespace, streams: int, device: str, url: str = "") -> dict:
    d = _daemon(args, streams, device, url)
    d.startup()
    d.wait_compiled(300)
    try:
        rows = S._measure(d, args.seconds)
        over, passed = _over(d), _passed(d)
    finally:
        d.shutdown()
    return {**S._total(rows), "over_budget": over, "passed_through": passed}


def _clients(args: argparse.Namespace, n: int, url: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.remote", str(args.out), "--worker", "--url", url, "--of", str(n)]
    cmd += ["--size", args.size, "--seconds", str(args.seconds), "--client-device", args.client_device]
    cmd += ["--epoch", repr(args.epoch), "--model-dir", str(args.models)]
    procs = [
        subprocess.Popen(cmd + ["--index", str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(n)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a client did not start: {line!r}")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        rows, over, passed = {}, 0, 0
        for i, p in enumerate(procs):
            out, _ = p.communicate(timeout=args.seconds + 180)
            row = json.loads(out.strip().splitlines()[-1])
            over += row.pop("over_budget")
            passed += row.pop("passed_through")
            rows[f"c{i + 1}"] = row
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return {**S._total(rows), "over_budget": over, "passed_through": passed}


def _worker(args: argparse.Namespace) -> None:
    args.models = Path(args.model_dir)
    d = _daemon(args, 1, args.client_device, args.url)
    d.startup()
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        rows = S._measure(d, args.seconds)
        over, passed = _over(d), _passed(d)
    finally:
        d.shutdown()
    print(json.dumps({**next(iter(rows.values())), "over_budget": over, "passed_through": passed}), flush=True)


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--clients", default="4,8")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--size", default="1080p")
    ap.add_argument("--device", default="cuda", help="the local daemon's device (and the one-face rows')")
    ap.add_argument("--client-device", default="cpu", help="the remote clients' pipeline device")
    ap.add_argument("--server-engine", choices=("vcam", "onnxruntime"), default="vcam")
    ap.add_argument("--fp16-wire", action="store_true", help="FP16 crops on the wire (default FP32)")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--queue-delay-us", type=int, default=100, help="the server's batcher wait (vcam serve export's)")
    ap.add_argument("--no-one", action="store_true", help="leave out the one-face rows (local 1, remote 1)")
    ap.add_argument("--tiny", action="store_true", help="tiny stand-ins (a smoke run on a CPU)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--of", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--epoch", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.epoch is None:
        args.epoch = time.perf_counter() + 2.0
    if args.worker:
        _worker(args)
        return None

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.out, args.models = out, _models(out, args.model_dir, args.tiny)
    from vcam.engines.remote import RemoteEngine
    from vcam.models.serving import export_repository
    from vcam.runtime.serve import TritonServer

    src = args.models / "inswapper_128.onnx"
    repo = export_repository(
        out / "repo", "inswapper_128", src, fp16=args.fp16_wire, max_batch=args.max_batch, queue_delay_us=args.queue_delay_us
    ).repository
    grpc, http, metrics = _free_ports(3)
    runner = ("benchmarks.remote_runner:torch_engine", {"inswapper_128": str(src)}) if args.server_engine == "vcam" else None
    server = TritonServer(repo, grpc_port=grpc, http_port=http, metrics_port=metrics, log=out / "server.log", runner=runner)
    rows: dict[str, dict] = {}
    try:
        server.wait_ready(900)
        served = next((ln for ln in server.lines if ln.startswith("model ")), "model ?")
        print(f"server: {served} on {server.url}", flush=True)
        probe = RemoteEngine(server.url, "inswapper_128", label="probe")
        if not args.no_one:
            rows["local 1"] = _one(args, 1, args.device)
            rows["remote 1"] = _one(args, 1, args.device, server.url)
        for n in [int(c) for c in args.clients.split(",") if c]:
            rows[f"local {n}"] = _one(args, n, args.device)
            before = probe.statistics()
            rows[f"remote {n}"] = _clients(args, n, server.url)
            after = probe.statistics()
            rows[f"remote {n}"].update(
                requests=after["requests"] - before["requests"], executions=after["executions"] - before["executions"]
            )
        probe.close()
    finally:
        server.stop()
    head = f"{'row':<10} {'fps':>7} {'p50 ms':>7} {'p99 ms':>7} {'>33ms':>6} {'unswapped':>9} {'requests':>9} {'executions':>10}"
    print(head)
    for name, r in rows.items():
        req, ex = r.get("requests", ""), r.get("executions", "")
        print(
            f"{name:<10} {r['total_fps']:>7.1f} {r['worst_p50_ms']:>7.2f} {r['worst_p99_ms']:>7.2f} {r['over_budget']:>6}"
            f" {r['passed_through']:>9} {req!s:>9} {ex!s:>10}"
        )
    if "local 1" in rows and "remote 1" in rows:
        d50 = rows["remote 1"]["worst_p50_ms"] - rows["local 1"]["worst_p50_ms"]
        d99 = rows["remote 1"]["worst_p99_ms"] - rows["local 1"]["worst_p99_ms"]
        print(f"remote adds {d50:+.2f} ms p50, {d99:+.2f} ms p99 for one face (target <= 3 / 6)")
    report = {
        "server": served,
        "server_engine": args.server_engine,
        "queue_delay_us": args.queue_delay_us,
        "wire": "fp16" if args.fp16_wire else "fp32",
        "size": args.size,
        "seconds": args.seconds,
        "client_device": args.client_device,
        "rows": rows,
    }
    return write_report(str(out / "remote.json"), report)


def _free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


if __name__ == "__main__":
    main()
