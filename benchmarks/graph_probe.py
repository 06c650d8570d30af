"""Issue 43's open questions about a per-frame CUDA graph, answered on a GPU in one short run, before
the pipeline is built around them.

    python -m benchmarks.graph_probe [--faces 1] [--iters 300] [--json OUT]

The swap part of a frame (the normalised warp, a swap network, its crops, the paste-back) is the
frame's compute-stream work a graph would replay. Here it runs on vcam's own CUDA ops and kernels,
the swap network a small FP16 torch convolution net standing in for the inswapper, in three ways:

1. **eager, by value** (what the pipeline does today): the reference, frame by frame;
2. **captured once, replayed** with the per-frame structs in parameter records
   (:mod:`vcam.kernels.records`): ``torch.cuda.graph`` begun on the ops' compute stream (a torch
   ``ExternalStream`` of it) captures the CuPy launches, the records' host-to-device copies and the
   net's eager forward together; each later frame the host only writes the structs (the fronts run
   against :class:`vcam.kernels.records.PackOnly`: no launch, no copy; the bytes land at the
   captured offsets) and replays. Five frames of moving faces, each compared with (1) pixel by pixel;
3. **the net's own graph replayed inside the capture** (what the torch engine does today for its
   calls): does CUDA take a graph launch into a stream capture (a child graph), or refuse it?

Then the host time of a frame's launches (1) against writing the structs and one replay (2), over
``--iters`` frames, and what the launches and the replay take on the GPU. Prints a table and writes
JSON; exits 2 with the reason where there is no CUDA GPU with CuPy and PyTorch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

W, H, S = 1280, 720, 128
MEAN = STD = (127.5, 127.5, 127.5)


def _mats(rng: np.random.Generator, n: int, t: int) -> np.ndarray:
    from vcam import align

    out = []
    for f in range(n):
        side = 180 + 20 * np.sin(t * 0.3 + f)
        cx, cy = 150 + 190 * f + 15 * t, 360 + 10 * np.cos(t * 0.5)
        lm = (align.TEMPLATES["arcface_128"] - 0.5) * side + [cx, cy] + rng.normal(0, 0.5, (5, 2))
        out.append(align.estimate(lm, "arcface_128", S))
    return np.array(out)


def _net(torch: Any) -> Any:
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 3, 3, padding=1)
    )
    return net.cuda().half().eval().requires_grad_(False).to(memory_format=torch.channels_last)


class Part:
    """The swap part of one frame on its own buffers: ``run(ops, mats)`` queues it on ``ops``'s stream."""

    def __init__(self, ops: Any, torch: Any, net: Any, n: int, frame: np.ndarray) -> None:
        import cupy as cp

        from vcam.kernels import paste as blend

        self.torch, self.net, self.n = torch, net, n
        self.frame0 = cp.asarray(frame)
        self.frame = self.frame0.copy()
        self.feeds = cp.zeros((n, 3, S, S), cp.float16)
        self.crops = cp.zeros((n, S, S, 3), cp.uint8)
        self.guard = cp.zeros((n,), cp.int32)
        self.mask = cp.asarray(blend.box_mask(S, 0.3))
        self.out: Any = None

    def reset(self) -> None:
        self.frame[...] = self.frame0

    def run(self, ops: Any, mats: np.ndarray, tstream: Any, *, pack: bool = False) -> None:
        """Queue the part on ``ops``' stream; ``pack``: the host's share of a replayed frame only (the
        net is not called: its captured output stands)."""
        import cupy as cp

        from vcam.kernels import paste as blend
        from vcam.kernels import warp

        torch = self.torch
        warp.warp_crops_normalized(ops, self.frame, mats, S, MEAN, STD, True, out=self.feeds)
        if not pack:
            with torch.cuda.stream(tstream):
                self.out = self.net(torch.from_dlpack(self.feeds)).contiguous()
        warp.crops_from_planar(ops, cp.from_dlpack(self.out), self.feeds, self.n, self.crops, self.guard)
        blend.paste_back(ops, self.frame, self.crops, mats, self.mask, self.n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--faces", type=int, default=1)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    from vcam.ops import cuda_status

    ok, why = cuda_status()
    if not ok:
        print(f"graph_probe needs a CUDA GPU with CuPy: {why}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("graph_probe needs PyTorch (the swap network's stand-in)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("graph_probe: torch sees no CUDA device", file=sys.stderr)
        return 2
    from vcam.kernels.records import PackOnly, recording
    from vcam.ops.cuda import CudaOps

    rng = np.random.default_rng(43)
    n = int(a.faces)
    frame = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    ops = CudaOps()
    net = _net(torch)
    tstream = torch.cuda.ExternalStream(int(ops.compute.ptr))
    eager, graphed = Part(ops, torch, net, n, frame), Part(ops, torch, net, n, frame)
    record = ops.param_record()
    result: dict[str, Any] = {"faces": n, "size": f"{W}x{H}", "crop": S}

    with ops.activate():
        eager.run(ops, _mats(rng, n, 0), tstream)  # first uses (cuDNN, kernel modules) outside the capture
        ops.synchronize()
        graph = torch.cuda.CUDAGraph()
        graphed.reset()
        record.clear()
        try:
            with torch.cuda.graph(graph, stream=tstream), recording(ops, record):
                graphed.run(ops, _mats(rng, n, 0), tstream)
            captured = record.signature
            result["capture"] = "ok"
        except Exception as exc:  # the answer to question 2 is this message
            result["capture"] = f"failed: {type(exc).__name__}: {exc}"[:400]
            print(json.dumps(result, indent=1))
            return 1
        packer = PackOnly(ops)
        diffs = []
        for t in range(1, 6):
            mats = _mats(rng, n, t)
            eager.reset()
            eager.run(ops, mats, tstream)
            graphed.reset()
            record.clear()
            with recording(packer, record):
                graphed.run(packer, mats, tstream, pack=True)
            same = record.signature == captured
            with torch.cuda.stream(tstream):
                graph.replay()
            record.close(ops)
            ops.synchronize()
            d = int(np.abs(eager.frame.get().astype(np.int16) - graphed.frame.get().astype(np.int16)).max())
            diffs.append(
                {"frame": t, "signature same": same, "max diff": d, "changed": bool((graphed.frame != graphed.frame0).any())}
            )
        result["replays"] = diffs

        # 3: the net's own graph replayed inside another capture
        inner = torch.cuda.CUDAGraph()
        x = torch.from_dlpack(eager.feeds)
        with torch.cuda.graph(inner, stream=tstream):
            inner_out = net(x)
        outer = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(outer, stream=tstream):
                inner.replay()
                _ = inner_out * 1
            outer.replay()
            ops.synchronize()
            result["child graph"] = "ok: a graph replayed inside a capture is taken"
        except Exception as exc:
            result["child graph"] = f"refused: {type(exc).__name__}: {exc}"[:400]
            torch.cuda.synchronize()

        # host and device time per frame: eager launches against pack + one replay
        mats_seq = [_mats(rng, n, t) for t in range(16)]
        host_e, host_g = [], []
        for i in range(int(a.iters)):
            mats = mats_seq[i % 16]
            t0 = time.perf_counter()
            eager.run(ops, mats, tstream)
            host_e.append(time.perf_counter() - t0)
            ops.synchronize()
            t0 = time.perf_counter()
            record.clear()
            with recording(packer, record):
                graphed.run(packer, mats, tstream, pack=True)
            with torch.cuda.stream(tstream):
                graph.replay()
            record.close(ops)
            host_g.append(time.perf_counter() - t0)
            ops.synchronize()
        gpu = {}
        for name, fn in (("eager", lambda m: eager.run(ops, m, tstream)), ("replay", None)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(tstream):
                start.record()
                for i in range(100):
                    if fn is not None:
                        fn(mats_seq[i % 16])
                    else:
                        graph.replay()
                end.record()
            end.synchronize()
            gpu[name] = start.elapsed_time(end) / 100
    result["host ms a frame"] = {"eager": statistics.median(host_e) * 1e3, "pack + replay": statistics.median(host_g) * 1e3}
    result["stream ms a frame (100 queued)"] = gpu
    print(f"swap part of a frame, {n} face(s), {W}x{H}: capture {result['capture']}; child graph: {result['child graph']}")
    print(f"{'frame':>6} {'signature same':>15} {'max diff':>9} {'changed':>8}")
    for r in diffs:
        print(f"{r['frame']:>6} {str(r['signature same']):>15} {r['max diff']:>9} {str(r['changed']):>8}")
    print(f"{'':24}{'eager':>10}{'pack+replay':>14}")
    host = result["host ms a frame"]
    print(f"{'host ms a frame (p50)':24}{host['eager']:>10.3f}{host['pack + replay']:>14.3f}")
    print(f"{'stream ms a frame':24}{gpu['eager']:>10.3f}{gpu['replay']:>14.3f}  (100 frames queued back to back)")
    if a.json is not None:
        from benchmarks import write_report

        write_report(str(a.json), result)
    bad = [r for r in diffs if r["max diff"] > 1 or not r["signature same"] or not r["changed"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
