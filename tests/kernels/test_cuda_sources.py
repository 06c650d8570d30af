"""The CUDA sources compile, and the parameter structs they take by value are laid out as the NumPy
dtypes that pack them: checked with the CUDA compiler at build time (``static_assert`` on every
field's offset and the struct's size), so a kernel edited on a machine without a GPU is caught before
a GPU runs it. Needs ``nvcc`` (skipped without it: the GPU tests compile them with NVRTC)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import WINDOWS

from vcam.kernels import classic, detect, mask, paste, tiles, warp
from vcam.kernels.build import OPTIONS

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(
    NVCC is None,
    reason="nvcc, the CUDA toolkit's compiler: not on Windows here (Wine has none)"
    if WINDOWS
    else "no nvcc here (the CUDA toolkit's compiler)",
)

#: (source, struct, the dtype that packs it)
STRUCTS = [
    ("classic", "Render", classic.RENDER),
    ("classic", "Spline", classic.SPLINE),
    ("convert", "Regions", detect.REGIONS),
    ("mask", "Shapes", mask.SHAPES),
    ("mask", "Landmarks", mask.LANDMARKS),
    ("paste", "Paste", paste.PASTE),
    ("tiles", "Tiles", tiles.TILES),
    ("warp", "Faces", warp.FACES),
    ("warp", "Affine", warp.AFFINE),
]


def _nvcc(source: Path, out: Path) -> subprocess.CompletedProcess:
    # the runtime's NVRTC options (vcam.kernels.build.OPTIONS), for Hopper
    return subprocess.run(
        [NVCC, "--ptx", "-arch=sm_90", *OPTIONS, "-o", str(out), str(source)], capture_output=True, text=True, timeout=300
    )


def test_every_cuda_source_compiles(tmp_path):
    failed = {}
    names = sorted(p.stem for p in KERNELS.glob("*.cu"))
    assert len(names) >= 7
    for name in names:
        r = _nvcc(KERNELS / f"{name}.cu", tmp_path / f"{name}.ptx")
        if r.returncode != 0 or ".entry" not in (tmp_path / f"{name}.ptx").read_text():
            failed[name] = r.stderr[-2000:]
    assert not failed, failed


def _asserts(struct: str, dtype: np.dtype) -> list[str]:
    out = [f'static_assert(sizeof({struct}) == {dtype.itemsize}, "{struct}: size");']
    for field in dtype.names:
        offset = dtype.fields[field][1]
        out.append(f'static_assert(offsetof({struct}, {field}) == {offset}, "{struct}.{field}: offset");')
    return out


def test_each_parameter_struct_is_laid_out_as_its_dtype(tmp_path):
    """One probe per source, every struct of it checked field by field (a failure names them)."""
    failed = {}
    for module in sorted({m for m, _, _ in STRUCTS}):
        lines = ["#include <cstddef>", f'#include "{KERNELS / module}.cu"']
        for _, struct, dtype in (s for s in STRUCTS if s[0] == module):
            lines += _asserts(struct, dtype)
        probe = tmp_path / f"{module}_layout.cu"
        probe.write_text("\n".join(lines) + "\n")
        r = _nvcc(probe, tmp_path / f"{module}_layout.ptx")
        if r.returncode != 0:
            failed[module] = [ln for ln in r.stderr.splitlines() if "static assertion" in ln or "error" in ln]
    assert not failed, failed


def test_a_misplaced_field_fails_the_layout_check(tmp_path):
    """The check itself: a dtype whose ``count`` sits 4 bytes off does not compile."""
    bad = np.dtype({"names": ["count"], "formats": ["i4"], "offsets": [paste.PASTE.fields["count"][1] + 4]})
    probe = tmp_path / "bad.cu"
    probe.write_text("\n".join(["#include <cstddef>", f'#include "{KERNELS / "paste"}.cu"', *_asserts("Paste", bad)]) + "\n")
    r = _nvcc(probe, tmp_path / "bad.ptx")
    assert r.returncode != 0 and "Paste.count: offset" in r.stderr
