"""benchmarks/swap_load.py: the swap network's multiply-accumulates counted from its ONNX graph (the
arithmetic behind issue 39's four streams of six faces) and the load table built from measured calls."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from benchmarks.swap_load import load_rows, macs_per_item, main, parse_ms


def _conv(cin: int, cout: int, k: int, out_hw: int) -> int:
    return cin * cout * k * k * out_hw * out_hw


def expected_inswapper_macs(div: int) -> int:
    """The inswapper's convolutions by hand (docs/models.md), every width divided by ``div``."""
    c1, c2, c3, c4 = (128 // div, 256 // div, 512 // div, 1024 // div)
    enc = _conv(3, c1, 7, 128) + _conv(c1, c2, 3, 128) + _conv(c2, c3, 3, 64) + _conv(c3, c4, 3, 32)
    blocks = 12 * _conv(c4, c4, 3, 32)
    dec = _conv(c4, c3, 3, 64) + _conv(c3, c2, 3, 128) + _conv(c2, c1, 3, 128) + _conv(c1, 3, 7, 128)
    return enc + blocks + dec


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The inswapper's tiny stand-in (every width divided by 16) as a file."""
    import onnx

    from vcam.models import registry
    from vcam.models.standin import build_inswapper

    path = tmp_path_factory.mktemp("swap_load") / "inswapper_tiny.onnx"
    onnx.save(build_inswapper(registry.get("inswapper_128"), tiny=True), str(path))
    return path


def test_the_inswapper_stand_ins_convolutions_are_counted_from_its_graph(tiny):
    macs = macs_per_item(tiny)
    assert macs["Conv"] == expected_inswapper_macs(16)
    # the AdaIN's twelve Linears (latent 512 -> 2C each) are the Gemms
    assert macs["Gemm"] == 12 * 512 * 2 * (1024 // 16)


def test_a_face_of_the_full_size_architecture_is_about_349_gflop():
    # the hand count the benchmark's graph count is held to above, at full width
    assert 2 * expected_inswapper_macs(1) / 1e9 == pytest.approx(349.1, abs=0.1)


def test_the_load_table_is_the_measured_calls_arithmetic():
    rows = load_rows(gflop_face=349.2, measured={24: 29.57, 1: 2.22}, streams=4, faces=6, fps=30.0, budget_ms=33.0)
    assert [r["batch"] for r in rows] == [1, 24]
    r24 = rows[1]
    assert r24["face_ms"] == pytest.approx(29.57 / 24)
    assert r24["faces_per_s"] == 720
    assert r24["swap_share"] == pytest.approx(720 * 29.57 / 24 / 1000)  # 0.887 of every second
    assert r24["round_swap_ms"] == pytest.approx(29.57)
    assert r24["tflops"] == pytest.approx(349.2 * 24 / 29.57)


@pytest.mark.parametrize("bad", ["24", "x:3", "0:5", "4:-1"])
def test_a_malformed_measurement_is_refused_with_the_form_it_wants(bad):
    with pytest.raises(ValueError):
        parse_ms([bad])


def test_the_command_prints_the_count_and_writes_json(tiny, tmp_path, capsys):
    import json

    out = tmp_path / "load.json"
    assert main(["--model", str(tiny), "--ms", "8:4.0", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "GFLOP a face" in printed and "720 faces a second" in printed
    data = json.loads(out.read_text())
    assert data["rows"][0]["batch"] == 8 and data["gflop_per_face"] > 0
