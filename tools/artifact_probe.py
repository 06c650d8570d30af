"""Probe: the inswapper network compiled by Inductor into a saved artifact (``standalone_compile``),
loaded in a fresh process, against cuDNN in a CUDA graph.

    python tools/artifact_probe.py MODEL.onnx OUTDIR [--batch 1,8] [--aot]

For each batch size: builds the artifact (FP16, channels-last, max-autotune) unless OUTDIR has it,
then runs each way of using it in a child process of its own with an empty Inductor cache (as on a
machine that has only the artifact): ``cudnn`` (the module in a CUDA graph), ``load`` (load time,
first call, a call outside a graph), ``graph`` (the loaded artifact captured in a CUDA graph).
Prints one line each; writes OUTDIR/artifact_probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aot_probe import _captured, _cuda_ms, _first, _setup


def _graph_of(torch, m, x, s):
    """The Dynamo graph of ``m(x, s)`` with the parameters as inputs, and those inputs' names."""
    seen: dict = {}

    def grab(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, list(example_inputs)
        return gm.forward

    with torch.inference_mode():
        torch.compile(m, backend=grab, fullgraph=True, dynamic=False)(x, s)
    ids = {id(p): n for n, p in list(m.named_parameters()) + list(m.named_buffers())}
    names = []
    for t in seen["inputs"]:
        if t is x:
            names.append("@x")
        elif t is s:
            names.append("@s")
        else:
            names.append(ids[id(t)])
    return seen["gm"], seen["inputs"], names


def child(mode: str, model: str, art: str, batch: int) -> dict:
    torch, m, x, s = _setup(model, batch)
    r: dict = {}
    with torch.inference_mode():
        ref = _first(m(x, s)).float()
        if mode == "cudnn":
            graph, _ = _captured(torch, lambda: m(x, s))
            r["graph_ms"] = _cuda_ms(torch, graph.replay)
            return r
        names = json.loads(Path(art + ".json").read_text())
        tensors = dict(list(m.named_parameters()) + list(m.named_buffers()))
        t0 = time.perf_counter()
        import torch._inductor

        r["import_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        fn = torch._inductor.CompiledArtifact.load(path=art, format="binary")
        r["load_s"] = round(time.perf_counter() - t0, 2)
        args = [x if n == "@x" else s if n == "@s" else tensors[n] for n in names]
        t0 = time.perf_counter()
        y = _first(fn(*args))
        torch.cuda.synchronize()
        r["first_call_s"] = round(time.perf_counter() - t0, 2)
        r["max_abs_err"] = float((y.float() - ref).abs().max())
        r["mean_abs_err"] = float((y.float() - ref).abs().mean())
        if mode == "load":
            r["ms"] = _cuda_ms(torch, lambda: fn(*args))
            t0 = time.perf_counter()
            for _ in range(50):
                fn(*args)
            r["host_ms_per_call"] = round((time.perf_counter() - t0) / 50 * 1e3, 3)
            torch.cuda.synchronize()
            return r
        graph, yg = _captured(torch, lambda: fn(*args))
        r["graph_max_abs_err"] = float((_first(yg).float() - ref).abs().max())
        r["ms"] = _cuda_ms(torch, graph.replay)
        return r


def build(model: str, art: Path, batch: int) -> dict:
    torch, m, x, s = _setup(model, batch)
    m.requires_grad_(False)
    t0 = time.perf_counter()
    gm, inputs, names = _graph_of(torch, m, x, s)
    trace_s = time.perf_counter() - t0
    opts = dict(torch._inductor.list_mode_options("max-autotune-no-cudagraphs"))
    t0 = time.perf_counter()
    with torch.inference_mode():
        a = torch._inductor.standalone_compile(gm, inputs, dynamic_shapes="from_example_inputs", options={"config_patches": opts})
    compile_s = time.perf_counter() - t0
    a.save(path=str(art), format="binary")
    Path(str(art) + ".json").write_text(json.dumps(names))
    return {"trace_s": round(trace_s, 1), "compile_s": round(compile_s, 1), "bytes": art.stat().st_size, "options": opts}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    out = Path(args.out)
    if args.child:
        batch = int(args.batch)
        print(json.dumps(child(args.child, args.model, str(out / f"inswapper_b{batch}.art"), batch)), flush=True)
        return
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"torch": None}
    import torch

    results["torch"] = torch.__version__
    for batch in [int(b) for b in args.batch.split(",")]:
        art = out / f"inswapper_b{batch}.art"
        r: dict = results.setdefault(f"b{batch}", {})
        if not art.exists():
            try:
                r["build"] = build(args.model, art, batch)
            except Exception as exc:  # report, go on with the next size
                r["build"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                print("build failed", batch, r["build"], flush=True)
                continue
            print("built", art.name, r["build"], flush=True)
        cache = tempfile.mkdtemp(prefix="ind-empty-")  # the first load starts from an empty Inductor cache
        for mode in ("cudnn", "load", "load", "graph"):
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            cmd = [sys.executable, __file__, args.model, args.out, "--batch", str(batch), "--child", mode]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            res = json.loads(lines[-1]) if p.returncode == 0 and lines else {"rc": p.returncode, "stderr": p.stderr[-1500:]}
            key = mode if mode not in r else f"{mode}_warm"
            r[key] = res
            print(batch, key, json.dumps(res)[:1500], flush=True)
            (out / "artifact_probe.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
