"""End to end on a GPU, the way a user runs it: `vcam run --device cuda --fp16` with every swapper
family (full-size inswapper stand-in), the enhancer, and the backend choices, on a 1080p clip with
several faces written by this script. Prints one line per run and writes the results as JSON.

    python -m benchmarks.gpu_e2e OUT_DIR [--frames 60] [--faces 4]

Stand-ins (`vcam models stand-in`) have the real tensors and random weights: the checks are that
every run starts, swaps every face of every frame, writes a playable file with every frame, and
says where each model ran; not that the faces look right.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_clip(path: Path, frames: int, faces: int, width: int = 1920, height: int = 1080) -> None:
    """A clip with ``faces`` portraits on a grid, each drifting a little per frame."""
    from vcam.stages.demo import gradient, group_frame
    from vcam.stages.recording import FileOutput

    bg = gradient(width, height)
    out = FileOutput(path, width, height, 30.0, timing="frames")
    try:
        for i in range(frames):
            out.send_bgr(group_frame(width, height, faces, i, period=frames, background=bg))
    finally:
        out.close()


def frames_of(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as c:
        return [f.to_ndarray(format="bgr24") for f in c.decode(video=0)]


def add_latency(row: dict, text: str) -> None:
    """The run's capture-to-publish p50/p99 from its summary line, into ``row``."""
    m = re.search(r"latency p50 ([\d.]+) ms, p99 ([\d.]+) ms", text)
    if m:
        row["latency_p50_ms"], row["latency_p99_ms"] = float(m.group(1)), float(m.group(2))


def report(results: list, row: dict, text: str, detail: str = "", lines: int = 2) -> None:
    """Keep ``row`` and print its one-line verdict with the run's last output lines."""
    results.append(row)
    last = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    verdict = "ok" if row["ok"] else "FAIL"
    print(f"[{verdict}] {row['label']} rc={row['rc']} {row['seconds']}s {detail}| " + " | ".join(last), flush=True)
    # What happened to the compiled engines in this run (loaded, removed, not used), for the log.
    row["compiled_lines"] = [ln.strip() for ln in text.splitlines() if "compiled engine" in ln][:4]
    for ln in row["compiled_lines"]:
        print(f"    {ln[:240]}", flush=True)


def vcam(args: list[str], timeout: float = 240) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "vcam", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return r.returncode, (r.stdout + r.stderr).strip(), time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--faces", type=int, default=4)
    ap.add_argument("--skip", default="", help="comma list of run labels to leave out (a short device session)")
    args = ap.parse_args()
    skip = {x.strip() for x in args.skip.split(",") if x.strip()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/vcam-e2e")
    models = work / "models"
    models.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    names = ("inswapper_128", "arcface_w600k_r50", "hyperswap_1a_256", "simswap_256", "crossface_simswap", "gfpgan_1.4")
    for name in names + ("xseg_1", "bisenet_resnet_34", "2dfan4", "real_esrgan_x2"):
        if not (models / f"{name}.onnx").is_file():
            rc, text, _ = vcam(["models", "stand-in", name, "--out", str(models)])
            assert rc == 0, text
    clip = work / "faces.mp4"
    make_clip(clip, args.frames, args.faces)
    src = frames_of(clip)
    print(f"stand-ins and a {len(src)}-frame 1080p clip with {args.faces} faces in {time.perf_counter() - t0:.1f}s", flush=True)
    photo = ROOT / "vcam" / "assets" / "grace_hopper.jpg"
    results = []

    def run(label: str, extra: list[str], *, expect_ok: bool = True, config: str = "") -> None:
        if label in skip:
            print(f"[skipped] {label} (--skip)", flush=True)
            return
        cfg = work / f"{label}.toml"
        cfg.write_text(f"[models]\ndir = '{models}'\n{config}")
        dst = work / f"{label}.mp4"
        dst.unlink(missing_ok=True)
        base = [
            "run",
            "-c",
            str(cfg),
            "--input",
            str(clip),
            "--no-loop",
            "--quiet",
            "--face",
            str(photo),
            "--output",
            f"file:{dst}",
        ]
        rc, text, secs = vcam(base + extra)
        row = {"label": label, "args": extra, "rc": rc, "seconds": round(secs, 1), "output": text[-2000:]}
        if expect_ok and rc == 0:
            got = frames_of(dst)
            row["frames_written"] = len(got)
            n = min(len(got), len(src))
            row["changed_pct"] = round(
                100.0 * float(np.mean([np.abs(got[i].astype(int) - src[i]).mean() > 1.0 for i in range(n)])), 1
            )
            add_latency(row, text)
        # A file to a file is lossless by default: exactly the input's frames, however fast the GPU is.
        row["ok"] = (rc == 0) == expect_ok and (
            not expect_ok or (row.get("changed_pct", 0) > 90 and row.get("frames_written") == len(src))
        )
        report(results, row, text, f"{row.get('frames_written', '')} frames, {row.get('changed_pct', '')}% changed ")

    cuda = ["--device", "cuda", "--fp16"]
    run("inswapper_cuda_fp16", cuda + ["--model", "inswapper_128"])
    run("hyperswap_cuda_fp16", cuda + ["--model", "hyperswap_1a_256"])
    run("simswap_cuda_fp16", cuda + ["--model", "simswap_256"])
    run("inswapper_enhancer_cuda", cuda + ["--model", "inswapper_128"], config="[swap]\nenhancer = 'gfpgan_1.4'\n")
    run("classic_cuda_torch", ["--device", "cuda", "--backend", "torch"])
    # Issue 10: every mask (occluder, parser and landmarker stand-ins), the swapper alone in FP32,
    # and per-person mapping (each portrait of the clip mapped to the other).
    every_mask = ["--mask", "box,face,mouth,occlusion,region"]
    run("inswapper_all_masks_cuda", cuda + ["--model", "inswapper_128"] + every_mask, config="[mask]\nlandmarker = '2dfan4'\n")
    run("classic_all_masks_cuda", ["--device", "cuda"] + every_mask)
    run("inswapper_fp32_swapper_cuda", cuda + ["--model", "inswapper_128", "--fp32-swapper"])
    astronaut = ROOT / "vcam" / "assets" / "astronaut.jpg"
    run("classic_mapping_cuda", ["--device", "cuda", "--map", f"{photo}={astronaut}", "--map", f"{astronaut}={photo}"])
    # Issue 12: two streams in one daemon (the faces of both in one swap batch), each written in full,
    # each like the one-stream run of the same clip; the frame enhancer (x2 stand-in) on a stream.
    if "inswapper_two_streams_cuda" not in skip:
        streams_run(work, models, clip, photo, src, results)
    if "upscale_x2_cuda_fp16" not in skip:
        upscale_run(work, models, clip, photo, results)
    # Issue 9: the clip as a camera's MJPG, decoded on the GPU (nvJPEG) and on the CPU; live (paced), the
    # camera published unswapped while the models load (early frames).
    if "mjpeg" not in skip:
        mjpeg_run(work, models, src, photo, results)
    if "compiled_live_cuda" not in skip:
        compiled_run(work, models, photo, results)
    run("backend_onnxruntime_cuda", ["--device", "cuda", "--backend", "onnxruntime"], expect_ok=False)
    run("backend_tensorrt_cuda", ["--device", "cuda", "--backend", "tensorrt"], expect_ok=False)
    (out / "e2e.json").write_text(json.dumps(results, indent=2))
    bad = [r["label"] for r in results if not r["ok"]]
    print("e2e:", "all ok" if not bad else f"FAILED {bad}")
    return 1 if bad else 0


def streams_run(work: Path, models: Path, clip: Path, photo: Path, src: list, results: list) -> None:
    cfg = work / "streams.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    outs = [work / "stream_a.mp4", work / "stream_b.mp4"]
    for o in outs:
        o.unlink(missing_ok=True)
    args = ["run", "-c", str(cfg), "--quiet", "--device", "cuda", "--fp16", "--model", "inswapper_128", "--face", str(photo)]
    for name, o in zip("ab", outs):
        args += ["--stream", f"{clip}=file:{o},name={name}"]
    rc, text, secs = vcam(args)
    row = {"label": "inswapper_two_streams_cuda", "args": args[3:], "rc": rc, "seconds": round(secs, 1), "output": text[-2000:]}
    alone = work / "inswapper_cuda_fp16.mp4"
    ok = rc == 0
    if ok:
        ref = frames_of(alone) if alone.is_file() else None
        for name, o in zip("ab", outs):
            got = frames_of(o)
            n = min(len(got), len(src))
            row[f"{name}_frames"] = len(got)
            row[f"{name}_changed_pct"] = round(
                100.0 * float(np.mean([np.abs(got[i].astype(int) - src[i]).mean() > 1.0 for i in range(n)])), 1
            )
            if ref is not None:
                m = min(len(ref), len(got))
                row[f"{name}_vs_alone_mean_abs"] = round(
                    float(np.mean([np.abs(got[i].astype(int) - ref[i]).mean() for i in range(m)])), 3
                )
            ok = ok and len(got) == len(src) and row[f"{name}_changed_pct"] > 90
            ok = ok and row.get(f"{name}_vs_alone_mean_abs", 0.0) < 1.0
    row["ok"] = ok
    results.append(row)
    last = [ln for ln in text.splitlines() if ln.strip()][-3:]
    print(f"[{'ok' if ok else 'FAIL'}] inswapper_two_streams_cuda rc={rc} {secs:.1f}s | " + " | ".join(last), flush=True)


def compiled_run(work: Path, models: Path, photo: Path, results: list) -> None:
    """Issue 9 item 3: a live ``vcam run`` (one face, paced) with ``[pipeline] compile = "auto"``: the
    compiled engines `vcam engines build` left in the engine cache are loaded while the rest of the
    models load, and put into use without a stop (how many calls ran uncompiled before is kept);
    with none built, one line says how to build."""
    from vcam.engines.cache import default_cache_dir

    clip = work / "one_face.mp4"
    make_clip(clip, 60, 1)
    cfg = work / "compiled.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    built = sorted((default_cache_dir() / "compiled").glob("inswapper.fp16.b1.*.art"))
    args = ["-v", "run", "-c", str(cfg), "--quiet", "--device", "cuda", "--fp16", "--model", "inswapper_128"]
    args += ["--face", str(photo), "--input", str(clip), "--realtime", "--duration", "25s", "--output", "null"]
    rc, text, secs = vcam(args)
    loaded = re.search(r"compiled engine for batch 1 loaded in ([\d.]+) s", text)
    row = {"label": "compiled_live_cuda", "rc": rc, "seconds": round(secs, 1), "built": [p.name for p in built]}
    row["output"] = "\n".join(ln for ln in text.splitlines() if "compiled" in ln or "latency" in ln or "frames" in ln)[-1500:]
    add_latency(row, text)
    in_use = re.search(r"in use ([\d.]+) s after its load started; (\d+) earlier calls ran uncompiled", text)
    if in_use:
        row["in_use_after_load_start_s"], row["uncompiled_calls"] = float(in_use.group(1)), int(in_use.group(2))
    if built:
        row["load_s"] = float(loaded.group(1)) if loaded else None
        row["ok"] = rc == 0 and loaded is not None
    else:
        row["ok"] = rc == 0 and "vcam engines build" in text
    detail = f"built {len(built)}, loaded in {row.get('load_s')} s, {row.get('uncompiled_calls')} calls uncompiled "
    report(results, row, text, detail)


def mjpeg_run(work: Path, models: Path, src: list, photo: Path, results: list) -> None:
    """The clip as Motion-JPEG (what a webcam sends) through ``vcam run`` with ``--decode gpu`` and
    ``--decode cpu``: every frame written and swapped, the two within the decoders' difference; then
    paced like a camera (``--realtime``), where the first frames are published before the models
    are loaded."""
    from benchmarks.mjpeg import write_mjpeg

    clip = work / "faces_mjpeg.avi"
    write_mjpeg(clip, src)
    cfg = work / "mjpeg.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    base = ["run", "-c", str(cfg), "--quiet", "--device", "cuda", "--fp16", "--model", "inswapper_128", "--face", str(photo)]
    got: dict[str, list] = {}
    for dec in ("gpu", "cpu"):
        dst = work / f"mjpeg_{dec}.mp4"
        dst.unlink(missing_ok=True)
        rc, text, secs = vcam(base + ["--input", str(clip), "--no-loop", "--decode", dec, "--output", f"file:{dst}"])
        frames = frames_of(dst) if rc == 0 else []
        got[dec] = frames
        n = min(len(frames), len(src))
        changed = 100.0 * float(np.mean([np.abs(frames[i].astype(int) - src[i]).mean() > 1.0 for i in range(n)])) if n else 0
        row = {
            "label": f"mjpeg_decode_{dec}_cuda",
            "rc": rc,
            "seconds": round(secs, 1),
            "frames_written": len(frames),
            "changed_pct": round(changed, 1),
            "output": text[-1500:],
        }
        add_latency(row, text)
        row["ok"] = rc == 0 and len(frames) == len(src) and changed > 90
        if dec == "cpu" and got["gpu"] and frames:
            m2 = min(len(frames), len(got["gpu"]))
            row["gpu_vs_cpu_decode_mean_abs"] = round(
                float(np.mean([np.abs(frames[i].astype(int) - got["gpu"][i]).mean() for i in range(m2)])), 3
            )
            row["ok"] = row["ok"] and row["gpu_vs_cpu_decode_mean_abs"] < 1.5
        detail = f"{len(frames)} frames, {row['changed_pct']}% changed {row.get('gpu_vs_cpu_decode_mean_abs', '')} "
        report(results, row, text, detail)
    dst = work / "mjpeg_live.mp4"
    dst.unlink(missing_ok=True)
    rc, text, secs = vcam(base + ["--input", str(clip), "--realtime", "--frames", "45", "--output", f"file:{dst}"])
    m = re.search(r"first frame ([\d.]+) s after start \(through the pipeline ([\d.]+) s; (\d+) early frames", text)
    row = {"label": "mjpeg_live_early_frames_cuda", "rc": rc, "seconds": round(secs, 1), "output": text[-1500:]}
    if m:
        row["first_frame_s"], row["first_processed_s"], row["early_frames"] = (
            float(m.group(1)),
            float(m.group(2)),
            int(m.group(3)),
        )
    row["frames_written"] = len(frames_of(dst)) if rc == 0 else 0
    row["ok"] = rc == 0 and m is not None and row["first_frame_s"] < row["first_processed_s"] and row["frames_written"] >= 45
    report(results, row, text)


def upscale_run(work: Path, models: Path, clip: Path, photo: Path, results: list) -> None:
    """The frame enhancer on the 1080p clip to a file: 10 frames, every one enhanced (a file
    conversion never skips it), written at 3840x2160."""
    cfg = work / "upscale.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    dst = work / "upscaled.mp4"
    dst.unlink(missing_ok=True)
    args = ["run", "-c", str(cfg), "--quiet", "--device", "cuda", "--fp16", "--input", str(clip), "--face", str(photo)]
    args += ["--output", f"file:{dst}", "--frames", "10", "--upscale", "real_esrgan_x2"]
    rc, text, secs = vcam(args)
    row = {"label": "upscale_x2_cuda_fp16", "args": args[3:], "rc": rc, "seconds": round(secs, 1), "output": text[-2000:]}
    got = frames_of(dst) if rc == 0 else []
    row["frames_written"] = len(got)
    row["size"] = list(got[0].shape[:2]) if got else None
    row["ok"] = rc == 0 and len(got) == 10 and row["size"] == [2160, 3840] and "enhancer skipped" not in text
    results.append(row)
    last = [ln for ln in text.splitlines() if ln.strip()][-2:]
    print(
        f"[{'ok' if row['ok'] else 'FAIL'}] upscale_x2_cuda_fp16 rc={rc} {secs:.1f}s {row['size']} | " + " | ".join(last),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
