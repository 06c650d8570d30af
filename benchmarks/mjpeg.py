"""A camera's MJPG decoded on the GPU against the CPU (issue 9 item 6).

    python -m benchmarks.mjpeg [--device cuda] [--size 1080p] [--seconds 6] [--quality 90]
        [--swapper inswapper_128 --model-dir DIR] [--fp16] [--json bench_mjpeg.json]

The demo clip's first frames (one moving face) are written as a Motion-JPEG file, the stream a
webcam sends at 720p/1080p and 30 fps; sensor noise (``--noise``, levels) makes the JPEGs about as
large as a camera's. Two parts, in the same run:

- **decode**: one JPEG of that size decoded over and over, by OpenCV on the CPU (libjpeg-turbo, the
  naive baseline and the fallback) and, on CUDA, by the GPU decoder of :mod:`vcam.stages.decode` (nvJPEG,
  then the conversion to BGR into device memory), each call waited for: p50/p99 per frame;
- **daemon**: the real daemon reading the file as a camera (:class:`vcam.stages.sources.VideoSource` with
  compressed delivery, paced at 30 fps, and flat out) to the null output, with ``[capture] decode``
  = ``cpu`` and = ``gpu``: capture-to-publish p50/p99, the clock started when the JPEG arrived,
  before its decode, and frames published per second.

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_report
from benchmarks.streams import _Frames, _size
from vcam.config_file import build
from vcam.runtime.daemon import Daemon
from vcam.types import Frame, PixelFormat


def write_mjpeg(path: Path, frames: Iterable[np.ndarray], fps: int = 30, quality: int | None = None) -> list[bytes]:
    """``frames`` (BGR, one size) as a Motion-JPEG AVI, as FFmpeg writes a camera recording, at
    JPEG ``quality`` (None: FFmpeg's default); returns each frame's JPEG as stored."""
    import av

    from vcam.stages.sources import VideoSource

    with av.open(str(path), mode="w") as c:
        s = None
        for img in frames:
            if s is None:
                s = c.add_stream("mjpeg", rate=int(fps))
                s.width, s.height, s.pix_fmt = img.shape[1], img.shape[0], "yuvj420p"
                if quality is not None:  # FFmpeg's qscale from a JPEG quality, roughly: 90 -> 3, 75 -> 7
                    s.codec_context.qmin = s.codec_context.qmax = max(2, round((100 - quality) / 3.5))
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="bgr24")):
                c.mux(p)
        if s is not None:
            for p in s.encode(None):
                c.mux(p)
    with VideoSource(path, realtime=False, compressed=True) as src:
        out = []
        while (f := src.read()) is not None:
            out.append(bytes(f.data))
    return out


def write_clip(path: Path, frames: _Frames, count: int, quality: int, noise: float = 0.0) -> list[bytes]:
    """``count`` frames of ``frames`` as a Motion-JPEG AVI at JPEG ``quality``, with Gaussian
    ``noise`` (levels) added as a camera sensor's; returns the JPEGs."""
    rng = np.random.default_rng(0)

    def noisy():
        for i in range(count):
            img = frames.frame(i)
            yield np.clip(img + rng.normal(0, noise, img.shape), 0, 255).astype(np.uint8) if noise else img

    return write_mjpeg(path, noisy(), fps=int(frames.fps), quality=quality)


def _pct(times: list[float]) -> dict:
    a = np.asarray(times) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "n": len(times)}


def decode_times(jpeg: bytes, width: int, height: int, device: str, repeats: int) -> dict[str, dict]:
    """Per-frame decode time of ``jpeg``: OpenCV on the CPU, and the GPU decoder on CUDA."""
    from vcam.stages.decode import CpuJpegDecoder, CudaJpegDecoder

    frame = Frame(np.frombuffer(jpeg, np.uint8).copy(), width, height, PixelFormat.MJPEG, 0.0, 0)
    rows: dict[str, dict] = {}
    cpu = CpuJpegDecoder()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cpu.decode(frame)
        times.append(time.perf_counter() - t0)
    rows["cpu"] = _pct(times)
    if device == "cuda":
        from vcam.ops.cuda import CudaOps

        ops = CudaOps()
        ops.warmup()
        gpu = CudaJpegDecoder(ops)
        times = []
        for i in range(repeats + 10):
            t0 = time.perf_counter()
            gpu.decode(frame)
            gpu.stream.synchronize()
            if i >= 10:
                times.append(time.perf_counter() - t0)
        rows["gpu"] = _pct(times)
    return rows


def _daemon_row(args: argparse.Namespace, clip: Path, decode: str, paced: bool) -> dict:
    w, h = _size(args.size)
    data: dict[str, Any] = {
        "capture": {
            "input": str(clip),
            "width": w,
            "height": h,
            "pacing": "realtime" if paced else "fast",
            "loop": True,
            "decode": decode,
        },
        "pipeline": {"device": args.device, "fp16": bool(args.fp16), "max_latency": 0},
        # a face to swap in (a file input has no default face, unlike the demo)
        "swap": {
            "swapper": args.swapper,
            "source": str(Path(__file__).resolve().parents[1] / "vcam" / "assets" / "grace_hopper.jpg"),
        },
        "output": {"target": "null"},
        "status": {"interval": "1s"},
    }
    if args.model_dir:
        data["models"] = {"dir": args.model_dir}
    daemon = Daemon(build(data), control=False)
    daemon.startup()
    daemon.wait_compiled(300)  # time the compiled swapper where it is built
    try:
        daemon.main_loop(None, args.seconds)
    finally:
        daemon.shutdown()
    s = daemon.summary
    st = daemon.streams[0]
    return {
        "decoder": st.decoder.device if st.decoder is not None else None,
        "faces": st.live.faces,
        "frames": s.frames_out,
        "fps": s.fps,
        "p50_ms": s.percentile(50),
        "p99_ms": s.percentile(99),
        "dropped_capture": s.dropped_capture,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--size", default="1080p", help="720p, 1080p, 4k or WxH")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality of the clip (webcams: 80-95)")
    ap.add_argument("--noise", type=float, default=5.0, help="sensor noise added to the frames (levels)")
    ap.add_argument("--frames", type=int, default=60, help="frames in the clip (it loops)")
    ap.add_argument("--repeats", type=int, default=200, help="decodes per decoder in the decode part")
    ap.add_argument("--swapper", default="classic")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--modes", default="paced,fast", help="daemon rows: paced (30 fps), fast (flat out)")
    ap.add_argument("--json", default="bench_mjpeg.json")
    args = ap.parse_args(argv)
    w, h = _size(args.size)
    frames = _Frames(w, h, count=args.frames)
    decoders = ["cpu", "gpu"] if args.device == "cuda" else ["cpu"]
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "camera.avi"
        jpegs = write_clip(clip, frames, args.frames, args.quality, args.noise)
        kb = float(np.mean([len(j) for j in jpegs])) / 1024
        decode = decode_times(jpegs[0], w, h, args.device, args.repeats)
        daemon: dict[str, dict] = {}
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            for dec in decoders:
                daemon[f"{mode} {dec}"] = _daemon_row(args, clip, dec, paced=mode == "paced")
    fp = " fp16" if args.fp16 else ""
    print(f"MJPG {args.size} ({w}x{h}), JPEG quality {args.quality}, {kb:.0f} KB a frame; {args.swapper}{fp} on {args.device}")
    print(f"{'decode one frame':<26} {'p50 ms':>8} {'p99 ms':>8}")
    names = {"cpu": "CPU (OpenCV), baseline", "gpu": "GPU (nvJPEG -> BGR)"}
    for k, r in decode.items():
        print(f"{names[k]:<26} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}")
    if "gpu" in decode:
        print(f"GPU decode / CPU decode (p50): {decode['gpu']['p50_ms'] / decode['cpu']['p50_ms']:.2f}x")
    print(f"{'daemon, capture to publish':<26} {'decoder':>8} {'faces':>6} {'fps':>8} {'p50 ms':>8} {'p99 ms':>8} {'dropped':>8}")
    for k, r in daemon.items():
        lat = f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}"
        print(f"{k:<26} {r['decoder'] or '-':>8} {r['faces']:>6} {r['fps']:>8.1f} {lat} {r['dropped_capture']:>8}")
    return write_report(
        args.json,
        {
            "size": args.size,
            "device": args.device,
            "swapper": args.swapper,
            "fp16": bool(args.fp16),
            "quality": args.quality,
            "jpeg_kb": kb,
            "decode": decode,
            "daemon": daemon,
        },
    )


if __name__ == "__main__":
    main()
