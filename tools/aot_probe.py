"""Probe: the inswapper network as an AOTInductor package on this GPU, against cuDNN in a CUDA graph.

    python tools/aot_probe.py MODEL.onnx OUTDIR [--batch 1] [--autotune]

Builds the package (FP16, channels-last; Triton autotuning with ``--autotune``) unless OUTDIR has
it, then runs each way of using it in a child process of its own, so a crash (an illegal memory
access, a segfault in the runner) is reported with its exit status instead of ending the probe:
``cudnn`` (the module, eager and in a CUDA graph), ``aot`` (the package outside a graph, default
runner), ``aot-single`` (``run_single_threaded=True``), ``aot-graph`` (that runner captured in a
CUDA graph after warm-up runs on the capture stream). Prints one line each; writes
OUTDIR/aot_probe.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _cuda_ms(torch, fn, n: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def _captured(torch, fn):
    """``fn()`` warmed up on a side stream, then captured in a CUDA graph: (graph, its output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out


def _first(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def _setup(model: str, batch: int):
    import torch

    from vcam.engines.native.inswapper import load_inswapper_from_graph
    from vcam.engines.onnx_graph import OnnxGraph

    torch.backends.cudnn.benchmark = True
    m = load_inswapper_from_graph(OnnxGraph.load(model)).eval().cuda().half().to(memory_format=torch.channels_last)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 3, 128, 128, device="cuda", dtype=torch.half, generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    s = torch.randn(batch, 512, device="cuda", dtype=torch.half, generator=g)
    return torch, m, x, s


def child(mode: str, model: str, pkg: str, batch: int) -> dict:
    torch, m, x, s = _setup(model, batch)
    r: dict = {}
    with torch.inference_mode():
        ref = _first(m(x, s)).float()
        if mode == "cudnn":
            r["eager_ms"] = _cuda_ms(torch, lambda: m(x, s))
            graph, _ = _captured(torch, lambda: m(x, s))
            r["graph_ms"] = _cuda_ms(torch, graph.replay)
            return r
        t0 = time.perf_counter()
        fn = torch._inductor.aoti_load_package(pkg, run_single_threaded=mode != "aot")
        r["load_s"] = round(time.perf_counter() - t0, 2)
        if mode in ("aot", "aot-single"):
            y = _first(fn(x, s)).float()
            r["max_abs_err"] = float((y - ref).abs().max())
            r["ms"] = _cuda_ms(torch, lambda: fn(x, s))
            t0 = time.perf_counter()
            for _ in range(50):
                fn(x, s)
            r["host_ms_per_call"] = (time.perf_counter() - t0) / 50 * 1e3
            torch.cuda.synchronize()
            return r
        graph, yg = _captured(torch, lambda: fn(x, s))
        r["max_abs_err"] = float((_first(yg).float() - ref).abs().max())
        r["ms"] = _cuda_ms(torch, graph.replay)
        return r


def build(model: str, pkg: Path, batch: int, autotune: bool) -> float:
    torch, m, x, s = _setup(model, batch)
    t0 = time.perf_counter()
    with torch.no_grad():
        prog = torch.export.export(m, (x, s))
        torch._inductor.aoti_compile_and_package(prog, package_path=str(pkg), inductor_configs={"max_autotune": autotune})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--autotune", action="store_true")
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    out = Path(args.out)
    pkg = out / f"inswapper_b{args.batch}{'_tuned' if args.autotune else ''}.pt2"
    if args.child:
        print(json.dumps(child(args.child, args.model, str(pkg), args.batch)), flush=True)
        return
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"batch": args.batch, "autotune": args.autotune}
    if not pkg.exists():
        results["build_s"] = round(build(args.model, pkg, args.batch, args.autotune), 1)
        print("built", pkg.name, results["build_s"], "s", flush=True)
    for mode in ("cudnn", "aot", "aot-single", "aot-graph"):
        cmd = [sys.executable, __file__, args.model, args.out, "--batch", str(args.batch), "--child", mode]
        cmd += ["--autotune"] if args.autotune else []
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        results[mode] = json.loads(lines[-1]) if p.returncode == 0 and lines else {"rc": p.returncode, "stderr": p.stderr[-800:]}
        print(mode, json.dumps(results[mode])[:900], flush=True)
        (out / "aot_probe.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
