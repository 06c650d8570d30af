"""A start with a face seen before: the recogniser and the photo detector are not on its path (the
face's landmarks and embedding come from the caches), the recogniser is built in the background
after the load, and the daemon's summary still names where it ran."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import demo_run
from typer.testing import CliRunner

from vcam import config_file as vconfig
from vcam.cli import app
from vcam.models import standin
from vcam.runtime import assemble
from vcam.state import RuntimeState

ASSETS = Path(assemble.__file__).resolve().parents[1] / "assets"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models")
    for name in ("inswapper_128", "arcface_w600k_r50"):
        standin.write(name, d, tiny=True)
    return d


def config(models: Path, device: str = "cpu"):
    return vconfig.build(
        {
            "models": {"dir": str(models)},
            "pipeline": {"device": device, "backend": "onnxruntime"},
            "swap": {"swapper": "inswapper_128"},
        }
    )


def start(cfg, photo: Path):
    asm = assemble.build(cfg)
    state = RuntimeState()
    assemble.load_faces(asm, state, demo_input=False, source=str(photo))
    return asm, state


def test_known_photo_needs_no_recogniser_before_the_first_swap(models, monkeypatch):
    photo = ASSETS / "grace_hopper.jpg"
    cfg = config(models)
    first, state = start(cfg, photo)  # computes and remembers the landmarks and the embedding
    want = state.face(state.active)
    assert first.recogniser is not None and first.recogniser.ready  # built at its first use
    second, state = start(cfg, photo)
    rec = second.recogniser
    assert rec is not None and not rec.ready and rec._thread is None  # never started
    got = state.face(state.active)
    assert np.array_equal(got.embeddings[rec.name], want.embeddings[rec.name])
    assert np.array_equal(got.latents["inswapper_128"], want.latents["inswapper_128"])
    assert "recogniser arcface_w600k_r50: loading in the background" in second.describe()
    rec.start()
    rec.get()
    assert "recogniser arcface_w600k_r50: onnxruntime fp32 on cpu" in second.describe()


@pytest.mark.slow
def test_daemon_summary_names_the_recogniser_after_a_cached_start(models, tmp_path):
    cfg = tmp_path / "vcam.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    photo = str(ASSETS / "grace_hopper.jpg")
    runner = CliRunner()
    for _ in range(2):  # the second start finds the face in the caches
        r = runner.invoke(app, demo_run("-c", str(cfg), "--fast", "--model", "inswapper_128", "--face", photo))
        assert r.exit_code == 0, r.output
        models_line = next(ln for ln in r.output.splitlines() if ln.startswith("models:"))
        assert "recogniser arcface_w600k_r50: onnxruntime fp32 on cpu" in models_line, models_line


def test_a_run_that_downloads_nothing_with_the_panel_off_imports_no_network_or_panel_module():
    """Issue 39: the model store's urllib, http and ssl are imported by a download only, the panel's
    modules only when it serves; a `vcam run` on the CPU (the classic swap) imports none of them
    before its first swapped frame, or at all."""
    import subprocess
    import sys

    watched = ("urllib.request", "http.client", "ssl", "vcam.runtime.panel", "vcam.panel.server")
    code = (
        "import sys, runpy\n"
        "sys.argv = ['vcam', 'run', '--device', 'cpu', '--input', 'demo', '--realtime', '--output', 'null',\n"
        "            '--duration', '1s', '--panel', 'off', '--quiet']\n"
        "try:\n"
        "    runpy.run_module('vcam', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"print('IMPORTED', [m for m in {watched!r} if m in sys.modules])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stopped:" in r.stdout + r.stderr
    assert "IMPORTED []" in r.stdout, r.stdout
