"""Publish stage: where finished frames go.

:func:`open_output` builds an :class:`Output` from ``OutputSettings.target``:

================ =================================================================================
``vcam``         the virtual camera (pyvirtualcam), found by its name ``OutputSettings.device_name``
``file:PATH``    a video (.mp4, .mkv, .mov, .m4v; H.264 when available) written with PyAV, crash-safe
``window``       a preview window (OpenCV ``imshow``)
``null``         nothing; counts frames (benchmarks)
================ =================================================================================

Every output states what :meth:`Output.send` takes: ``fmt`` at ``width`` x ``height``. The pipeline
turns its BGR frame into that with :func:`prepare` (crop, then ``convert.from_bgr``), or calls
:meth:`send_bgr`. The virtual camera's 4:2:0 formats (I420, NV12) need an even width and height:
for an odd input size it takes the frame cropped by one column and/or row at the right/bottom edge,
so ``width``/``height`` may be one less than the size passed to :func:`open_output`. A file keeps
odd sizes. Outputs do not pace; the publish loop decides when to send.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from vcam import devices
from vcam.errors import OutputError
from vcam.stages.outputs import (
    NullOutput,
    Output,
    VirtualCamOutput,
    WindowOutput,
    even_size,
    gui_available,
    prepare,
)
from vcam.stages.recording import FileOutput, file_target

log = logging.getLogger(__name__)


class OutputSettings(Protocol):
    """What :func:`open_output` reads (the config's ``[output]`` section is one; the runtime passes
    it, this stage never reads the config itself)."""

    @property
    def target(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def pixel_format(self) -> str: ...
    @property
    def fps(self) -> float: ...
    @property
    def chroma(self) -> str: ...


TARGET_FORMS = "vcam, file:PATH (.mp4, .mkv, .mov), window, or null"


# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------


def open_output(
    cfg: OutputSettings,
    width: int,
    height: int,
    fps: float,
    *,
    sysfs_root: Path = devices.SYSFS_ROOT,
    backend: str | None = None,
    backend_options: dict[str, Any] | None = None,
    file_timing: str = "wall",
) -> Output:
    """Open the output named by ``cfg.target`` for ``width`` x ``height`` frames.

    ``fps``: the input's rate, used unless ``cfg.fps`` is set (> 0). ``backend`` and
    ``backend_options`` go to pyvirtualcam for ``vcam``. ``file_timing`` is :class:`FileOutput`'s
    ``timing`` (``"frames"`` suits as-fast-as-possible runs). Raises :class:`OutputError` naming the fix.
    """
    target = (cfg.target or "").strip()
    rate = cfg.fps if cfg.fps and cfg.fps > 0 else fps
    low = target.lower()
    if low == "vcam":
        return VirtualCamOutput(
            width,
            height,
            rate,
            device_name=cfg.device_name,
            pixel_format=cfg.pixel_format,
            backend=backend,
            backend_options=backend_options,
            sysfs_root=sysfs_root,
        )
    path = file_target(target)
    if path is not None:
        return FileOutput(path, width, height, rate, timing=file_timing, chroma=getattr(cfg, "chroma", "420"))
    if low == "window":
        return WindowOutput(width, height, rate)
    if low == "null":
        return NullOutput(width, height, rate)
    raise OutputError(f"unknown output {target!r}", hint=f"use one of: {TARGET_FORMS}")


__all__ = [
    "FileOutput",
    "NullOutput",
    "Output",
    "VirtualCamOutput",
    "WindowOutput",
    "even_size",
    "file_target",
    "gui_available",
    "open_output",
    "prepare",
]
