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
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vcam import devices
from vcam.errors import OutputError
from vcam.kernels.convert import frame_shape, from_bgr_ref
from vcam.types import PixelFormat

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


TARGET_FORMS = "vcam, file:PATH (.mp4, .mkv, .mov), window, or null"
_VCAM_FORMATS = ("I420", "NV12", "RGB")


@runtime_checkable
class Output(Protocol):
    """A frame sink. ``send(data)`` takes ``fmt`` data for a ``width`` x ``height`` frame;
    ``close()`` is idempotent; outputs are context managers."""

    fmt: PixelFormat
    width: int
    height: int

    def send(self, data: Any) -> None: ...

    def send_bgr(self, frame: np.ndarray) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Output: ...

    def __exit__(self, *exc: object) -> None: ...


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


class _OutputBase:
    fmt: PixelFormat
    width: int
    height: int

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

    def close(self) -> None:
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not self.__dict__.get("_ready"):
            return  # __init__ failed and cleaned up after itself
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.width}x{self.height} {self.fmt.value})"


# --------------------------------------------------------------------------------------------------


class NullOutput(_OutputBase):
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


# --------------------------------------------------------------------------------------------------


class VirtualCamOutput(_OutputBase):
    """The virtual camera through the real ``pyvirtualcam.Camera``.

    Linux: the v4l2loopback device whose card label is ``device_name`` (found in sysfs); when none
    exists, :class:`OutputError` with the ``modprobe`` line as hint. Never another loopback device.
    Windows/macOS: pyvirtualcam's backends (OBS Virtual Camera, Unity Capture).

    ``pixel_format``: ``I420``, ``NV12`` or ``RGB``; ``auto`` opens with I420 and switches to the
    backend's native format (``Camera.native_fmt``) when that is NV12 or RGB, so the backend does not
    convert again. I420/NV12 need even sides: an odd ``width``/``height`` is cropped by one (see
    the module docstring). ``backend``/``backend_options`` pick a registered pyvirtualcam backend and
    its extra keyword arguments (tests register a capturing one).
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: float,
        *,
        device_name: str = devices.DEFAULT_LABEL,
        pixel_format: str = "auto",
        backend: str | None = None,
        backend_options: dict[str, Any] | None = None,
        sysfs_root: Path = devices.SYSFS_ROOT,
    ) -> None:
        super().__init__()
        import pyvirtualcam

        self._pvc = pyvirtualcam
        self._cam = None
        self.fps = float(fps)
        self.device_name = device_name
        self._backend = backend
        self._options = dict(backend_options or {})
        self._in_size = (int(width), int(height))
        if pixel_format not in ("auto", *_VCAM_FORMATS):
            raise OutputError(
                f"unsupported virtual camera pixel format {pixel_format!r}", hint=f"use auto, {', '.join(_VCAM_FORMATS)}"
            )
        self._device_arg: str | None = None
        self.device_path = ""
        if devices.is_linux() or Path(sysfs_root) != devices.SYSFS_ROOT:
            dev = devices.find_virtual_camera(device_name, sysfs_root)
            if dev is None:
                others = [d for d in devices.list_video_devices(sysfs_root) if d.is_loopback]
                note = ""
                if others:
                    listed = ", ".join(f'{d.path} "{d.name}"' for d in others)
                    note = (
                        f"; other loopback devices are left alone ({listed}); v4l2loopback is loaded, so remove it first "
                        "with `sudo modprobe -r v4l2loopback` or add a device with v4l2loopback-ctl"
                    )
                raise OutputError(
                    f'no virtual camera named "{device_name}" found{note}', hint=devices.modprobe_hint(device_name, sysfs_root)
                )
            self._device_arg = dev.path
        chosen = "I420" if pixel_format == "auto" else pixel_format
        self._open(chosen)
        if pixel_format == "auto":
            native = self._cam.native_fmt
            if native is not None and native.name in _VCAM_FORMATS and native.name != chosen:
                self._cam.close()
                self._open(native.name)
        self.device_path = self._cam.device
        self.backend_name = self._cam.backend
        self._ready = True

    def _open(self, fmt_name: str) -> None:
        fmt = PixelFormat(fmt_name)
        w, h = self._in_size
        if fmt in (PixelFormat.I420, PixelFormat.NV12):
            w, h = even_size(w, h)
        if self._backend is not None and self._backend not in self._pvc.camera.BACKENDS:
            raise OutputError(
                f"unknown pyvirtualcam backend {self._backend!r}",
                hint=f"use one of: {', '.join(self._pvc.camera.BACKENDS) or 'none installed'}",
            )
        attempts = [self._device_arg]
        if self._device_arg is None and self.device_name:  # Windows/macOS: the name, then the default
            attempts = [self.device_name, None]
        errors = []
        for device in attempts:
            try:
                self._cam = self._pvc.Camera(
                    w, h, self.fps, fmt=self._pvc.PixelFormat[fmt.value], device=device, backend=self._backend, **self._options
                )
                break
            except Exception as exc:  # pyvirtualcam raises RuntimeError listing every backend's failure
                errors.append(f"{device or 'default device'}: {' / '.join(str(exc).splitlines())}")
        else:
            hint = (
                devices.virtual_camera_hint(self.device_name)
                if self._device_arg is None
                else ("close other programs writing to it; v4l2loopback needs exclusive_caps=1 and a free device")
            )
            raise OutputError(f"could not open the virtual camera: {'; '.join(errors)}", hint=hint)
        self.fmt, self.width, self.height = fmt, w, h

    @property
    def native_fmt(self) -> PixelFormat | None:
        native = self._cam.native_fmt if self._cam is not None else None
        return PixelFormat(native.name) if native is not None and native.name in PixelFormat.__members__ else None

    def send(self, data: Any) -> None:
        if self._closed or self._cam is None:
            raise OutputError("the virtual camera is closed")
        a = self._check(data)
        try:
            self._cam.send(np.ascontiguousarray(a))
        except (ValueError, TypeError):
            raise
        except Exception as exc:
            raise OutputError(
                f"writing to the virtual camera {self.device_path} failed: {exc}", hint="was the device removed? restart vcam"
            ) from exc
        self.frames += 1

    def close(self) -> None:
        if not self._closed and self._cam is not None:
            try:
                self._cam.close()
            finally:
                self._cam = None
        super().close()

    def __repr__(self) -> str:
        return f"VirtualCamOutput({self.device_path} {self.width}x{self.height} {self.fmt.value} @ {self.fps:g})"


# --------------------------------------------------------------------------------------------------


class FileOutput(_OutputBase):
    """A video file written with PyAV: H.264 (libx264) when available, else MPEG-4 Part 2.

    Takes BGR frames (``fmt`` BGR; PyAV's swscale converts them). The file keeps the frame's size:
    even sizes are yuv420p (plays everywhere), odd ones yuv444p (H.264 High 4:4:4, exact size; the
    MPEG-4 fallback crops them to even with a warning). The container follows the extension
    (``.mp4``, ``.m4v``, ``.mov``, ``.mkv``); any other extension is refused. MP4/MOV are written
    fragmented with a keyframe every second, so whatever was written before a failure plays.

    Safety: frames go to a hidden temporary file beside ``path``, created with the user's umask,
    which replaces ``path`` only when :meth:`close` finishes the file, so ``path`` never holds a
    partial file. An existing ``path`` is replaced only if it is itself a video. When writing fails
    (a full disk, a vanished folder) :meth:`send` raises one :class:`OutputError` line, and
    :meth:`close` keeps the frames written so far, playable, as ``<name>.partial<ext>`` beside
    ``path`` (``partial_path``); nothing hidden is left behind. With no frames written, close
    removes the temporary file and leaves ``path`` untouched.

    ``timing``: ``"wall"`` (default) stamps each frame with the time :meth:`send` was called, so a
    live recording plays at real speed even when frames were dropped; ``"frames"`` stamps frame
    ``i`` at ``i / fps`` (every frame of a file, at its rate). ``preset``: libx264's speed/size
    trade-off. ``opener(path)``: opens the temporary file for binary writing (default: with the
    umask); tests inject write failures through it.
    """

    CODECS = ("libx264", "h264", "mpeg4")
    CONTAINERS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska"}
    _WALL_TB = Fraction(1, 1000)

    def __init__(
        self,
        path: str | Path,
        width: int,
        height: int,
        fps: float,
        *,
        codecs: tuple[str, ...] | None = None,
        preset: str = "superfast",
        timing: str = "wall",
        clock: Any = None,
        opener: Any = None,
    ) -> None:
        super().__init__()
        import time

        import av

        self._av = av
        self.path = Path(path).expanduser()
        self.fmt = PixelFormat.BGR
        self.width, self.height = int(width), int(height)
        if self.width < 2 or self.height < 2:
            raise OutputError(f"frame size {width}x{height} is too small for a video file", hint="use a larger input")
        if timing not in ("wall", "frames"):
            raise ValueError(f"timing must be 'wall' or 'frames', got {timing!r}")
        self.timing = timing
        self._clock = clock or time.perf_counter
        self.fps = float(fps) if fps and fps > 0 else 30.0
        suffix = self.path.suffix.lower()
        container_format = self.CONTAINERS.get(suffix)
        if container_format is None:
            raise OutputError(
                f"cannot write a video to {self.path.name}: {suffix or 'no extension'} is not a video container",
                hint="name the file .mp4 (or .mkv, .mov, .m4v)",
            )
        parent = self.path.parent
        if not parent.is_dir():
            raise OutputError(
                f"folder {parent} does not exist", hint=f"create it first (mkdir -p {parent}) or write to another path"
            )
        if self.path.is_dir():
            raise OutputError(f"{self.path} is a folder", hint="give a file name such as file:out.mp4")
        if self.path.exists() and not _is_video(self.path):
            raise OutputError(
                f"{self.path} exists and is not a video; refusing to overwrite it",
                hint="choose another file name or move that file away",
            )
        self.partial_path = parent / f"{self.path.stem}.partial{self.path.suffix}"
        codec, pix_fmt = self._pick_codec(codecs or self.CODECS, preset)
        if pix_fmt == "yuv420p" and (self.width % 2 or self.height % 2):
            log.warning(
                "%s: %s cannot encode %dx%d; the file is cropped to even %dx%d",
                self.path.name,
                codec,
                self.width,
                self.height,
                self.width - self.width % 2,
                self.height - self.height % 2,
            )
            self.width, self.height = even_size(self.width, self.height)
        self._tmp = parent / f".{self.path.stem}.{os.getpid()}.{os.urandom(3).hex()}.partial{self.path.suffix}"
        try:
            self._file = (opener or _open_with_umask)(self._tmp)
        except OSError as exc:
            raise OutputError(
                f"cannot write {self.path}: {exc.strerror or exc}", hint="check the folder's permissions and free space"
            ) from None
        options = {"movflags": "frag_keyframe+empty_moov+default_base_moof"} if container_format in ("mp4", "mov") else {}
        rate = Fraction(self.fps).limit_denominator(1001)
        self._frame_tb = self._WALL_TB if timing == "wall" else 1 / rate
        try:
            self._container = av.open(self._file, mode="w", format=container_format, options=options)
            stream = self._container.add_stream(codec, rate=rate)
            stream.width, stream.height, stream.pix_fmt = self.width, self.height, pix_fmt
            stream.codec_context.time_base = self._frame_tb
            stream.options = self._codec_options(codec, preset)
            if codec == "mpeg4":
                stream.bit_rate = max(1_000_000, int(self.width * self.height * self.fps * 0.15))
            stream.codec_context.open()
        except Exception as exc:
            self._discard()
            raise OutputError(f"cannot write {self.path}: {exc}", hint="check the folder's permissions and free space") from exc
        self._stream, self.codec, self.pix_fmt = stream, codec, pix_fmt
        self._failed: str | None = None
        self._reported = False
        self._t0: float | None = None
        self._last_pts = -1

    def _codec_options(self, codec: str, preset: str) -> dict[str, str]:
        keyint = str(max(1, round(self.fps)))  # a keyframe (and an MP4 fragment) every second
        if codec == "libx264":
            return {"preset": preset, "crf": "20", "g": keyint, "bf": "0"}  # no B-frames: fragments start at 0
        return {"g": keyint}

    def _pick_codec(self, names: tuple[str, ...], preset: str) -> tuple[str, str]:
        """The first encoder that opens for this size here, and its pixel format."""
        odd = self.width % 2 or self.height % 2
        errors = []
        for name in names:
            pix = "yuv444p" if odd and name in ("libx264", "h264") else "yuv420p"
            try:
                ctx = self._av.CodecContext.create(name, "w")
                w, h = (self.width, self.height) if pix == "yuv444p" else even_size(self.width, self.height)
                ctx.width, ctx.height, ctx.pix_fmt = w, h, pix
                ctx.time_base = Fraction(1, 30)
                ctx.options = self._codec_options(name, preset)
                ctx.open()
                del ctx  # only a probe: the stream opens its own
                return name, pix
            except Exception as exc:  # unknown here, or listed but not usable in this FFmpeg build
                errors.append(f"{name}: {exc}")
        raise OutputError(
            f"no usable video encoder for {self.path} ({'; '.join(errors)})",
            hint="install a PyAV build with libx264 (pip install av)",
        )

    def send(self, data: Any) -> None:
        if self._failed:
            raise OutputError(f"writing {self.path} failed earlier: {self._failed}")
        if self._closed:
            raise OutputError(f"the file output {self.path} is closed")
        a = self._check(data)
        vf = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(a), format="bgr24")
        if self.timing == "wall":
            now = self._clock()
            if self._t0 is None:
                self._t0 = now
            pts = max(self._last_pts + 1, round((now - self._t0) / self._frame_tb))
        else:
            pts = self.frames
        vf.pts = self._last_pts = int(pts)
        vf.time_base = self._frame_tb
        try:
            for packet in self._stream.encode(vf):
                self._container.mux(packet)
        except Exception as exc:
            self._failed = _reason(exc)
            self._reported = True
            kept = self._finish()  # at once: the message says what was really kept
            where = f"what was written before it is kept, playable, in {kept}" if kept else "nothing playable could be kept"
            raise OutputError(
                f"writing {self.path} failed: {self._failed}", hint=f"free space or fix the folder, then run again; {where}"
            ) from None
        self.frames += 1

    def close(self) -> None:
        """Finish the file and move it to ``path``; after a failure keep what was written as
        ``partial_path``. Idempotent; raises OutputError when finishing fails."""
        if self._closed:
            return
        if self.frames and not self._failed:
            try:  # the encoder's delayed frames; never after a failed write (a second mux can crash FFmpeg)
                for packet in self._stream.encode(None):
                    self._container.mux(packet)
            except Exception as exc:
                self._failed = _reason(exc)
        kept = self._finish()
        if self._failed and not self._reported:
            self._reported = True
            where = f"what was written is kept, playable, in {kept}" if kept else "nothing playable could be kept"
            raise OutputError(
                f"writing {self.path} failed: {self._failed}", hint=f"free space or fix the folder, then run again; {where}"
            )

    def _finish(self) -> Path | None:
        """Close the container and the file; move the file to ``path`` (or, after a failure, to
        ``partial_path`` when it holds a playable frame, else remove it). Returns where it went."""
        self._closed = True
        try:
            self._container.close()
        except Exception as exc:
            self._failed = self._failed or _reason(exc)
        try:
            self._file.close()
        except OSError as exc:
            self._failed = self._failed or _reason(exc)
        if not self.frames:
            self._discard()
            if not self._failed:
                log.warning("no frames were written; %s left untouched", self.path)
            return None
        if self._failed and self._tmp.suffix.lower() in (".mp4", ".m4v", ".mov"):
            _trim_to_whole_fragments(self._tmp)
        if self._failed and not _is_video(self._tmp, playable=True):
            self._discard()  # the failure came before anything playable reached the disk
            return None
        target = self.partial_path if self._failed else self.path
        try:
            os.replace(self._tmp, target)
        except OSError as exc:
            self._discard()
            self._failed = self._failed or (exc.strerror or str(exc))
            if not self._reported:
                self._reported = True
                raise OutputError(
                    f"cannot finish {self.path}: {exc.strerror or exc}",
                    hint="the folder was removed or is not writable; nothing could be kept",
                ) from None
            return None
        return target

    def _discard(self) -> None:
        try:
            self._file.close()
        except Exception:  # already closed, or the failure we are cleaning up after
            pass
        self._tmp.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"FileOutput({self.path} {self.width}x{self.height} {self.pix_fmt} @ {self.fps:g})"


def _open_with_umask(path: Path) -> Any:
    """A new file opened for binary writing, its mode the user's umask applied to 0666."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    return os.fdopen(fd, "wb")


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc).strip() or type(exc).__name__


def file_target(target: str) -> Path | None:
    """The path of a ``file:PATH`` output target (``[output] target``), else None; OutputError for
    ``file:`` without a path."""
    spec = (target or "").strip()
    if not spec.lower().startswith("file:"):
        return None
    if not spec[5:].strip():
        raise OutputError("file: needs a path", hint="use --output file:out.mp4")
    return Path(spec[5:].strip()).expanduser()


def refuse_overwriting_input(target: str, input_spec: str) -> None:
    """OutputError when a ``file:`` target is the input file itself (after resolving links), which
    writing the output would destroy."""
    out = file_target(target)
    src = Path((input_spec or "").strip()).expanduser()
    try:
        same = out is not None and src.is_file() and out.exists() and os.path.samefile(src, out)
    except OSError:
        same = False
    if same:
        raise OutputError(
            f"the output {out} is the input video; writing it would destroy it",
            hint="write to another file, e.g. --output file:swapped.mp4",
        )


def _trim_to_whole_fragments(path: Path) -> None:
    """Cut a fragmented MP4 cut short by a failed write back to its last complete fragment, so every
    frame left in it decodes. Walks the top-level boxes (32-bit size, or 64-bit when the size is 1)."""
    try:
        with open(path, "r+b") as fh:
            total = os.fstat(fh.fileno()).st_size
            pos = good = 0
            while pos + 8 <= total:
                fh.seek(pos)
                head = fh.read(16)
                size, kind = int.from_bytes(head[:4], "big"), head[4:8]
                if size == 1 and len(head) == 16:
                    size = int.from_bytes(head[8:16], "big")
                if size < 8 or pos + size > total:
                    break  # the box the failure cut short
                pos += size
                if kind in (b"moov", b"mdat", b"mfra"):
                    good = pos  # the header, or a fragment's samples, complete up to here
            if good < total:
                fh.truncate(good)
    except OSError as exc:
        log.warning("could not trim %s to its last whole fragment: %s", path, exc)


def _is_video(path: Path, *, playable: bool = False) -> bool:
    """True when PyAV opens ``path`` as a container with a video stream; with ``playable``, only if
    its first frame also decodes (what a partial file must offer)."""
    import av

    try:
        with av.open(str(path)) as c:
            if not playable:
                return bool(c.streams.video)
            return next(c.decode(video=0), None) is not None
    except Exception:
        return False


# --------------------------------------------------------------------------------------------------


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


class WindowOutput(_OutputBase):
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
        return FileOutput(path, width, height, rate, timing=file_timing)
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
