"""Probe (issue 9 item 5): FP8 for the swapper's dominant layer on this GPU, against FP16.

    python tools/fp8_probe.py OUT [--batch 1,8]

The inswapper spends 232 of its 349 GFLOP a face in the twelve 3x3 1024->1024 convolutions of its
residual blocks, at 32x32. torch has FP8 only as a matrix product (``torch._scaled_mm``, no FP8
convolution), so the FP8 way is im2col (``F.unfold``), per-tensor scales, FP8 E4M3 operands and one
scaled product with an FP16 result. For each batch size this times (CUDA events, median of 50,
after warm-up): the FP16 convolution as the engine runs it (cuDNN, channels-last), the same as
im2col + an FP16 product, and im2col + quantise + the FP8 product; with the FP8 result's error
against the FP16 convolution on activations shaped like the block's (unit-variance, after an
instance norm). Prints a table; writes OUT/fp8_probe.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aot_probe import _cuda_ms


def probe(batch: int, width: int = 1024, side: int = 32) -> dict:
    import torch
    import torch.nn.functional as F

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(batch, width, side, side, device=dev, generator=g).half()
    w = (torch.randn(width, width, 3, 3, device=dev, generator=g) * (1.0 / (width * 9) ** 0.5)).half()
    xp = F.pad(x, (1, 1, 1, 1), mode="reflect")
    xc = xp.contiguous(memory_format=torch.channels_last)
    wc = w.contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True

    def conv16():
        return F.conv2d(xc, wc)

    wm = w.reshape(width, -1)  # (cout, cin*9)

    def im2col16():
        cols = F.unfold(xp, 3)  # (b, cin*9, L)
        out = torch.matmul(wm, cols)  # (b, cout, L)
        return out.view(batch, width, side, side)

    f8 = torch.float8_e4m3fn
    fmax = torch.finfo(f8).max
    w_scale = (wm.abs().amax().float() / fmax).clamp(min=1e-12)
    w8t = (wm.float() / w_scale).to(f8).t()  # (cin*9, cout), column-major as _scaled_mm wants

    def fp8():
        cols = F.unfold(xp, 3).transpose(1, 2).reshape(-1, wm.shape[1]).contiguous()  # (b*L, cin*9), row-major
        x_scale = (cols.abs().amax().float() / fmax).clamp(min=1e-12)
        a8 = (cols.float() / x_scale).to(f8)
        out = torch._scaled_mm(a8, w8t, scale_a=x_scale, scale_b=w_scale, out_dtype=torch.float16)
        return out.view(batch, side * side, width).transpose(1, 2).reshape(batch, width, side, side)

    ref = conv16().float()
    row = {"batch": batch, "gflop": 2 * batch * width * width * 9 * side * side / 1e9}
    for name, fn in (("conv_fp16_ms", conv16), ("im2col_fp16_ms", im2col16), ("im2col_fp8_ms", fp8)):
        row[name] = round(_cuda_ms(torch, fn), 4)
    for name, fn in (("im2col_fp16", im2col16), ("im2col_fp8", fp8)):
        d = (fn().float() - ref).abs()
        row[f"{name}_max_abs_err"] = float(d.max())
        row[f"{name}_rel_rms_err"] = float(d.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batch", default="1,8")
    args = ap.parse_args()
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [probe(int(b)) for b in args.batch.split(",")]
    gpu = torch.cuda.get_device_name()
    print(f"one 3x3 1024->1024 convolution at 32x32 (12 of them: 232 of 349 GFLOP a face), {gpu}")
    head = ("batch", "GFLOP", "conv fp16", "im2col fp16", "im2col fp8", "fp8 rel. RMS err", "fp16 im2col err")
    print(" ".join(f"{h:>16}" for h in head))
    for r in rows:
        cells = [r["batch"], f"{r['gflop']:.1f}", f"{r['conv_fp16_ms']:.3f} ms", f"{r['im2col_fp16_ms']:.3f} ms"]
        cells += [f"{r['im2col_fp8_ms']:.3f} ms", f"{r['im2col_fp8_rel_rms_err']:.4f}", f"{r['im2col_fp16_rel_rms_err']:.5f}"]
        print(" ".join(f"{c:>16}" for c in cells))
    payload = {"gpu": gpu, "torch": torch.__version__, "rows": rows}
    (out / "fp8_probe.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
