"""Camera selection, per stream (``vcam ctl camera list|set N``, the panel's camera list, the OBS
custom event ``{"vcam": {"camera": N}}``): the stream's input switched while it runs.

The cameras come from :func:`vcam.devices.list_cameras`, the platform's enumeration (Linux: sysfs,
``/dev/videoN``, nothing opened; Windows and macOS: the capture API's indices, probed only when the
list is asked for again, since a probe opens each camera); a test gives its own lister. A camera
is known by N, its number in ``vcam devices`` (``[capture] input = "webcam:N"``). The run's own input is
always among the choices: its camera, or, for a file, the demo or the pattern, ``-1``.

A switch runs in the control thread that asked for it (the local socket's loader thread, the
panel's worker, OBS's event thread), never in the frame loop: the new camera is opened there and
checked against the running stream (the same size and pixel format: the pipeline, the output and
the capture stage were built for those), then handed to the frame loop, which adopts it between two
rounds (:meth:`Cameras.tick`): a capture thread on the new source takes the old one's place, the old
thread is stopped on a short-lived thread of its own (its camera closed, the frame loop never
waiting for a driver), and the pipeline forgets its tracks (:meth:`vcam.pipeline.pipeline.Pipeline.restart`:
the first frame of the new camera is detected afresh and swapped, never a face swapped where it was
in the old picture). Frames keep the budget rule of every frame (:meth:`vcam.runtime.rounds.Rounds.publish`).
A camera that cannot be opened or does not fit is refused in one line (the control reply's error)
and the old camera goes on as it was; a paused stream is refused (resume it first).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vcam.errors import ControlError, InputError

if TYPE_CHECKING:
    from vcam.runtime.rounds import Rounds, Stream
    from vcam.stages.sources import Source

log = logging.getLogger(__name__)

#: The number of the run's own input where that is no camera (a file, the demo, the pattern).
OWN_INPUT = -1


@dataclass(frozen=True)
class CameraChoice:
    """One camera a stream may switch to: ``number`` (N of ``webcam:N``, as ``vcam devices`` lists
    it), ``name`` (its label) and ``input`` (the ``[capture] input`` that opens it)."""

    number: int
    name: str
    input: str


#: ``lister(refresh)``: the cameras of the machine (``refresh``: look again, probing where listing
#: needs that: slow).
Lister = Callable[[bool], list[CameraChoice]]


def system_cameras(refresh: bool, *, sysfs_root: Path | None = None) -> list[CameraChoice]:
    """The machine's cameras through the platform's enumeration (:func:`vcam.devices.list_cameras`):
    sysfs on Linux (``sysfs_root``: another tree, for tests); elsewhere the capture API's indices,
    probed only with ``refresh``."""
    from vcam import devices

    probe = refresh and not sys.platform.startswith("linux")
    found = devices.list_cameras(sysfs_root or devices.SYSFS_ROOT, probe=probe)
    return [CameraChoice(d.index, d.name, f"webcam:{d.index}") for d in found]


class Cameras:
    """The camera switches of every stream of one daemon's ``rounds`` (see the module docstring)."""

    def __init__(self, rounds: Rounds, lister: Lister | None = None) -> None:
        self.rounds = rounds
        self.lister: Lister = lister or system_cameras
        self._lock = threading.Lock()
        self._inputs: dict[str, CameraChoice] = {}  # stream -> the camera it runs on now (or its own input)
        self._own: dict[str, CameraChoice] = {}  # stream -> the input it was started on
        self._known: dict[str, list[CameraChoice]] = {}  # stream -> the choices last listed
        # stream -> (opened, its choice, when asked, the camera before), for the frame loop to adopt
        self._pending: dict[str, tuple[Source, CameraChoice, float, CameraChoice]] = {}
        self._stopping: list[threading.Thread] = []
        #: (stream, seconds from the switch asked for to the new camera adopted), the last switches.
        self.switches: list[tuple[str, float]] = []

    def offer(self, st: Stream) -> None:
        """Offer the ``camera`` setting on ``st``'s state (a live stream, at start-up)."""
        from vcam.stages.capture import parse_webcam_index

        spec = (st.cfg.capture.input or "").strip()
        try:
            number = parse_webcam_index(spec)
        except InputError:
            number = None
        own = CameraChoice(OWN_INPUT if number is None else number, spec if number is None else f"camera {number}", spec)
        self._own[st.name] = self._inputs[st.name] = own
        st.state.offer(
            "camera", own.number, choices=lambda refresh: self._choices(st, refresh), apply=lambda v: self.switch(st, v)
        )

    def _choices(self, st: Stream, refresh: bool) -> list[tuple[object, str]]:
        listed = {c.number: c for c in self.lister(refresh)}
        with self._lock:
            for c in (self._own[st.name], self._inputs[st.name]):  # the run's input, and the one in use
                listed.setdefault(c.number, c)
            ordered = sorted(listed.values(), key=lambda c: c.number)
            self._known[st.name] = ordered
        return [(c.number, c.name) for c in ordered]

    # -- a control thread ---------------------------------------------------------------------------
    def switch(self, st: Stream, number: object) -> None:
        """Open camera ``number`` for ``st`` and hand it to the frame loop. InputError (cannot be
        opened, or does not fit the stream) or ControlError (paused, another stream's camera); the
        old camera goes on either way."""
        with self._lock:
            choice = next((c for c in self._known.get(st.name, ()) if c.number == number), None)
            others = {n: c for n, c in self._inputs.items() if n != st.name}
        if choice is None:
            raise ControlError(f"no camera {number!r} in this run", hint="list them with `vcam ctl camera list`")
        if st.state.paused or st.paused:
            raise ControlError(f"stream {st.name} is paused", hint="resume it first (`vcam ctl resume`), then switch")
        taken = next((n for n, c in others.items() if c.input == choice.input and c.number != OWN_INPUT), None)
        if taken is not None:
            raise ControlError(f"camera {choice.number} is stream {taken}'s", hint="give each stream its own camera")
        asked = time.perf_counter()
        try:
            source = self._open(st, choice)
        except InputError as exc:  # the asker gets it in its reply; the daemon's log says it too
            log.warning("stream %s: %s; it stays on camera %s", st.name, exc.message, self._inputs[st.name].number)
            raise
        with self._lock:
            replaced = self._pending.pop(st.name, None)
            before = replaced[3] if replaced is not None else self._inputs[st.name]
            self._pending[st.name] = (source, choice, asked, before)
            self._inputs[st.name] = choice
        if replaced is not None:  # asked twice before the frame loop came round: the first never ran
            replaced[0].close()
        self.rounds.wake.set()
        log.info("stream %s: switching to camera %s (%s)", st.name, choice.number, choice.name)

    def _open(self, st: Stream, choice: CameraChoice) -> Source:
        from vcam.stages.capture import open_source

        what = f"camera {choice.number} ({choice.name})"
        try:
            source = open_source(replace(st.cfg.capture, input=choice.input), delivery=st.delivery, compressed=True)
        except InputError as exc:
            raise InputError(f"cannot switch to {what}: {exc.message}", hint=exc.hint) from None
        old = st.source
        assert old is not None
        got, runs = (source.width, source.height, source.fmt), (old.width, old.height, old.fmt)
        if got != runs:
            source.close()
            raise InputError(
                f"cannot switch to {what}: it gives {got[0]}x{got[1]} {got[2].value}, the stream runs at "
                f"{runs[0]}x{runs[1]} {runs[2].value}",
                hint=f"restart `vcam run` with --input {choice.input} to use it; the old camera goes on",
            )
        return source

    # -- the frame loop ---------------------------------------------------------------------------
    def tick(self) -> None:
        """Between two rounds: adopt the cameras opened for a switch."""
        if not self._pending:
            return
        for st in self.rounds.streams:
            with self._lock:
                pending = self._pending.pop(st.name, None)
            if pending is not None:
                self._adopt(st, *pending)

    def _adopt(self, st: Stream, source: Source, choice: CameraChoice, asked: float, before: CameraChoice) -> None:
        from vcam.stages.capture import CaptureThread

        old = st.cap
        if old is None or st.paused or st.done:  # paused meanwhile: the camera it had is what a resume opens
            source.close()
            with self._lock:
                self._inputs[st.name] = before
            st.state.offer("camera", before.number)
            log.error("stream %s: camera %s not used (the stream was paused meanwhile)", st.name, choice.number)
            return
        cap = CaptureThread(source, lossless=old.lossless, name=old.name, wake=self.rounds.wake, stage=st.stage, target=st.target)
        cap.delivered, cap.taken, cap.dropped, cap.corrupt = old.delivered, old.taken, old.dropped, old.corrupt
        stopping = threading.Thread(target=old.stop, name=f"vcam-close-{st.name}", daemon=True)
        stopping.start()  # the old camera closed off the frame loop
        self._stopping = [t for t in self._stopping if t.is_alive()] + [stopping]
        st.source, st.cap = source, cap.start()  # shutdown closes these in the old ones' place
        if st.pipeline is not None:
            st.pipeline.restart()
        self.switches = [*self.switches[-99:], (st.name, time.perf_counter() - asked)]
        log.info("stream %s: on camera %s (%s)", st.name, choice.number, choice.name)

    def close(self) -> None:
        """At shutdown: the old cameras being closed are waited for; one opened and never adopted is closed."""
        for thread in self._stopping:
            thread.join(5.0)
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for source, *_ in pending:
            source.close()


def offer_cameras(cameras: Cameras, streams: list[Any]) -> None:
    """Offer camera selection on each live stream (a file converted keeps its input)."""
    for st in streams:
        if not (st.delivery is not None and st.delivery.lossless):
            cameras.offer(st)
