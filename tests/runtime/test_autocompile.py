"""A daemon with no compiled engines in its cache builds them on its own: it swaps uncompiled from
the start, says how far the build is in its status, and puts the compiled engine into use once the
background job has built it (the same output, within float32 rounding): one job, one artifact for
all of its batch sizes.

A real Inductor build of the tiny inswapper stand-in on the CPU (``compile = "background"``; on
CUDA ``auto`` does the same): a minute or two on this project's busy two cores.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace

import numpy as np
import pytest
from conftest import WINDOWS, need_torch, require

from vcam import config_file
from vcam.config import Duration
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput
from vcam.status import status_suffix
from vcam.types import PixelFormat


class Capturing(NullOutput):
    def __init__(self, w, h):
        super().__init__(w, h, 30.0, fmt=PixelFormat.I420)
        self.frames = 0

    def send(self, data):
        super().send(data)
        self.frames += 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_daemon_without_compiled_engines_swaps_at_once_and_switches_to_the_ones_it_builds(tmp_path, caplog, monkeypatch):
    need_torch()
    monkeypatch.delenv("VCAM_NO_BACKGROUND_COMPILE")
    if WINDOWS and not shutil.which("cl"):
        require("compiler", "Inductor's CPU kernels need MSVC (cl.exe) on Windows")
    if not WINDOWS and not (shutil.which("g++") or shutil.which("c++")):
        require("compiler", "Inductor's CPU kernels need a C++ compiler (g++)")
    from vcam.engines.autobuild import running_builds
    from vcam.engines.torch import TorchEngine
    from vcam.models import standin

    models = tmp_path / "models"
    models.mkdir()
    written = {name: standin.write(name, models, tiny=True) for name in ("inswapper_128", "arcface_w600k_r50")}
    toml = tmp_path / "vcam.toml"
    toml.write_text(
        f"[models]\ndir = '{models}'\n[swap]\nswapper = 'inswapper_128'\n"
        "[pipeline]\ndevice = 'cpu'\nbackend = 'torch'\nmax_faces = 4\ncompile = 'background'\n"
        "[degrade]\nenabled = false\n"  # a busy test machine must not shed the swap: every frame goes through it
    )
    cfg = config_file.load(toml)
    cfg = cfg.replace(
        capture=replace(cfg.capture, input="demo", width=640, height=360, pacing="realtime"),
        pipeline=replace(cfg.pipeline, max_latency=Duration(0)),
        output=replace(cfg.output, target="null"),
    )
    rng = np.random.default_rng(5)
    f = {"target": rng.random((1, 3, 128, 128), dtype=np.float32), "source": rng.standard_normal((1, 512)).astype(np.float32)}
    want = TorchEngine(written["inswapper_128"], device="cpu", max_batch=1).run(f)[0]
    seen: list[tuple[int, tuple[str, ...], tuple[int, ...]]] = []
    diffs: list[float] = []
    lines: list[str] = []
    out = Capturing(640, 360)
    daemon: Daemon

    def on_status(status, active, swap):  # on the frame thread, at the status interval
        engine = daemon.assembly.swapper.engine
        seen.append((status.frames_out, tuple(status.engines), engine.compiled_batches))
        lines.append(status_suffix(status))  # the live status line's and the OBS text's phrases
        if engine.compiled_batches and not diffs:
            diffs.append(float(np.abs(engine.run(f)[0] - want).max()))
        elif diffs and len(seen) > 2 and seen[-3][2] == (1, 2, 3, 4):  # a few frames swapped compiled, every size: done
            daemon.should_exit = True

    daemon = Daemon(cfg, output=out, control=False, on_status=on_status)
    with caplog.at_level(logging.INFO, logger="vcam.engines"):
        summary = daemon.run(duration=600)
    building = [s for s in seen if s[1] and not s[2]]
    compiled = [s for s in seen if s[2]]
    assert building and compiled, seen
    # swapping from the start, while the build ran, with the progress in the status
    assert building[0][0] > 0 and building[-1][0] > building[0][0]
    assert all(len(s[1]) == 1 and s[1][0].startswith("swapper: compiling engines: 0/1, ~") for s in building), building[:3]
    assert lines[0].startswith(" | swapper: compiling engines: 0/1, ~") and lines[-1] == ""
    # then the compiled engine, the note gone, the same output
    assert compiled[-1][2] == (1, 2, 3, 4) and compiled[-1][1] == ()  # every captured size from the one artifact
    assert diffs and diffs[0] < 1e-4, diffs
    assert summary.frames_out > compiled[0][0] > 0 and out.frames >= summary.frames_out  # (out: the early frames too)
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "compiling one engine for batch 1-4 in the background" in m]
    from vcam.engines.cache import resolve_cache_dir

    (art,) = (resolve_cache_dir(None) / "compiled").glob("*.art")
    assert art.name.split(".")[2] == "b1-4"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("vcam.engines")], messages
    assert running_builds() is None  # the job ended; its progress file is gone


def test_check_says_how_far_a_running_build_is_and_which_sizes_failed(tmp_path):
    """`vcam check` reads the build jobs' progress files (of live processes only) and the failure
    marks in the engine cache."""
    import json
    import os
    import time

    from vcam.config import Config
    from vcam.engines import artifacts
    from vcam.engines.autobuild import progress_path
    from vcam.engines.cache import resolve_cache_dir
    from vcam.runtime.check import check_compiled

    cfg = Config()
    cfg = cfg.replace(swap=replace(cfg.swap, swapper="inswapper_128"), pipeline=replace(cfg.pipeline, device="cpu"))
    assert check_compiled(cfg) == []  # the CPU with compile = "auto": nothing is compiled there
    cfg = cfg.replace(pipeline=replace(cfg.pipeline, compile="background"))
    (item,) = check_compiled(cfg)
    assert item.level == "info" and "none built for this GPU and torch yet" in item.detail and "vcam engines build" in item.fix
    # a job of this process (alive) half-way through; one of a dead process is ignored and removed
    mine = progress_path(None, "inswapper", "fp16", os.getpid())
    mine.parent.mkdir(parents=True, exist_ok=True)
    now = time.time()
    mine.write_text(json.dumps({"sizes": [1, 2, 4, 8], "done": [1, 2], "current": {"4": now - 10}, "durations": [30, 30]}))
    dead = progress_path(None, "inswapper", "fp16", 2**22 + 12345)
    dead.write_text(json.dumps({"sizes": [8], "done": []}))
    (item,) = check_compiled(cfg)
    assert item.detail.startswith("compiling engines: 2/4, ~5") and "s left" in item.detail, item.detail
    assert not dead.exists()
    mine.unlink()
    bad = resolve_cache_dir(None) / "compiled" / "inswapper.fp16.b8.0123456789abcdef.art"
    artifacts.mark_failed(bad, "RuntimeError: out of registers")
    items = check_compiled(cfg)
    warn = [i for i in items if i.level == "warn"]
    assert len(warn) == 1 and "batch 8 failed to build (RuntimeError: out of registers)" in warn[0].detail
    assert warn[0].fix == "vcam engines build --fp16 --batch 8"
    # the one engine of every size failed: not a warning (each size gets its own instead)
    artifacts.mark_failed(bad.with_name("inswapper.fp16.b1-8.0123456789abcdef.art"), "RuntimeError: no dynamic batch")
    items = check_compiled(cfg)
    assert len([i for i in items if i.level == "warn"]) == 1
    (info,) = [i for i in items if "one engine for batch 1-8 failed" in i.detail]
    assert info.level == "info" and "one per batch size instead" in info.detail and "vcam engines build" in info.fix
