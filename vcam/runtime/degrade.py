"""Graceful degradation: under sustained overload, turn optional stages off; with headroom, back on.

Pure logic, no threads, no clock of its own: the frame loop calls :meth:`Degrader.observe` once per
frame with the time, that frame's capture-to-publish time, the latency budget, whether the frame
was dropped and whether the GPU is throttling; it returns a :class:`Change` to apply
(``pipeline.set_stage(change.stage, change.on)``) or None.

The stages, and the order they go in (``[degrade] order``, default)::

    upscale    the frame enhancer ([upscale] model): the most expensive, and the least missed
    enhancer   the face enhancer ([swap] enhancer)
    occlusion  the occlusion mask model ([mask] types has 'occlusion')
    region     the face-parser mask model ([mask] types has 'region')

Only stages this run has configured (``available``, see :func:`available_stages`) are touched; the
swap itself, detection and tracking never are.

The rules (``after``, ``recover``, ``headroom`` from ``[degrade]``):

- **Overload**: in the last ``after`` seconds more than half the frames took longer than the budget
  or were dropped, or the GPU has been throttling for ``after`` seconds without a break. Then the
  next stage in ``order`` that is available and still on goes off. The last resort,
  :data:`LAST_RESORT` (the swap), needs :data:`LAST_RESORT_SPAN` times as long and fewer than
  :data:`LAST_RESORT_FPS` frames a second published meanwhile.
- **Headroom**: in the last ``recover`` seconds the 90th percentile of the frame time was below
  ``headroom`` times the budget, no frame was dropped and the GPU did not throttle. Then the stage
  turned off last comes back on (last off, first on).
- **Hysteresis**: after any change, the next "off" waits at least ``after`` and the next "on" at
  least ``recover``, so the frames judged are all from after the change. A stage that comes back
  and has to go off again within ``recover`` seconds waits twice as long for its next return (up
  to 8 times ``recover``): a stage the load cannot carry does not toggle every few seconds.

- **Behind** (:attr:`Degrader.behind`, kept even when nothing may be turned off): the overload
  rule's frames alone, whatever is left to shed. The frame loop tells the background work, which
  then stops stepping aside for its rounds (:meth:`vcam.engines.gate.RoundTurns.fall_behind`).

The budget is ``[pipeline] max_latency``, or the frame interval where that is 0. Frames whose budget
is 0 or less are not judged by their time (only a drop counts).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vcam.types import OPTIONAL_STAGES

STAGES = OPTIONAL_STAGES
#: The last rung: the swap itself (frames go out as the early frames do; vcam.runtime.rounds). It
#: goes only when the camera nearly stands still: over the last LAST_RESORT_SPAN times ``after``
#: seconds the frames were mostly over the budget *and* fewer than LAST_RESORT_FPS a second went
#: out. A slow swap that still moves (a CPU neural swap at 5 fps, late frames at the refresh
#: interval) keeps swapping; a busy moment costs late frames, not the swap.
LAST_RESORT = "swap"
LAST_RESORT_SPAN = 3.0
LAST_RESORT_FPS = 2.0
MAX_BACKOFF = 8.0
_EVAL_EVERY = 0.1  # seconds between decisions (a decision reads the window; frames come faster)


@dataclass(frozen=True)
class Change:
    """One stage turned off (``on`` False) or back on, and why."""

    stage: str
    on: bool
    reason: str

    def line(self) -> str:
        """``degrade: upscale off (frames over the 33 ms budget for 2.0 s)`` /
        ``degrade: upscale back on (headroom for 10 s)``."""
        return f"degrade: {self.stage} {'back on' if self.on else 'off'} ({self.reason})"


def available_stages(cfg: Any) -> set[str]:
    """The optional stages a :class:`vcam.config.Config` turns on (what the Degrader may turn off;
    :func:`vcam.runtime.roles.optional_stages`)."""
    from vcam.runtime.roles import optional_stages

    return optional_stages(cfg)


class Degrader:
    """Decides which optional stages are off, from the frame times; see the module docstring."""

    def __init__(
        self,
        order: Sequence[str],
        *,
        after: float,
        recover: float,
        headroom: float,
        enabled: bool = True,
        available: Iterable[str] | None = None,
    ) -> None:
        self.order = tuple(dict.fromkeys(order))
        self.after = float(after)
        self.recover = float(recover)
        self.headroom = float(headroom)
        self.enabled = enabled
        self.available = set(self.order) if available is None else set(available)
        self._off: list[str] = []  # turned off, in order (the last one comes back first)
        self._window = self.after + self.recover * MAX_BACKOFF
        self._frames: deque[tuple[float, float]] = deque()  # (time, frame time / budget; inf: dropped)
        self._start: float | None = None
        self._last_change: float | None = None
        self._throttle_since: float | None = None
        self._last_throttle: float | None = None
        self._next_eval = -math.inf
        self._budget = 0.0
        #: The frames are behind: more than half of those of the last ``after`` seconds over the
        #: budget or dropped, at the last decision (whatever is on or off; the frame loop tells
        #: the background work, :meth:`vcam.engines.gate.RoundTurns.fall_behind`).
        self.behind = False
        self._backoff: dict[str, float] = {}  # stage -> recover multiplier
        self._back_on_at: dict[str, float] = {}  # stage -> when it last came back on

    @classmethod
    def from_config(cls, cfg_degrade: Any, available: Iterable[str] | None = None, *, enabled: bool = True) -> Degrader:
        """From ``[degrade]`` (:class:`vcam.config.DegradeConfig`); ``enabled`` and the config's both must hold."""
        return cls(
            cfg_degrade.order,
            after=float(cfg_degrade.after),
            recover=float(cfg_degrade.recover),
            headroom=float(cfg_degrade.headroom),
            enabled=bool(cfg_degrade.enabled) and enabled,
            available=available,
        )

    @property
    def off(self) -> tuple[str, ...]:
        """The stages off now, in the order they went off."""
        return tuple(self._off)

    def drop_stage(self, stage: str) -> None:
        """``stage`` cannot be turned off or on in this run (the pipeline refused): never touch it again."""
        self.available.discard(stage)
        if stage in self._off:
            self._off.remove(stage)

    def observe(self, now: float, *, frame_time: float, budget: float, dropped: bool, throttled: bool) -> Change | None:
        """One frame: ``now`` (seconds, monotonic), its capture-to-publish ``frame_time`` (seconds),
        the ``budget`` (seconds: the latency budget, or the frame interval when that is 0), whether
        it was ``dropped`` and whether the GPU is ``throttled``. Returns the change to apply, if any
        (never one when not ``enabled``: then only :attr:`behind` is kept)."""
        if self._start is None:
            self._start = now
        if dropped:
            ratio = math.inf
        elif budget > 0:
            ratio = frame_time / budget
        else:
            ratio = math.nan  # not judged by its time
        if budget > 0:
            self._budget = budget
        self._frames.append((now, ratio))
        while self._frames and self._frames[0][0] <= now - self._window:
            self._frames.popleft()
        if throttled:
            self._last_throttle = now
            if self._throttle_since is None:
                self._throttle_since = now
        else:
            self._throttle_since = None
        if now < self._next_eval:
            return None
        self._next_eval = now + _EVAL_EVERY
        self.behind = now - self._start >= self.after and self._late(now, self.after) is not None
        if not self.enabled:
            return None
        since = now - (self._last_change if self._last_change is not None else self._start)
        stage = next((s for s in self.order if s in self.available and s not in self._off), None)
        span = self.after * (LAST_RESORT_SPAN if stage == LAST_RESORT else 1.0)
        if stage is not None and since >= span:
            reason = self._overload(now, span)
            if reason is not None and stage == LAST_RESORT:
                reason = self._standing_still(now, span)
            if reason is not None:
                return self._turn_off(stage, now, reason)
        if self._off:
            stage = self._off[-1]
            need = self.recover * self._backoff.get(stage, 1.0)
            if since >= need and self._has_headroom(now, need):
                return self._turn_on(stage, now, need)
        return None

    # -- the rules ---------------------------------------------------------------------------
    def _overload(self, now: float, span: float) -> str | None:
        if self._throttle_since is not None and now - self._throttle_since >= span:
            return f"GPU throttling for {span:.1f} s"
        return self._late(now, span)

    def _late(self, now: float, span: float) -> str | None:
        """More than half the frames of the last ``span`` seconds over the budget or dropped."""
        judged = over = 0
        for t, r in reversed(self._frames):  # newest first: only the last `span` seconds are read
            if t <= now - span:
                break
            if not math.isnan(r):
                judged += 1
                over += r > 1.0
        if judged and over > judged / 2:
            return f"frames over the {self._budget * 1000:.0f} ms budget for {span:.1f} s"
        return None

    def _standing_still(self, now: float, span: float) -> str | None:
        """Fewer than LAST_RESORT_FPS frames a second went out over the last ``span`` seconds."""
        sent = sum(1 for t, r in self._frames if t > now - span and not math.isinf(r))
        if sent < LAST_RESORT_FPS * span:
            return f"{sent / span:.1f} frames a second went out for {span:.1f} s"
        return None

    def _has_headroom(self, now: float, need: float) -> bool:
        """p90 of the frame time over the last ``need`` seconds below ``headroom`` x budget, no drop,
        no throttling. p90 < h exactly when at least ceil(0.9 n) of the n frames are below h."""
        if self._last_throttle is not None and now - self._last_throttle < need:
            return False
        judged = below = 0
        for t, r in reversed(self._frames):
            if t <= now - need:
                break
            if math.isnan(r):
                continue
            if math.isinf(r):  # a dropped frame
                return False
            judged += 1
            below += r < self.headroom
        return judged > 0 and below >= math.ceil(0.9 * judged)

    # -- changes -----------------------------------------------------------------------------
    def _turn_off(self, stage: str, now: float, reason: str) -> Change:
        back = self._back_on_at.get(stage)
        if back is not None and now - back < self.recover:
            # Back on, and the load could not carry it: wait longer before the next try.
            self._backoff[stage] = min(MAX_BACKOFF, self._backoff.get(stage, 1.0) * 2)
        elif back is not None:
            self._backoff.pop(stage, None)
        self._off.append(stage)
        self._last_change = now
        return Change(stage, False, reason)

    def _turn_on(self, stage: str, now: float, need: float) -> Change:
        self._off.pop()
        self._last_change = now
        self._back_on_at[stage] = now
        return Change(stage, True, f"headroom for {need:g} s")


__all__ = ["LAST_RESORT", "LAST_RESORT_FPS", "LAST_RESORT_SPAN", "Change", "Degrader", "STAGES", "available_stages"]
