"""The output registry: a fake output registered through register_output is opened by open_output
and run by the real daemon; every built-in output has every member of the Output protocol."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vcam.config import OutputConfig
from vcam.errors import OutputError
from vcam.stages import publish
from vcam.stages.outputs import NullOutput, Output, OutputBase
from vcam.stages.publish import OUTPUTS, OutputRequest, open_output, register_output
from vcam.stages.recording import FileOutput
from vcam.types import PixelFormat


class Tally(OutputBase):
    """A fake output: keeps what it is sent, remembers the request that made it."""

    def __init__(self, req: OutputRequest) -> None:
        super().__init__()
        self.req = req
        self.fmt = PixelFormat.BGR
        self.width, self.height = req.width, req.height
        self.sent: list[np.ndarray] = []
        self._ready = True

    def send(self, data) -> None:
        if self._closed:
            raise OutputError("the tally is closed")
        self.sent.append(self._check(data).copy())
        self.frames += 1


@pytest.fixture
def tally():
    register_output("tally", Tally)
    yield "tally"
    OUTPUTS.pop("tally", None)


def test_a_registered_output_is_opened_by_name_with_its_argument(tally):
    cfg = OutputConfig(target="Tally:left", fps=12.0)
    with open_output(cfg, 32, 16, 30.0, file_timing="frames") as out:
        assert isinstance(out, Tally) and isinstance(out, Output)
        out.send_bgr(np.full((16, 32, 3), 7, np.uint8))
    req = out.req
    assert (req.name, req.argument, req.width, req.height, req.fps, req.file_timing) == ("tally", "left", 32, 16, 12.0, "frames")
    assert req.settings is cfg and out.closed and len(out.sent) == 1


def test_unknown_targets_list_every_registered_output(tally):
    with pytest.raises(OutputError) as ei:
        open_output(OutputConfig(target="screen"), 32, 32, 30.0)
    assert ei.value.hint == "use one of: vcam, file:PATH (.mp4, .mkv, .mov), window, null, obs-source, or tally"


def test_unknown_target_message_without_extra_outputs():
    with pytest.raises(
        OutputError,
        match=r"unknown output 'screen' \(use one of: vcam, file:PATH \(.mp4, .mkv, .mov\), window, null, or obs-source\)",
    ):
        open_output(OutputConfig(target="screen"), 32, 32, 30.0)


@pytest.mark.parametrize("name", ["", "file:x", "a:b"])
def test_register_refuses_names_a_target_cannot_carry(name):
    with pytest.raises(ValueError, match="an output name is a word without ':'"):
        register_output(name, Tally)


def test_the_builtin_outputs_are_registered():
    assert list(OUTPUTS)[:5] == ["vcam", "file", "window", "null", "obs-source"]
    assert publish.target_forms() == "vcam, file:PATH (.mp4, .mkv, .mov), window, null, or obs-source"


def test_every_protocol_member_has_its_default(tmp_path: Path):
    null = NullOutput(16, 16)
    assert isinstance(null, Output)
    assert (null.path, null.kept, null.cut_short, null.user_closed, null.closed) == (None, None, False, False, False)
    assert null.describe() == "" and null.salvage() is None
    f = FileOutput(tmp_path / "a.mp4", 16, 16, 10.0)
    try:
        assert isinstance(f, Output) and f.path == tmp_path / "a.mp4" and f.describe().startswith("a.mp4: ")
    finally:
        f.close()
    assert f.kept is None  # no frame written: nothing kept


def test_the_daemon_runs_a_registered_output(tally, tmp_path):
    from dataclasses import replace

    from vcam.config import Config
    from vcam.runtime.daemon import Daemon

    made: list[Tally] = []

    def factory(req: OutputRequest) -> Tally:
        made.append(Tally(req))
        return made[-1]

    register_output("tally", factory)
    from vcam.config import Duration

    cfg = Config()
    cfg = cfg.replace(
        capture=replace(cfg.capture, input="demo", width=320, height=180, pacing="fast"),
        output=replace(cfg.output, target="tally"),
        pipeline=replace(cfg.pipeline, device="cpu", max_latency=Duration(0)),
    )
    Daemon(cfg, control=False).run(max_frames=3)
    (out,) = made
    assert out.frames == 3 and out.closed
