"""Publish stage: where finished frames go.

:func:`open_output` builds an :class:`Output` from ``OutputSettings.target`` through the output
registry (:data:`OUTPUTS`, :func:`register_output`): the target ``NAME`` or ``NAME:ARGUMENT`` names
a registered factory. Built in:

================ =================================================================================
``vcam``         the virtual camera (pyvirtualcam) named ``OutputSettings.device_name``, on the
                 backend ``OutputSettings.backend`` picks (:mod:`vcam.stages.virtualcam`)
``file:PATH``    a video (.mp4, .mkv, .mov, .m4v; H.264 when available) written with PyAV, crash-safe
``window``       a preview window (OpenCV ``imshow``)
``null``         nothing; counts frames (benchmarks)
``obs-source``   no virtual camera: OBS shows the frames through a Browser Source, served by the
                 panel's server (``[obs] source``; :mod:`vcam.panel.source`)
================ =================================================================================

A factory's obligations: it takes one :class:`OutputRequest` and returns an open :class:`Output`
(every member of the protocol, :class:`~vcam.stages.outputs.OutputBase` gives the defaults) whose
``fmt``/``width``/``height`` say what :meth:`Output.send` takes; it raises
:class:`~vcam.errors.OutputError` naming the fix, having released whatever it opened, and never
returns a half-open output; it neither paces frames nor reads the config (the request carries
everything).

Every output states what :meth:`Output.send` takes: ``fmt`` at ``width`` x ``height``. The pipeline
turns its BGR frame into that with :func:`prepare` (crop, then ``convert.from_bgr``), or calls
:meth:`send_bgr`. The virtual camera's 4:2:0 formats (I420, NV12) need an even width and height:
for an odd input size it takes the frame cropped by one column and/or row at the right/bottom edge,
so ``width``/``height`` may be one less than the size passed to :func:`open_output`. A file keeps
odd sizes. Outputs do not pace; the publish loop decides when to send.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from vcam import devices
from vcam.errors import OutputError
from vcam.stages.outputs import (
    NullOutput,
    ObsSourceOutput,
    Output,
    WindowOutput,
    even_size,
    gui_available,
    prepare,
)
from vcam.stages.recording import FileOutput, file_target
from vcam.stages.virtualcam import VirtualCamOutput

log = logging.getLogger(__name__)


class OutputSettings(Protocol):
    """What :func:`open_output` reads (the config's ``[output]`` section is one; the runtime passes
    it, this stage never reads the config itself)."""

    @property
    def target(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def pixel_format(self) -> str: ...
    @property
    def fps(self) -> float: ...
    @property
    def chroma(self) -> str: ...


@dataclass(frozen=True)
class OutputRequest:
    """What an output factory is asked for. ``argument``: the target's text after ``NAME:`` ('' when
    none); ``fps``: the rate to announce (``settings.fps`` when set, else the input's);
    ``file_timing``: how a file stamps frames (:class:`FileOutput`'s ``timing``); ``writer``,
    ``writer_options``, ``platform``, ``unity_names`` and ``sysfs_root``: the virtual camera's
    (:class:`~vcam.stages.virtualcam.VirtualCamOutput`), for tests."""

    name: str
    argument: str
    width: int
    height: int
    fps: float
    settings: OutputSettings
    file_timing: str = "wall"
    writer: str | None = None
    writer_options: dict[str, Any] = field(default_factory=dict)
    platform: str = sys.platform
    unity_names: Callable[[], list[str]] = devices.unity_capture_names
    sysfs_root: Path = devices.SYSFS_ROOT


OutputFactory = Callable[[OutputRequest], Output]

#: Output name -> factory (see the module docstring for a factory's obligations).
OUTPUTS: dict[str, OutputFactory] = {}


def register_output(name: str, factory: OutputFactory) -> None:
    """Register ``factory`` for targets ``NAME`` and ``NAME:ARGUMENT`` (``name`` is matched without
    case); a factory already registered under ``name`` is replaced."""
    if not name or ":" in name:
        raise ValueError(f"an output name is a word without ':', not {name!r}")
    OUTPUTS[name.lower()] = factory


def target_forms() -> str:
    """The targets the registered outputs take, for messages."""
    forms = {"vcam": "vcam", "file": "file:PATH (.mp4, .mkv, .mov)"}
    names = [forms.get(n, n) for n in OUTPUTS]
    return ", ".join(names[:-1]) + f", or {names[-1]}" if len(names) > 1 else "".join(names)


def _virtual_camera(req: OutputRequest) -> Output:
    s = req.settings
    return VirtualCamOutput(
        req.width,
        req.height,
        req.fps,
        device_name=req.argument or s.device_name,
        pixel_format=s.pixel_format,
        backend=s.backend,
        writer=req.writer,
        writer_options=req.writer_options,
        platform=req.platform,
        unity_names=req.unity_names,
        sysfs_root=req.sysfs_root,
    )


def _file(req: OutputRequest) -> Output:
    path = file_target(f"file:{req.argument}")
    assert path is not None
    return FileOutput(path, req.width, req.height, req.fps, timing=req.file_timing, chroma=req.settings.chroma)


register_output("vcam", _virtual_camera)
register_output("file", _file)
register_output("window", lambda req: WindowOutput(req.width, req.height, req.fps))
register_output("null", lambda req: NullOutput(req.width, req.height, req.fps))
register_output("obs-source", lambda req: ObsSourceOutput(req.width, req.height, req.fps))


def open_output(
    cfg: OutputSettings,
    width: int,
    height: int,
    fps: float,
    *,
    file_timing: str = "wall",
    writer: str | None = None,
    writer_options: dict[str, Any] | None = None,
    platform: str = sys.platform,
    unity_names: Callable[[], list[str]] = devices.unity_capture_names,
    sysfs_root: Path = devices.SYSFS_ROOT,
) -> Output:
    """Open the output named by ``cfg.target`` for ``width`` x ``height`` frames (see
    :class:`OutputRequest` for the keyword arguments). ``fps``: the input's rate, used unless
    ``cfg.fps`` is set (> 0). Raises :class:`OutputError` naming the fix."""
    target = (cfg.target or "").strip()
    name, _, argument = target.partition(":")
    factory = OUTPUTS.get(name.strip().lower())
    if factory is None:
        raise OutputError(f"unknown output {target!r}", hint=f"use one of: {target_forms()}")
    rate = cfg.fps if cfg.fps and cfg.fps > 0 else fps
    request = OutputRequest(
        name=name.strip().lower(),
        argument=argument.strip(),
        width=width,
        height=height,
        fps=rate,
        settings=cfg,
        file_timing=file_timing,
        writer=writer,
        writer_options=dict(writer_options or {}),
        platform=platform,
        unity_names=unity_names,
        sysfs_root=sysfs_root,
    )
    return factory(request)


__all__ = [
    "OUTPUTS",
    "FileOutput",
    "NullOutput",
    "Output",
    "VirtualCamOutput",
    "WindowOutput",
    "even_size",
    "file_target",
    "gui_available",
    "open_output",
    "OutputRequest",
    "prepare",
    "register_output",
]
