"""The swap on a Triton server (loopback) against the local swap: both server kinds of ``vcam serve``
alternated in one run (issues 30 and 44).

    python -m benchmarks.remote OUT [--model-dir DIR] [--servers python-backend,pytriton] [--rounds 3]
        [--clients 8] [--seconds 8] [--size 1080p] [--server-engine vcam|onnxruntime]
        [--client-device cpu] [--local-device cuda] [--fp16-wire] [--tiny]

Two servers run side by side on 127.0.0.1, each serving the swapper exported by ``vcam serve
export`` (dynamic batch, the dynamic batcher; ``--fp16-wire``: FP16 on the wire) and ``empty``, a
model that computes nothing (benchmarks/remote_runner.py): ``python-backend`` (the bundled
``tritonserver`` run directly, each model in Triton's own Python backend) and ``pytriton``
(PyTriton's Triton, whose Python backend forwards each request over its proxy to a second Python
process). Every stream plays the one-face demo clip at 30 fps (out of step, as cameras are), to the
null output; capture-to-publish latency per frame. In rounds, the servers' order alternating:

- ``floor``: ``--floor-calls`` batch-1 requests in a row to ``empty`` with tritonclient, p50 / p99;
  ``floor shm``: the same with the crop and the answer in system shared memory (same-host clients);
- ``local 1``: one daemon, one stream, the swap on ``--device`` (the baseline, once a round);
- ``remote 1``: the same daemon with ``[engines.swapper] backend = "remote"`` on each server: the
  overhead over ``local 1`` of the same round, p50 / p99.

Then, once: ``local N``: N client processes of one stream each, each with its own local engines on
``--local-device``; ``remote N``: the same N processes with their pipelines on ``--client-device``
(the CPU by default) all swapping on one server (each in turn): per-client p50 / p99, faces per
second, and the server's statistics (executions per request). ``--server-engine vcam``: each batch
runs in vcam's own PyTorch engine on the GPU (the local swap's code; the environment made with
``VCAM_SERVE_SYSTEM_SITE=1`` so it sees torch); ``onnxruntime``: onnxruntime there. Prints tables,
writes OUT/remote.json.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _loaded(d: Any, timeout: float = 300.0) -> None:
    """Wait until a started daemon's own models are loaded: a GPU daemon publishes early frames
    (swapped on the CPU) while they load, which the rows must not time (on the H200 the 8 local
    clients' whole window fell in theirs: 0.2 fps each, p50 4.5 s)."""
    early = d.up.early
    end = time.monotonic() + timeout
    while early is not None and not early.ready() and time.monotonic() < end:
        time.sleep(0.05)


def _one(args: argparse.Namespace, streams: int, device: str, url: str = "") -> dict:
    d = _daemon(args, streams, device, url)
    d.startup()
    _loaded(d)
    d.wait_compiled(300)
    try:
        rows = S._measure(d, args.settle + args.seconds, args.settle)
        over, passed = _over(d), _passed(d)
    finally:
        d.shutdown()
    return {**S._total(rows), "over_budget": over, "passed_through": passed}


def _clients(args: argparse.Namespace, n: int, url: str) -> dict:
    """N client processes of one stream each, released together: remote at ``url`` with their
    pipelines on ``--client-device``, or (``url`` empty) each on its own local engines."""
    device = args.client_device if url else args.local_device
    cmd = [sys.executable, "-m", "benchmarks.remote", str(args.out), "--worker", "--url", url, "--of", str(n)]
    cmd += ["--size", args.size, "--seconds", str(args.seconds), "--settle", str(args.settle), "--client-device", device]
    cmd += ["--epoch", repr(time.perf_counter() + 2.0), "--model-dir", str(args.models)]
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
            out, _ = p.communicate(timeout=args.settle + args.seconds + 180)
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
    _loaded(d)
    d.wait_compiled(300)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        rows = S._measure(d, args.settle + args.seconds, args.settle)
        over, passed = _over(d), _passed(d)
    finally:
        d.shutdown()
    print(json.dumps({**next(iter(rows.values())), "over_budget": over, "passed_through": passed}), flush=True)


def _floor(url: str, calls: int, shm: bool = False) -> dict:
    """``calls`` batch-1 requests in a row to ``empty`` (raw tritonclient, after 20 unmeasured):
    p50 / p99 ms; ``shm``: the crop and the answer through system shared memory (the copy in and
    the read out timed with the call)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url.split("://", 1)[1])
    meta = client.get_model_metadata("empty")
    from tritonclient.utils import triton_to_np_dtype

    feeds = {i.name: np.zeros([1, *i.shape[1:]], triton_to_np_dtype(i.datatype)) for i in meta.inputs}
    inputs = [grpcclient.InferInput(i.name, list(feeds[i.name].shape), i.datatype) for i in meta.inputs]
    out_name = meta.outputs[0].name
    first = feeds[meta.inputs[0].name]  # what the empty model answers with
    size = {k: v.nbytes for k, v in feeds.items()}
    outputs, regions = None, []
    if shm:
        import tritonclient.utils.shared_memory as shmlib

        tag = f"vcam-floor-{os.getpid()}"
        total = sum(size.values()) + first.nbytes
        region = shmlib.create_shared_memory_region(tag, f"/{tag}", total)
        regions.append(region)
        client.register_system_shared_memory(tag, f"/{tag}", total)
        offset = 0
        for inp in inputs:
            inp.set_shared_memory(tag, size[inp.name()], offset=offset)
            offset += size[inp.name()]
        out = grpcclient.InferRequestedOutput(out_name)
        out.set_shared_memory(tag, first.nbytes, offset=offset)
        outputs = [out]
    times = []
    try:
        for k in range(calls + 20):
            t0 = time.perf_counter()
            if shm:
                shmlib.set_shared_memory_region(region, list(feeds.values()))
                client.infer("empty", inputs, outputs=outputs)
                shmlib.get_contents_as_numpy(region, first.dtype, first.shape, offset=offset)
            else:
                for inp in inputs:
                    inp.set_data_from_numpy(feeds[inp.name()])
                client.infer("empty", inputs).as_numpy(out_name)
            if k >= 20:
                times.append((time.perf_counter() - t0) * 1e3)
    finally:
        if shm:
            client.unregister_system_shared_memory(tag)
            for r in regions:
                shmlib.destroy_shared_memory_region(r)
        client.close()
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)), "calls": calls}


def _servers(args: argparse.Namespace, repo: Path, src: Path) -> dict:
    from vcam.runtime.serve import TritonServer

    spec = "benchmarks.remote_runner:serve"
    sources = {"empty": "empty", **({"inswapper_128": str(src)} if args.server_engine == "vcam" else {})}
    servers = {}
    for kind in args.servers.split(","):
        grpc, http, metrics = _free_ports(3)
        servers[kind] = TritonServer(
            repo, grpc_port=grpc, http_port=http, metrics_port=metrics, log=args.out / f"server-{kind}.log",
            runner=(spec, sources), server=kind, threads=args.server_threads,
        )  # fmt: skip
    for kind, server in servers.items():
        server.wait_ready(900)
        print(f"{kind}: on {server.url}", flush=True)
    return servers


def _rounds(args: argparse.Namespace, servers: dict) -> dict:
    """The floor and the one-face overhead, the servers' order alternating round by round."""
    out: dict[str, list] = {}
    kinds = list(servers)
    for r in range(args.rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for kind in order:
            url = servers[kind].url
            out.setdefault(f"floor {kind}", []).append(_floor(url, args.floor_calls))
            if kind != "pytriton":  # PyTriton keeps the shared-memory endpoints behind its token
                out.setdefault(f"floor shm {kind}", []).append(_floor(url, args.floor_calls, shm=True))
        if args.no_one:
            continue
        local = _one(args, 1, args.device)
        out.setdefault("local 1", []).append(local)
        for kind in order:
            remote = _one(args, 1, args.device, servers[kind].url)
            over = {  # the frames after --settle (each daemon's warm-up): the streams benchmark's steady_ figures
                "adds_p50_ms": remote["worst_steady_p50_ms"] - local["worst_steady_p50_ms"],
                "adds_p99_ms": remote["worst_steady_p99_ms"] - local["worst_steady_p99_ms"],
            }
            out.setdefault(f"remote 1 {kind}", []).append({**remote, **over})
        for name, rows in out.items():
            last = rows[-1]
            keys = ("p50_ms", "p99_ms", "worst_p50_ms", "worst_p99_ms", "worst_steady_p50_ms", "worst_steady_p99_ms")
            keys += ("adds_p50_ms", "adds_p99_ms")
            print(f"round {r + 1} {name:<24} " + "  ".join(f"{k} {last[k]:.2f}" for k in keys if k in last), flush=True)
    return out


def _many(args: argparse.Namespace, servers: dict) -> dict:
    """N clients on local engines, then the same N against each server."""
    from vcam.engines.remote import RemoteEngine

    rows: dict[str, dict] = {}
    for n in [int(c) for c in args.clients.split(",") if c]:
        rows[f"local {n}"] = _clients(args, n, "")
        for kind, server in servers.items():
            probe = RemoteEngine(server.url, "inswapper_128", label="probe")
            before = probe.statistics()
            row = _clients(args, n, server.url)
            after = probe.statistics()
            probe.close()
            d = {k: after[k] - before[k] for k in after}
            req, ex = d["requests"], d["executions"]
            # the server's own time per request (Triton's "success": from arrival to answer sent, the
            # queue and the batch's compute included), against what the clients see
            ms = {k: d[f"{k}_ns"] / 1e6 / max(d["answered"], 1) for k in ("success", "queue", "compute")}
            rows[f"remote {n} {kind}"] = {
                **row, "requests": req, "executions": ex, "exec_per_request": ex / max(req, 1),
                "server_ms_per_request": ms["success"], "server_queue_ms": ms["queue"], "server_compute_ms": ms["compute"],
            }  # fmt: skip
    return rows


def _median(rows: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in rows])) if rows else float("nan")


def _print(rounds: dict, many: dict) -> None:
    print(f"{'median of rounds (steady)':<26} {'p50 ms':>8} {'p99 ms':>8} {'adds p50':>9} {'adds p99':>9}")
    for name, rows in rounds.items():
        if name.startswith("floor"):
            print(f"{name:<26} {_median(rows, 'p50_ms'):>8.2f} {_median(rows, 'p99_ms'):>8.2f}")
        else:
            adds = ""
            if "adds_p50_ms" in rows[0]:
                adds = f"{_median(rows, 'adds_p50_ms'):>+9.2f} {_median(rows, 'adds_p99_ms'):>+9.2f}"
            print(f"{name:<26} {_median(rows, 'worst_steady_p50_ms'):>8.2f} {_median(rows, 'worst_steady_p99_ms'):>8.2f} {adds}")
    if not many:
        return
    head = f"{'clients (steady)':<26} {'faces/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'>33ms':>6}"
    print(head + f" {'unswapped':>9} {'exec/req':>9} {'server ms':>9}")
    for name, r in many.items():
        per = r["streams"].values()
        p50 = max(c["steady_p50_ms"] for c in per)
        p99 = max(c["steady_p99_ms"] for c in per)
        epr = f"{r['exec_per_request']:.2f}" if "exec_per_request" in r else ""
        srv = f"{r['server_ms_per_request']:.2f}" if "server_ms_per_request" in r else ""
        row = f"{name:<26} {r['total_steady_fps']:>8.1f} {p50:>8.2f} {p99:>8.2f} {r['over_budget']:>6}"
        print(row + f" {r['passed_through']:>9} {epr:>9} {srv:>9}")
        each = (f"{c['steady_p50_ms']:.1f}/{c['steady_p99_ms']:.1f} {c['steady_fps']:.1f}" for c in per)
        print("    per client p50/p99 ms, fps: " + ", ".join(each))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--servers", default="python-backend,pytriton", help="server kinds, alternated (vcam serve --server)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--floor-calls", type=int, default=300)
    ap.add_argument("--clients", default="8", help="client counts (comma-separated; empty: none)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each daemon, after --settle")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds each daemon runs first, not counted (its warm-up)")
    ap.add_argument("--size", default="1080p")
    ap.add_argument("--device", default="cuda", help="the one-face rows' daemon device")
    ap.add_argument("--local-device", default="", help="the local N clients' device (default --device)")
    ap.add_argument("--client-device", default="cpu", help="the remote clients' pipeline device")
    ap.add_argument("--server-engine", choices=("vcam", "onnxruntime"), default="vcam")
    ap.add_argument("--server-threads", type=int, default=0, help="onnxruntime threads per server instance (0: its own)")
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
    return ap


def main(argv: list[str] | None = None) -> dict | None:
    args = _parser().parse_args(argv)
    args.local_device = args.local_device or args.device
    if args.epoch is None:
        args.epoch = time.perf_counter() + 2.0
    if args.worker:
        _worker(args)
        return None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.out, args.models = out, _models(out, args.model_dir, args.tiny)
    from vcam.models.serving import export_repository

    src = args.models / "inswapper_128.onnx"
    kw = dict(fp16=args.fp16_wire, max_batch=args.max_batch, queue_delay_us=args.queue_delay_us, gpu=False)
    repo = export_repository(out / "repo", "inswapper_128", src, **kw).repository
    export_repository(repo, "inswapper_128", src, served_as="empty", **kw)
    servers = _servers(args, repo, src)
    try:
        rounds = _rounds(args, servers)
        many = _many(args, servers)
    finally:
        for server in servers.values():
            server.stop()
    _print(rounds, many)
    report = {
        "servers": args.servers,
        "server_engine": args.server_engine,
        "queue_delay_us": args.queue_delay_us,
        "wire": "fp16" if args.fp16_wire else "fp32",
        "size": args.size,
        "seconds": args.seconds,
        "client_device": args.client_device,
        "local_device": args.local_device,
        "rounds": rounds,
        "clients": many,
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
