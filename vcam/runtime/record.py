"""Recording from the desk: the published picture to a file while a stream's ``record`` setting is
on (`vcam ctl record on|off`, the panel's switch, ``{"vcam": {"record": "toggle"}}``).

Each start makes a new file in ``[output] record_dir`` (default: ~/Videos where it exists, else the
home folder), ``vcam-<stream>-<date>-<time>.mp4``, never over an existing one; a stop finishes it
(:class:`vcam.stages.recording.FileOutput`: written to a temporary name, moved in place when
complete). The frame loop only converts the published frame to BGR (a copy) and queues it; a writer
thread per file encodes. When the writer falls :data:`QUEUE` frames behind, frames are dropped
(counted, said at the stop) rather than the frame loop waiting. A file that cannot be opened is one
error line and the setting goes back off. What a recording holds is what was published: the swapped
picture (or the pause card), never the camera's own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

QUEUE = 32  # frames a writer may fall behind before frames are dropped


def default_folder(record_dir: str) -> Path:
    """``[output] record_dir``, or ~/Videos where it exists, else the home folder."""
    if record_dir:
        return Path(record_dir).expanduser()
    videos = Path.home() / "Videos"
    return videos if videos.is_dir() else Path.home()


class _File:
    """One recording: its file output and the writer thread that feeds it."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.dropped = 0
        self.queue: queue.Queue = queue.Queue(QUEUE)
        self.thread = threading.Thread(target=self._write, name="vcam-record", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        while (frame := self.queue.get()) is not None:
            try:
                self.out.send(frame)
            except Exception as exc:
                log.error("recording stopped: %s", exc)
                return
        try:
            self.out.close()
            log.info("recording saved: %s (%d frames%s)", self.out.path, self.out.frames, self._dropped_text())
        except Exception as exc:
            log.error("recording %s could not be finished: %s", self.out.path, exc)

    def _dropped_text(self) -> str:
        return f", {self.dropped} dropped: the writer fell behind" if self.dropped else ""

    def put(self, frame: Any) -> None:
        try:
            self.queue.put_nowait(frame)
        except queue.Full:
            self.dropped += 1

    def finish(self, wait: float | None = None) -> None:
        """Finish the file on the writer thread (``wait``: seconds to wait for it)."""
        self.queue.put(None)
        if wait is not None:
            self.thread.join(wait)


class Recorder:
    """The recordings of one daemon's streams (see the module docstring). ``offer`` is called by
    the frame loop after each publish; ``stop()`` finishes every open file (at shutdown)."""

    def __init__(self, folder: Path, fps: float) -> None:
        self.folder = Path(folder)
        self.fps = float(fps)
        self.files: dict[str, _File] = {}
        self.done: list[Path] = []  # the files of the recordings stopped so far

    def offer(self, st: Any, data: Any) -> None:
        want = bool(st.state.snapshot().settings.get("record", False))
        rec = self.files.get(st.name)
        if want and rec is None:
            rec = self._start(st)
        elif not want and rec is not None:
            self._end(st.name)
            return
        if rec is not None:
            import numpy as np

            from vcam.kernels.convert import to_bgr_cv

            out = st.output
            rec.put(np.array(to_bgr_cv(np.asarray(data), out.fmt, int(out.width), int(out.height)), copy=True))

    def _start(self, st: Any) -> _File | None:
        from vcam.errors import VcamError
        from vcam.stages.recording import FileOutput

        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.folder / f"vcam-{st.name}-{stamp}.mp4"
        n = 2
        while path.exists():
            path, n = self.folder / f"vcam-{st.name}-{stamp}-{n}.mp4", n + 1
        try:
            out = FileOutput(path, int(st.output.width), int(st.output.height), self.fps)
        except (VcamError, OSError) as exc:
            log.error("cannot record to %s: %s", path, getattr(exc, "message", exc))
            st.state.set_setting("record", False)
            return None
        log.info("recording to %s", path)
        self.files[st.name] = rec = _File(out)
        return rec

    def _end(self, name: str, wait: float | None = None) -> None:
        rec = self.files.pop(name)
        rec.finish(wait)
        self.done.append(rec.out.path)

    def stop(self) -> None:
        for name in list(self.files):
            self._end(name, wait=10.0)

    close = stop
