"""Where a compiled swapper engine's load time goes: the artifact's load and its first call, each
timed and profiled (cProfile) in a fresh process, with the engine cache as `vcam engines build`
left it. Usage on the GPU, after `vcam engines build --model MODEL --fp16 --batch 1`:

    python tools/load_probe.py MODEL OUT [--variants default,threads1]

Variants (each a child process): ``default``; ``prepared``: :func:`vcam.engines.compiled.prepare_load`
first (timed apart, as the engine does while the models load); ``threads1``: ``TORCHINDUCTOR_COMPILE_THREADS=1``
(no pool of compile workers is started); ``full_build`` then ``full``: an artifact built with
:func:`full_autotune_options` (build 1's) into OUT/full, then loaded; ``record``: as default, then the cache artifacts recorded
since the load (the first call's autotuning results) saved to OUT/tune.bin; ``replay``: those
loaded (``torch.compiler.load_cache_artifacts``) before the artifact. Each line counts the kernel
benchmarks the first call ran and the ``.best_config`` files in the Inductor cache. Prints one line
per variant and the top of each profile; writes OUT/load_<variant>.prof and OUT/load_probe.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from aot_probe import _cuda_ms  # noqa: E402  (CUDA-event median after warm-up)

VARIANTS: dict[str, dict[str, str]] = {"default": {}, "threads1": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}, "prepared": {}}
VARIANTS.update({"record": {}, "replay": {}, "full_build": {}, "full": {}})


def full_autotune_options(device: str) -> dict:
    """Build options of the ``full`` variants: build 1's, Inductor's whole ``max-autotune`` (every
    kernel given several launch configurations, benchmarked at the first call of each process that
    loads the artifact), to compare with :func:`vcam.engines.compiled.build_options`."""
    import torch

    return dict(torch._inductor.list_mode_options("max-autotune-no-cudagraphs"))


def _best_configs() -> int:
    root = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent"))
    return sum(1 for _ in root.rglob("*.best_config")) if root.is_dir() else 0


def child(model: str, out: Path, variant: str) -> dict:
    t0 = time.perf_counter()
    import torch

    from vcam.engines import artifacts as compiled
    from vcam.engines import item_shapes
    from vcam.engines.compiled import CompiledLoader
    from vcam.engines.torch import TorchEngine

    t_import = time.perf_counter() - t0
    cache = out / "full" if variant.startswith("full") else None
    loader = CompiledLoader("off", cache)
    engine = TorchEngine(model, device="cuda", fp16=True, max_batch=1, loader=loader, warmup=False, cache_dir=cache)
    items = item_shapes(engine.inputs, None)
    key, path = loader.target(1, items)
    compiled.inductor_cache(engine.cache_dir)
    args = engine.call_args(1, items)
    if variant == "full_build":
        compiled.build_options = full_autotune_options  # what build() passes to Inductor
        with engine.backend_flags():
            seconds = compiled.build(engine.module, args, path, key, device="cuda")
        return {"variant": variant, "build_s": round(seconds, 1)}
    best_before = _best_configs()
    tune = out / "tune.bin"
    if variant == "replay" and tune.is_file():
        torch.compiler.load_cache_artifacts(tune.read_bytes())
    prepare_s = compiled.prepare_load() if variant == "prepared" else 0.0
    prof = cProfile.Profile()
    t1 = time.perf_counter()
    prof.enable()
    fn = compiled.load(path, key, engine.module)
    t2 = time.perf_counter()
    with torch.inference_mode(), engine.backend_flags():
        fn(*args)
    torch.cuda.synchronize()
    prof.disable()
    t3 = time.perf_counter()
    with torch.inference_mode(), engine.backend_flags():
        fn(*args)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    with torch.inference_mode(), engine.backend_flags():
        swap_ms = _cuda_ms(torch, lambda: fn(*args), n=30)
    recorded = ""
    if variant == "record":
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            tune.write_bytes(saved[0])
            recorded = str(saved[1])[:300]
    prof.dump_stats(str(out / f"load_{variant}.prof"))
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    benches = sum(v[1] for k, v in stats.stats.items() if k[2] == "benchmark_gpu")
    stats.sort_stats("cumulative").print_stats(28)
    (out / f"load_{variant}.txt").write_text(text.getvalue())
    engine.close()
    return {
        "variant": variant,
        "import_s": round(t_import, 2),
        "prepare_s": round(prepare_s, 2),
        "load_s": round(t2 - t1, 2),
        "first_call_s": round(t3 - t2, 2),
        "second_call_ms": round((t4 - t3) * 1e3, 2),
        "kernel_benchmarks": benches,
        "call_ms_cuda_events": round(swap_ms, 3),
        "best_configs_before_after": [best_before, _best_configs()],
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "recorded": recorded,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--variants", default="default,record,replay")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        print(json.dumps(child(args.model, out, args.child)), flush=True)
        return
    rows = []
    for v in [x for x in args.variants.split(",") if x]:
        env = {**os.environ, **VARIANTS[v]}
        cmd = [sys.executable, __file__, args.model, str(out), "--child", v]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"variant": v, "error": (r.stderr or r.stdout)[-800:]}
        rows.append(row)
        print(row, flush=True)
        top = out / f"load_{v}.txt"
        if top.is_file():
            print("\n".join(top.read_text().splitlines()[:30]))
    (out / "load_probe.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
