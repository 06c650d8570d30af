"""The file output: frames encoded with PyAV into .mp4/.m4v/.mov/.mkv in order, at the input's rate
and size, written under a hidden partial name and renamed when complete; on a full disk or a
vanished folder the partial file is kept playable as ``NAME.partial.mp4`` (see the README's Files
section). :func:`~vcam.stages.publish.open_output` picks it for ``file:PATH``."""

from __future__ import annotations

import contextlib
import logging
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from vcam.errors import OutputError
from vcam.stages.outputs import (
    OutputBase,
    even_size,
    reason,
)
from vcam.types import PixelFormat

log = logging.getLogger("vcam.stages.publish")


class FileOutput(OutputBase):
    """A video file written with PyAV: H.264 (libx264) when available, else MPEG-4 Part 2.

    Takes BGR frames (``fmt`` BGR; PyAV's swscale converts them). ``chroma`` ``"420"`` (default):
    yuv420p, which every H.264 player decodes; an odd size is padded to even with the edge pixels
    (one line says so), since 4:2:0 has no odd sizes. ``"444"``: yuv444p (H.264 High 4:4:4) at the
    exact size, which many players (browsers, QuickTime, phones) cannot decode; the MPEG-4 fallback
    is always 4:2:0. :meth:`describe` names the codec, pixel format and size. The container follows the extension
    (``.mp4``, ``.m4v``, ``.mov``, ``.mkv``); any other extension is refused. MP4/MOV are written
    fragmented with a keyframe every second, so whatever was written before a failure plays.

    Safety: frames go to a hidden temporary file beside ``path``, created with the user's umask,
    which replaces ``path`` only when :meth:`close` finishes the file, so ``path`` never holds a
    partial file. An existing ``path`` is replaced only if it is itself a video. When writing fails
    (a full disk, a vanished folder) :meth:`send` raises one :class:`OutputError` line, and
    :meth:`close` keeps the frames written so far, playable, as ``<name>.partial<ext>`` beside
    ``path`` (``partial_path``); nothing hidden is left behind. With no frames written, close
    removes the temporary file and leaves ``path`` untouched.

    Cut short: ``close(complete=False)`` (a conversion stopped before the input's end) finishes the
    file but keeps it as ``partial_path``, never under ``path``; :meth:`salvage` (a forced exit,
    possibly in the middle of :meth:`close`) leaves whatever is on disk playable under ``path`` when
    the file was finished, else as ``partial_path``, never as the hidden temporary file.

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
        chroma: str = "420",
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
        if chroma not in ("420", "444"):
            raise ValueError(f"chroma must be '420' or '444', got {chroma!r}")
        self.chroma = chroma
        self._clock = clock or time.perf_counter
        self.fps = float(fps) if fps and fps > 0 else 30.0
        container_format = self._container_format()
        parent = self.path.parent
        self.partial_path = parent / f"{self.path.stem}.partial{self.path.suffix}"
        codec, pix_fmt = self._pick_codec(codecs or self.CODECS, preset)
        # The coded size: 4:2:0 needs even sides, so an odd frame is padded with its edge pixels.
        self.coded_width, self.coded_height = (
            (self.width, self.height) if pix_fmt == "yuv444p" else even_size(self.width + 1, self.height + 1)
        )
        self._pad = (self.coded_height - self.height, self.coded_width - self.width)
        if any(self._pad):
            log.warning(
                "%s: %dx%d is padded to %dx%d with the edge pixels for %s 4:2:0, which every player decodes "
                "([output] chroma = '444' keeps the exact size, for players that decode 4:4:4)",
                self.path.name,
                self.width,
                self.height,
                self.coded_width,
                self.coded_height,
                "H.264" if codec != "mpeg4" else "MPEG-4",
            )
        stream = self._open(container_format, codec, pix_fmt, preset, opener or _open_with_umask)
        self._stream, self.codec, self.pix_fmt = stream, codec, pix_fmt
        self._failed: str | None = None
        self._reported = False
        self._t0: float | None = None
        self._last_pts = -1
        self.cut_short = False  # stopped before the input's end: kept as partial_path, never path
        self._container_done = False  # the container is closed: the file is complete on disk
        self.kept: Path | None = None  # where the file went once closed (path, partial_path or nowhere)

    def _container_format(self) -> str:
        """The container :attr:`path` names, once it is known to be writable as a video: its folder
        there, not a folder itself, not another file (OutputError otherwise, nothing touched)."""
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
        return container_format

    def _open(self, container_format: str, codec: str, pix_fmt: str, preset: str, opener: Any) -> Any:
        """The encoder's stream on a hidden temporary file beside :attr:`path` (renamed at the close);
        nothing left behind where it cannot open, a stop signal included."""
        self._tmp = self.path.parent / f".{self.path.stem}.{os.getpid()}.{os.urandom(3).hex()}.partial{self.path.suffix}"
        try:
            self._file = opener(self._tmp)
        except OSError as exc:
            raise OutputError(
                f"cannot write {self.path}: {exc.strerror or exc}", hint="check the folder's permissions and free space"
            ) from None
        options = {"movflags": "frag_keyframe+empty_moov+default_base_moof"} if container_format in ("mp4", "mov") else {}
        rate = Fraction(self.fps).limit_denominator(1001)
        self._frame_tb = self._WALL_TB if self.timing == "wall" else 1 / rate
        try:
            self._container = self._av.open(self._file, mode="w", format=container_format, options=options)
            stream = self._container.add_stream(codec, rate=rate)
            stream.width, stream.height, stream.pix_fmt = self.coded_width, self.coded_height, pix_fmt
            stream.codec_context.time_base = self._frame_tb
            stream.options = self._codec_options(codec, preset)
            if codec == "mpeg4":
                stream.bit_rate = max(1_000_000, int(self.coded_width * self.coded_height * self.fps * 0.15))
            stream.codec_context.open()
        except BaseException as exc:  # a stop signal too: no hidden file left behind
            self._discard()
            if not isinstance(exc, Exception):
                raise
            raise OutputError(f"cannot write {self.path}: {exc}", hint="check the folder's permissions and free space") from exc
        return stream

    def _codec_options(self, codec: str, preset: str) -> dict[str, str]:
        keyint = str(max(1, round(self.fps)))  # a keyframe (and an MP4 fragment) every second
        if codec == "libx264":
            return {"preset": preset, "crf": "20", "g": keyint, "bf": "0"}  # no B-frames: fragments start at 0
        return {"g": keyint}

    def _pick_codec(self, names: tuple[str, ...], preset: str) -> tuple[str, str]:
        """The first encoder that opens for this size here, and its pixel format."""
        errors = []
        for name in names:
            pix = "yuv444p" if self.chroma == "444" and name in ("libx264", "h264") else "yuv420p"
            try:
                ctx = self._av.CodecContext.create(name, "w")
                w, h = (self.width, self.height) if pix == "yuv444p" else even_size(self.width + 1, self.height + 1)
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
        if any(self._pad):
            a = cv2.copyMakeBorder(a, 0, self._pad[0], 0, self._pad[1], cv2.BORDER_REPLICATE)
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
            self._failed = reason(exc)
            self._reported = True
            kept = self._finish()  # at once: the message says what was really kept
            where = f"what was written before it is kept, playable, in {kept}" if kept else "nothing playable could be kept"
            raise OutputError(
                f"writing {self.path} failed: {self._failed}", hint=f"free space or fix the folder, then run again; {where}"
            ) from None
        self.frames += 1

    def describe(self) -> str:
        """``out.mp4: H.264 (libx264) yuv420p 642x362 (padded from 641x361), 30 fps``."""
        name = {"libx264": "H.264 (libx264)", "h264": "H.264", "mpeg4": "MPEG-4 Part 2"}.get(self.codec, self.codec)
        padded = f" (padded from {self.width}x{self.height})" if any(self._pad) else ""
        return f"{self.path.name}: {name} {self.pix_fmt} {self.coded_width}x{self.coded_height}{padded}, {self.fps:g} fps"

    def close(self, complete: bool = True) -> None:
        """Finish the file and move it to ``path``; after a failure, or when ``complete`` is False
        (cut short), keep what was written as ``partial_path``. Idempotent; raises OutputError
        when finishing fails."""
        if self._closed:
            return
        self.cut_short = self.cut_short or not complete
        if self.frames and not self._failed:
            try:  # the encoder's delayed frames; never after a failed write (a second mux can crash FFmpeg)
                for packet in self._stream.encode(None):
                    self._container.mux(packet)
            except Exception as exc:
                self._failed = reason(exc)
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
            self._failed = self._failed or reason(exc)
        try:
            self._file.close()
        except OSError as exc:
            self._failed = self._failed or reason(exc)
        self._container_done = True
        self.kept = self._place()
        return self.kept

    def _place(self) -> Path | None:
        """The closed temporary file to ``path`` (complete), ``partial_path`` (failed, cut short),
        or removed (no frames, nothing playable)."""
        if not self.frames:
            self._discard()
            if not self._failed:
                log.warning("no frames were written; %s left untouched", self.path)
            return None
        broken = bool(self._failed) or not self._container_done  # cut off mid-write
        if broken and self._tmp.suffix.lower() in (".mp4", ".m4v", ".mov"):
            _trim_to_whole_fragments(self._tmp)
        if (broken or self.cut_short) and not _is_video(self._tmp, playable=True):
            self._discard()  # the failure came before anything playable reached the disk
            return None
        target = self.partial_path if broken or self.cut_short else self.path
        try:
            self._move(target)
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

    def _move(self, target: Path) -> None:
        """The temporary file to ``target``. Windows renames no open file, and a forced exit's
        :meth:`salvage` leaves it open (a writer may still hold it): there it is closed first."""
        try:
            os.replace(self._tmp, target)
        except PermissionError:
            if self._file.closed:
                raise
            self._file.close()
            os.replace(self._tmp, target)

    def salvage(self) -> Path | None:
        """On a forced exit (a second Ctrl-C), perhaps in the middle of :meth:`close`: leave no
        hidden temporary file. A finished file goes to ``path`` (``partial_path`` if cut short);
        one cut off mid-write is trimmed to its last whole fragment and kept as ``partial_path``
        when it plays. Never raises; returns where the file is."""
        try:
            if self.kept is not None or not self._tmp.exists():
                return self.kept
            if not self._container_done:
                self._closed = True
                try:
                    self._file.flush()
                except Exception:  # a write failure, or the file closed meanwhile: keep what is there
                    pass
            self.kept = self._place()
        except Exception as exc:  # a forced exit leaves whatever it can, never the hidden file
            log.warning("could not finish %s (%s): what was written goes to %s as it is", self.path, exc, self.partial_path.name)
            try:
                self._move(self.partial_path)  # closes the file first where an open one cannot move (Windows)
                self.kept = self.partial_path
            except Exception:  # as _place does when the move fails
                with contextlib.suppress(Exception):
                    self._discard()
        return self.kept

    def _discard(self) -> None:
        try:
            self._file.close()
        except Exception:  # already closed, or the failure we are cleaning up after
            pass
        self._tmp.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"FileOutput({self.path} {self.coded_width}x{self.coded_height} {self.pix_fmt} @ {self.fps:g})"


def _open_with_umask(path: Path) -> Any:
    """A new file opened for binary writing, its mode the user's umask applied to 0666."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    return os.fdopen(fd, "wb")


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
