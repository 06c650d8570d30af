"""The swap network's arithmetic against a load: what N streams of F faces at R fps ask of the GPU
(issue 39's four streams of six faces).

    python -m benchmarks.swap_load [--model FILE] [--streams 4] [--faces 6] [--fps 30]
        [--ms BATCH:MS ...] [--budget-ms 33] [--json OUT]

The multiply-accumulates of one face are counted from the ONNX graph itself (every Conv, Gemm and
MatMul, its shapes from ONNX's shape inference at batch 1); without ``--model`` the inswapper's
full-size stand-in (the real architecture) the benchmarks share is used (built once:
:func:`benchmarks.startup.standin_swapper`). Each ``--ms BATCH:MS`` is a
measured time of one swap call of that batch (``vcam bench``, or ``gpu_check.sh issue39``'s
``ISSUE39_CALLS``; say where it came from in the row you write): the table gives the throughput it
means (TFLOPS, ms a face) and, for the load, the share of every second the GPU spends on the swap
alone and one round's swap time against the latency budget. Prints a table and writes JSON."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.startup import standin_swapper


def macs_per_item(model_path: Path) -> dict[str, int]:
    """Multiply-accumulates of one batch item, by op type (Conv, Gemm, MatMul), from the graph's
    shapes at batch 1 (a symbolic first dimension is set to 1 before shape inference)."""
    import onnx
    from onnx import shape_inference

    m = onnx.load(str(model_path), load_external_data=False)
    for inp in m.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if dims and not dims[0].dim_value:
            dims[0].ClearField("dim_param")
            dims[0].dim_value = 1
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    g = shape_inference.infer_shapes(m, strict_mode=False).graph
    shapes: dict[str, list[int]] = dict(inits)
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    out: dict[str, int] = {}
    for node in g.node:
        if node.op_type == "Conv":
            w, y = shapes.get(node.input[1]), shapes.get(node.output[0])
            if not w or not y:
                raise ValueError(f"{node.name}: no shape for its weight or output")
            _, cin_g, *k = w
            add = math.prod(y[1:]) * cin_g * math.prod(k)  # every output element: cin/groups x kernel MACs
        elif node.op_type in ("Gemm", "MatMul"):
            a, b = shapes.get(node.input[0]), shapes.get(node.input[1])
            if not a or not b:
                raise ValueError(f"{node.name}: no shape for its inputs")
            trans_b = any(at.name == "transB" and at.i for at in node.attribute)
            k_dim = a[-1]
            n_dim = b[0] if trans_b else b[-1]
            add = math.prod(a[:-1]) * k_dim * n_dim
        else:
            continue
        out[node.op_type] = out.get(node.op_type, 0) + int(add)
    return out


def parse_ms(items: list[str]) -> dict[int, float]:
    """``BATCH:MS`` pairs (``24:29.57``) as {batch: ms}; a malformed one raises ValueError."""
    out: dict[int, float] = {}
    for item in items:
        batch, sep, ms = item.partition(":")
        if not sep:
            raise ValueError(f"--ms {item!r}: expected BATCH:MS, e.g. 24:29.57")
        b, t = int(batch), float(ms)
        if b < 1 or t <= 0:
            raise ValueError(f"--ms {item!r}: the batch must be >= 1 and the time > 0")
        out[b] = t
    return out


def load_rows(
    gflop_face: float, measured: dict[int, float], streams: int, faces: int, fps: float, budget_ms: float
) -> list[dict[str, Any]]:
    """For each measured batch: its throughput, and what ``streams`` x ``faces`` at ``fps`` asks of
    the GPU at that speed (the swap's share of each second; one round of every stream's faces in one
    call, against the budget)."""
    per_s = streams * faces * fps
    round_faces = streams * faces
    rows = []
    for batch, ms in sorted(measured.items()):
        face_ms = ms / batch
        rows.append(
            {
                "batch": batch,
                "call_ms": ms,
                "face_ms": face_ms,
                "tflops": gflop_face * batch / ms,  # GFLOP / ms = TFLOP / s
                "faces_per_s": per_s,
                "swap_share": per_s * face_ms / 1000.0,
                "round_faces": round_faces,
                "round_swap_ms": round_faces * face_ms,
                "budget_ms": budget_ms,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="an ONNX swap network (default: the inswapper's stand-in)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--faces", type=int, default=6)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--budget-ms", type=float, default=33.0)
    ap.add_argument("--ms", action="append", default=[], metavar="BATCH:MS", help="a measured call time of that batch")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    try:
        measured = parse_ms(a.ms)
    except ValueError as exc:
        ap.error(str(exc))
    path = a.model or standin_swapper()
    macs = macs_per_item(path)
    gflop = 2.0 * sum(macs.values()) / 1e9
    print(f"{path.name}: {gflop:.1f} GFLOP a face ({', '.join(f'{k} {2 * v / 1e9:.1f}' for k, v in sorted(macs.items()))})")
    per_s = a.streams * a.faces * a.fps
    load = f"{a.streams} stream(s) x {a.faces} face(s) x {a.fps:g} fps = {per_s:g} faces a second"
    print(f"load: {load} = {per_s * gflop / 1000:.1f} TFLOP a second")
    rows = load_rows(gflop, measured, a.streams, a.faces, a.fps, a.budget_ms)
    if rows:
        head = f"{'batch':>5} {'call ms':>8} {'ms a face':>9} {'TFLOPS':>7} {'swap share of each s':>21}"
        print(f"{head} {'a round of ' + str(a.streams * a.faces) + ' ms':>16}")
        for r in rows:
            print(
                f"{r['batch']:>5} {r['call_ms']:>8.2f} {r['face_ms']:>9.3f} {r['tflops']:>7.0f} {100 * r['swap_share']:>20.0f}% "
                f"{r['round_swap_ms']:>10.1f} / {r['budget_ms']:g}"
            )
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "model": str(path),
                    "gflop_per_face": gflop,
                    "macs": macs,
                    "streams": a.streams,
                    "faces": a.faces,
                    "fps": a.fps,
                    "rows": rows,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
