"""Where finished frames go: the :class:`Output` protocol and its shared base, and the simple live
outputs (nothing, a preview window). :mod:`vcam.stages.virtualcam` publishes the virtual camera and
:mod:`vcam.stages.recording` writes files; :func:`vcam.stages.publish.open_output` picks one for a
target through the output registry."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vcam.errors import OutputError
from vcam.kernels.convert import frame_shape, from_bgr_ref
from vcam.types import Closing, PixelFormat


@runtime_checkable
class Output(Protocol):
    """A frame sink; :class:`OutputBase` gives every member but ``send`` a default. Obligations:

    - ``fmt``, ``width``, ``height``: what :meth:`send` takes (``fmt`` data of that size), fixed
      once the output is open; ``frames``: how many were sent.
    - ``send(data)``: one frame; ValueError for a wrong shape or dtype (with both shapes),
      :class:`~vcam.errors.OutputError` naming the fix when the sink fails or is closed.
      ``send_bgr(frame)``: the same from a BGR frame (:func:`prepare`).
    - ``close()``: idempotent, releases the sink; ``closed`` says whether it ran. Outputs are
      context managers that close on exit.
    - ``path``: the file it writes, None for a live output; ``kept``: where the file went once
      closed (``path``, a ``.partial`` name, or None: nothing kept); ``cut_short``: set by the
      runtime when the input stopped before its end (a file keeps it under its partial name).
    - ``describe()``: one line for the run's summary ('' when there is nothing to say);
      ``salvage()``: on a forced exit, leave what was written playable, returning where (None:
      nothing, or no file).
    - ``user_closed``: true once the user closed it (a preview window); the runtime stops then.
    """

    fmt: PixelFormat
    width: int
    height: int
    frames: int
    path: Path | None
    kept: Path | None
    cut_short: bool
    user_closed: bool

    @property
    def closed(self) -> bool: ...

    def send(self, data: Any) -> None: ...

    def send_bgr(self, frame: np.ndarray) -> None: ...

    def describe(self) -> str: ...

    def salvage(self) -> Path | None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Output: ...

    def __exit__(self, *exc: object) -> None: ...


def missing_members(obj: object) -> list[str]:
    """The members of :class:`Output` that ``obj`` lacks (``[]``: it can be given to the runtime).
    Subclass :class:`OutputBase` to get every member but ``send``."""
    names = [n for n in Output.__annotations__] + [
        "closed",
        "send",
        "send_bgr",
        "describe",
        "salvage",
        "close",
        "__enter__",
        "__exit__",
    ]
    return [n for n in names if not hasattr(obj, n)]


def even_size(width: int, height: int) -> tuple[int, int]:
    """The size a 4:2:0 output takes for a ``width`` x ``height`` input (odd sides lose one pixel)."""
    return width - (width % 2), height - (height % 2)


def prepare(output: Output, frame: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Crop a BGR ``(H, W, 3)`` frame to the output's size and convert it to the output's format."""
    h, w = frame.shape[:2]
    if (h, w) != (output.height, output.width):
        if h < output.height or w < output.width:
            raise ValueError(f"frame {w}x{h} is smaller than the output's {output.width}x{output.height}")
        frame = frame[: output.height, : output.width]
    if output.fmt is PixelFormat.BGR and out is None:
        return np.ascontiguousarray(frame)
    return from_bgr_ref(frame, output.fmt, out)


class OutputBase(Closing):
    """The defaults of :class:`Output`: a live output (no file), not closed by its user."""

    fmt: PixelFormat
    width: int
    height: int
    path: Path | None = None
    kept: Path | None = None
    cut_short = False
    user_closed = False

    def __init__(self) -> None:
        self.frames = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self, data: Any) -> np.ndarray:
        """``data`` as an array of the expected shape. A BGR/RGB frame one column and/or row larger
        (an odd input size on an even-size output) is cropped at the right/bottom edge."""
        a = np.asarray(data)
        want = frame_shape(self.fmt, self.width, self.height)
        if a.dtype != np.uint8:
            raise ValueError(f"unexpected frame dtype: {a.dtype} != uint8")
        if (
            len(want) == 3
            and a.ndim == 3
            and a.shape[2] == want[2]
            and 0 <= a.shape[0] - want[0] <= 1
            and 0 <= a.shape[1] - want[1] <= 1
        ):
            a = a[: want[0], : want[1]]
        if a.shape != want:
            raise ValueError(f"unexpected frame shape: {a.shape} != {want} ({self.fmt.value} {self.width}x{self.height})")
        return a

    def send(self, data: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def send_bgr(self, frame: np.ndarray) -> None:
        """Convenience: :func:`prepare` then :meth:`send`."""
        self.send(prepare(self, frame))

    def describe(self) -> str:
        """Nothing for the summary (a file output names its codec and size)."""
        return ""

    def salvage(self) -> Path | None:
        """Nothing to keep (a file output keeps its frames)."""
        return None

    def __del__(self) -> None:
        if not self.__dict__.get("_ready"):
            return  # __init__ failed and cleaned up after itself
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.width}x{self.height} {self.fmt.value})"


class NullOutput(OutputBase):
    """Discards frames and counts them (``frames``). ``fmt`` defaults to BGR; pass another format to
    include the output conversion in a benchmark."""

    def __init__(self, width: int, height: int, fps: float = 30.0, *, fmt: PixelFormat = PixelFormat.BGR) -> None:
        super().__init__()
        self.fmt = PixelFormat(fmt)
        self.width, self.height = (
            even_size(width, height) if self.fmt in (PixelFormat.I420, PixelFormat.NV12) else (width, height)
        )
        self.fps = fps
        self._ready = True

    def send(self, data: Any) -> None:
        if self._closed:
            raise OutputError("the null output is closed")
        self._check(data)
        self.frames += 1


class ObsSourceOutput(NullOutput):
    """``--output obs-source``: no virtual camera; the frames reach OBS through the direct OBS
    source, which the panel's server serves from the frames the runtime offers it after each send
    (:mod:`vcam.panel.source`). BGR, the size given; counts frames."""

    def describe(self) -> str:
        return f"{self.frames} frames to the OBS source (a Browser Source; `vcam obs setup` adds it)"


def reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc).strip() or type(exc).__name__


def gui_available() -> tuple[bool, str]:
    """Whether ``cv2.imshow`` can open a window here, and if not why."""
    import cv2

    info = cv2.getBuildInformation()
    gui = ""
    for line in info.splitlines():
        if line.strip().startswith("GUI:"):
            gui = line.split(":", 1)[1].strip()
            break
    if not gui or gui.upper() == "NONE":
        return False, "this OpenCV build has no GUI support (opencv-python-headless)"
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return False, "no display (DISPLAY/WAYLAND_DISPLAY is not set)"
    return True, gui


class WindowOutput(OutputBase):
    """A preview window (``cv2.imshow``), BGR. ``user_closed`` becomes true when the user presses
    q or Esc or closes the window; the daemon may treat that as a stop request."""

    def __init__(self, width: int, height: int, fps: float = 30.0, *, title: str = "FastSwap Cam") -> None:
        super().__init__()
        ok, why = gui_available()
        if not ok:
            raise OutputError(f"cannot open a preview window: {why}", hint="use --output file:out.mp4 or --output vcam instead")
        import cv2

        self._cv2 = cv2
        self.fmt = PixelFormat.BGR
        self.width, self.height, self.fps = width, height, fps
        self.title = title
        self.user_closed = False
        try:
            cv2.namedWindow(title, cv2.WINDOW_NORMAL)
            cv2.resizeWindow(title, width, height)
        except cv2.error as exc:
            raise OutputError(
                f"cannot open a preview window: {exc}", hint="use --output file:out.mp4 or --output vcam instead"
            ) from exc
        self._shown = False
        self._ready = True

    def send(self, data: Any) -> None:
        if self._closed:
            raise OutputError("the preview window is closed")
        a = self._check(data)
        cv2 = self._cv2
        cv2.imshow(self.title, a)
        key = cv2.waitKey(1) & 0xFF
        if key in (ord("q"), 27):
            self.user_closed = True
        if self._shown:
            try:
                if cv2.getWindowProperty(self.title, cv2.WND_PROP_VISIBLE) < 1:
                    self.user_closed = True
            except cv2.error:
                self.user_closed = True
        self._shown = True
        self.frames += 1

    def close(self) -> None:
        if not self._closed:
            try:
                self._cv2.destroyWindow(self.title)
                self._cv2.waitKey(1)
            except Exception:  # already gone
                pass
        super().close()
