"""Audio kept in sync with the delayed video: OBS's audio sync offset of the ``[obs] audio_sync``
inputs follows vcam's measured video delay (``SetInputAudioSyncOffset``).

The figure is :attr:`vcam.state.Status.av_delay_ms`: the capture-to-publish p50 of the last couple of
seconds plus the camera's frame time. The offset (whole milliseconds, as OBS keeps it) is set at
once when audio sync starts (and after a reconnect), then again only when the figure has moved by
more than :data:`STEP_MS` from the offset set and :data:`INTERVAL_S` have passed since the last
setting: a jittery figure never makes the sound jump. While the stream is paused the offset stays.

Each input's own offset is read before vcam first sets it and put back when audio sync stops: vcam
exits, or the panel's switch (``{"audio_sync": false}``) turns it off. An input OBS does not have,
or one without audio, is named in one warning and tried again at the next setting; video and the
other inputs go on.

Runs on the OBS controller's worker thread (:class:`vcam.control.obs.ObsController`), with its
request client.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from vcam.control import short
from vcam.control.obs_scene import request_failed
from vcam.state import RuntimeState

log = logging.getLogger(__name__)

STEP_MS = 4.0  # the figure must move by more than this from the offset set before it is set again
INTERVAL_S = 3.0  # and at least this long after the last setting
CHECK_S = 0.5  # how often the figure is looked at
MIN_MS, MAX_MS = -950, 20000  # the offsets obs-websocket accepts


class ObsAudio:
    """The audio sync of one controller (see the module docstring); ``inputs``: the OBS input names
    (none: it does nothing)."""

    def __init__(
        self, inputs: tuple[str, ...] | list[str] = (), *, step_ms: float = STEP_MS, interval: float = INTERVAL_S
    ) -> None:
        self.inputs = tuple(dict.fromkeys(inputs))
        self.step_ms, self.interval = step_ms, interval
        self.originals: dict[str, int] = {}  # input -> its own offset, read before vcam first set it
        self.applied: dict[str, int] = {}  # input -> the offset vcam set there, over this connection
        self.offset: int | None = None  # the offset last set (ms)
        self.figure_ms: float | None = None  # the video delay it was set from
        self._held = False  # OBS may hold offsets of ours (not put back yet)
        self._last = float("-inf")  # when offsets were last set
        self._checked = float("-inf")
        self._warned: set[str] = set()

    def reconnected(self) -> None:
        """A new connection (OBS may have restarted): set the offsets again at the next check."""
        self.applied.clear()
        self._checked = self._last = float("-inf")

    def tick(self, req: Any, state: RuntimeState, now: float | None = None) -> None:
        """Look at the figure (every :data:`CHECK_S`) and set the offsets when due; with the switch
        off, put the inputs' own offsets back. OBS refusing one input is warned about; a lost
        connection raises (the controller reconnects)."""
        if not self.inputs:
            return
        now = time.monotonic() if now is None else now
        if now - self._checked < CHECK_S:
            return
        self._checked = now
        if not state.settings.get("audio_sync", True):
            self.restore(req)
            return
        st = state.read_status()
        if st.av_delay_ms <= 0 or st.paused:
            return
        if now - self._last < self.interval:  # never more often, whatever happens
            return
        want = min(MAX_MS, max(MIN_MS, round(st.av_delay_ms)))
        missing = any(n not in self.applied for n in self.inputs)  # a new connection, or an input OBS refused
        moved = self.offset is None or abs(st.av_delay_ms - self.offset) > self.step_ms
        if not moved:
            if not missing:
                return
            want = self.offset if self.offset is not None else want  # the offset the others hold
        self._set(req, want, st.av_delay_ms, now)

    def _set(self, req: Any, offset: int, figure: float, now: float) -> None:
        changed = offset != self.offset
        for name in self.inputs:
            try:
                if name not in self.originals:
                    self.originals[name] = int(req.get_input_audio_sync_offset(name).input_audio_sync_offset)
                if self.applied.get(name) != offset:
                    req.set_input_audio_sync_offset(name, offset)
                self.applied[name] = offset
                self._held = True
                self._warned.discard(name)
            except Exception as exc:
                if not request_failed(exc):
                    raise
                self.applied.pop(name, None)
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning(
                        "audio sync: OBS refused input '%s' (%s); name an audio input of OBS in [obs] audio_sync",
                        short(name),
                        short(_said(exc), 120),
                    )
        self.offset, self.figure_ms, self._last = offset, figure, now
        if changed and self.applied:
            log.info("audio sync: %s offset %d ms (video delay %.1f ms)", ", ".join(self.applied), offset, figure)

    def restore(self, req: Any) -> None:
        """Put back every input's own offset (best effort per input; a lost connection raises)."""
        if not self._held:
            return
        for name, ms in self.originals.items():
            try:
                req.set_input_audio_sync_offset(name, ms)
            except Exception as exc:
                if not request_failed(exc):
                    raise
        self._held = False
        self.applied.clear()
        self.offset = self.figure_ms = None
        own = ", ".join(f"{n} {ms} ms" for n, ms in self.originals.items())
        log.info("audio sync: the inputs' own offsets are back (%s)", own)

    def left_behind(self) -> None:
        """At stop: say so when OBS may keep vcam's offsets (it was unreachable to put them back)."""
        if self._held:
            log.warning(
                "audio sync: OBS was unreachable at exit, so its inputs keep vcam's offset; set back by hand: %s",
                ", ".join(f"{n} {ms} ms" for n, ms in self.originals.items()),
            )


def _said(exc: BaseException) -> str:
    """What OBS answered a refused request (its comment, after obsws-python's preamble)."""
    return str(exc).split("With message: ", 1)[-1]
