"""Pause and resume, per stream (``vcam ctl pause``/``resume``, the OBS source ``FastSwap: Pause``
and custom event, the panel's button): what the frame loop does when a stream's
:class:`~vcam.state.RuntimeState` asks for it.

Paused, the stream's capture thread is stopped, which closes its source: a camera is released (its
light goes off); a file, the demo or the pattern is simply no longer read. The virtual camera keeps
getting frames, so the apps that read it keep the device: a still card (the last published frame in
coarse, dimmed blocks with "paused" written on it: never the camera as it is), :data:`CARD_FPS`
times a second. The models, the pipelines and the other streams go on as they were. A stream that
keeps every frame of its input (a file converted, ``--fast``) is never paused (one warning).

Resume opens the input again (``Source.reopen``, its frames numbered on from before), starts a new
capture thread with the stream's capture stage, forgets the tracks of before the pause
(:meth:`vcam.pipeline.pipeline.Pipeline.restart`: the first frame is detected afresh), and the next
round swaps its first frame. Closing and opening run on a short-lived thread of their own (a
camera's driver may take a while either way), so the frame loop, and every other stream, never
waits for them; the frame loop adopts the new capture between two rounds. A resume that cannot
open the input (the camera unplugged meanwhile) logs one error line and leaves the stream paused.

Everything here runs on the frame loop's thread (:meth:`Pauses.tick`, once per loop turn), except
the closing and opening of the captures.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from vcam.errors import InputError, VcamError

if TYPE_CHECKING:
    from vcam.runtime.rounds import Rounds, Stream
    from vcam.stages.capture import CaptureThread
    from vcam.stages.sources import Source

log = logging.getLogger(__name__)

#: Still cards a second while paused: few enough to cost nothing, enough for apps that treat a
#: camera sending nothing for a second or two as gone.
CARD_FPS = 5.0


class Pauses:
    """The pause state of every stream of one daemon's :class:`~vcam.runtime.rounds.Rounds` (see the
    module docstring). A reopened source and capture thread replace the closed ones in their
    stream, where the daemon's shutdown finds them (:meth:`vcam.runtime.opened.Opened.add_current`)."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds
        self._lock = threading.Lock()
        self._work: dict[str, threading.Thread] = {}  # stream -> its last closing or opening thread
        self._opened: dict[str, tuple[Any, Any, BaseException | None]] = {}  # stream -> (source, capture, error)
        self._cards: dict[str, tuple[Any, float]] = {}  # stream -> (card data, when it last went out)
        self._resumed: dict[str, float] = {}  # stream -> when its resume was asked for (perf_counter)
        self._watched: set[int] = set()
        self._refused: set[str] = set()  # streams told they cannot pause
        #: (stream, seconds from the resume asked for to the capture adopted), the last resumes.
        self.resumes: list[tuple[str, float]] = []

    def watch(self) -> None:
        """Wake the frame loop on every state change (a pause or resume is seen at once, not at the
        next frame or the end of an idle wait)."""
        wake = self.rounds.wake
        for st in self.rounds.streams:
            if id(st.state) not in self._watched:
                self._watched.add(id(st.state))
                st.state.subscribe(lambda _snap: wake.set())

    # -- the frame loop ---------------------------------------------------------------------------
    def tick(self) -> None:
        """Between two rounds: start the pauses and resumes asked for, adopt the captures opened
        again, and publish the cards that are due."""
        now = time.perf_counter()
        for st in self.rounds.streams:
            if st.cap is None or st.done:
                continue
            want = st.state.paused
            if not want and not st.paused:  # the common case, every round: running and to keep running
                continue
            busy = self._busy(st)
            if want and not st.paused and st.delivery is not None and st.delivery.lossless:
                if st.name not in self._refused:  # a file converted: reopened, it would start again
                    self._refused.add(st.name)
                    log.warning("stream %s keeps every frame of its input (a conversion): it is not paused", st.name)
                continue
            if want and not st.paused and not busy:
                self._pause(st)
            elif not want and st.paused and not busy and st.name not in self._opened:
                self._open(st, now)
            with self._lock:
                opened = self._opened.pop(st.name, None)
            if opened is not None:
                self._adopt(st, *opened)
            if st.paused:
                self._card(st, now)

    def timeout(self, limit: float) -> float:
        """How long the frame loop may wait for frames: ``limit``, or less when a card is due sooner."""
        if not self._cards:
            return limit
        due = min(t for _, t in self._cards.values()) + 1.0 / CARD_FPS - time.perf_counter()
        return max(0.0, min(limit, due))

    @property
    def any_paused(self) -> bool:
        return any(st.paused for st in self.rounds.streams)

    def close(self) -> None:
        """At shutdown: wait for the closing and opening under way; a capture opened for a resume
        that never came to be adopted is stopped (its camera closed)."""
        for thread in list(self._work.values()):
            thread.join(5.0)
        with self._lock:
            opened, self._opened = list(self._opened.values()), {}
        for _source, cap, _error in opened:
            if cap is not None:
                cap.stop()

    # -- pause --------------------------------------------------------------------------------------
    def _busy(self, st: Stream) -> bool:
        work = self._work.get(st.name)
        return work is not None and work.is_alive()

    def _pause(self, st: Stream) -> None:
        cap = st.cap
        assert cap is not None and st.output is not None
        st.paused = True
        self._cards[st.name] = (still_card(st.shown, st.output), 0.0)
        self._start(st, cap.stop, "close")  # joins the capture thread, which closes the source
        log.info("stream %s paused: its input is closed, a still card goes out", st.name)

    def _card(self, st: Stream, now: float) -> None:
        data, last = self._cards[st.name]
        if now - last < 1.0 / CARD_FPS:
            return
        assert st.output is not None
        st.output.send(data)
        self._cards[st.name] = (data, now)
        if self.rounds.tap is not None:  # the panel's preview shows the card too (no before beside it)
            st.shown_seq = -1
            self.rounds.tap(st, data)
        if self.rounds.record is not None:  # and a recording holds it (and hears of a stop)
            self.rounds.record(st, data)

    # -- resume -------------------------------------------------------------------------------------
    def _open(self, st: Stream, now: float) -> None:
        source, cap = st.source, st.cap
        assert source is not None and cap is not None
        self._resumed[st.name] = now

        def open_again() -> None:
            try:
                reopen = getattr(source, "reopen", None)
                if reopen is None:
                    raise InputError(f"its input {source!r} cannot be opened again", hint="restart `vcam run` to use it again")
                new = reopen()
                opened = (new, self._capture(st, new, cap), None)
            except BaseException as exc:  # said on the frame loop (_adopt); the stream stays paused
                opened = (None, None, exc)
            with self._lock:
                self._opened[st.name] = opened
            self.rounds.wake.set()

        self._start(st, open_again, "open")

    def _capture(self, st: Stream, source: Source, before: CaptureThread) -> CaptureThread:
        """A capture thread for ``source`` like ``before`` (its counts carried on), started."""
        from vcam.stages.capture import CaptureThread

        cap = CaptureThread(
            source, lossless=before.lossless, name=before.name, wake=self.rounds.wake, stage=st.stage, target=st.target
        )
        cap.delivered, cap.taken, cap.dropped, cap.corrupt = before.delivered, before.taken, before.dropped, before.corrupt
        return cap.start()

    def _adopt(self, st: Stream, source: Any, cap: Any, error: BaseException | None) -> None:
        asked = self._resumed.pop(st.name, None)
        if error is not None:
            text = str(error) if isinstance(error, VcamError) else f"{type(error).__name__}: {error}"
            log.error("stream %s stays paused: %s", st.name, text)
            st.state.set_paused(True)
            return
        st.source, st.cap = source, cap  # shutdown closes these in the old ones' place
        cap.stage, cap.target = st.stage, st.target  # an early swap may have switched them meanwhile
        if st.pipeline is not None:
            st.pipeline.restart()
        st.paused = False
        self._cards.pop(st.name, None)
        if asked is not None:
            self.resumes = [*self.resumes[-99:], (st.name, time.perf_counter() - asked)]
        log.info("stream %s resumed", st.name)

    def _start(self, st: Stream, fn: Any, what: str) -> None:
        before = self._work.get(st.name)

        def run() -> None:
            if before is not None:  # a camera is closed before it is opened again
                before.join()
            fn()

        thread = threading.Thread(target=run, name=f"vcam-{what}-{st.name}", daemon=True)
        self._work[st.name] = thread
        thread.start()


def still_card(shown: Any, output: Any) -> Any:
    """The paused card in ``output``'s format and size: ``shown`` (the last frame published, in that
    format; None: a plain dark card) in coarse dimmed blocks, "paused" written across the middle."""
    import cv2
    import numpy as np

    from vcam.kernels.convert import from_bgr_cv, to_bgr_cv
    from vcam.runtime.rounds import pixelate

    w, h = int(output.width), int(output.height)
    bgr = None
    if shown is not None:
        try:
            bgr = to_bgr_cv(np.asarray(shown), output.fmt, w, h)
        except (ValueError, TypeError):  # a format the host cannot read back: the plain card
            bgr = None
    if bgr is None:
        bgr = np.full((h, w, 3), 40, np.uint8)
    else:
        bgr = cv2.GaussianBlur(pixelate(bgr, 16), (0, 0), max(1.0, w / 64)) // 3
    text, font = "paused", cv2.FONT_HERSHEY_SIMPLEX
    scale = max(0.5, w / 400)
    thick = max(1, round(scale * 2))
    (tw, th), _ = cv2.getTextSize(text, font, scale, thick)
    cv2.putText(bgr, text, ((w - tw) // 2, (h + th) // 2), font, scale, (235, 235, 235), thick, cv2.LINE_AA)
    return from_bgr_cv(np.ascontiguousarray(bgr, dtype=np.uint8), output.fmt)
