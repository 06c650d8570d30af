"""Run bookkeeping: the live numbers (rolling windows) and the summary of a run."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vcam.platform import process
from vcam.state import Status, guard_text
from vcam.types import FrameStats


@dataclass
class RunSummary:
    """What ``vcam run`` prints when it stops."""

    frames_in: int = 0
    frames_out: int = 0
    dropped_capture: int = 0
    dropped_latency: int = 0
    #: Frames published although over the budget: nothing had gone out for longer than the stream's
    #: refresh interval (:meth:`vcam.runtime.rounds.Stream.stale_after`), so the picture kept moving.
    published_late: int = 0
    full_scans: int = 0
    upscale_skipped: int = 0  # frames the frame enhancer would have pushed over the budget (resized instead)
    guarded: dict[str, int] = field(default_factory=dict)  # model name -> faces passed through (NaN/Inf)
    #: A remote swapper's faces without a good answer in time, swapped here instead (on_fault = "local").
    swapped_locally: int = 0
    # Capture-to-publish latency of the most recent published frames (bounded: the daemon runs for
    # hours; 100k frames is about an hour at 30 fps).
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=100_000))
    stage_ms: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    device: str = "cpu"
    models: str = ""  # where each model ran (Assembly.describe)
    first_frame_s: float | None = None  # vcam's start -> first frame published (start-up, as a user waits)
    first_processed_s: float | None = None  # vcam's start -> first frame published through the pipeline
    early_frames: int = 0  # early frames: published (pixelated or as they came) while the models loaded
    #: Early frames dropped over the latency budget / published over it (the picture kept moving),
    #: counted apart from the pipeline's ``dropped_latency``/``published_late``.
    early_dropped: int = 0
    early_late: int = 0
    #: Frames swapped on the CPU while the GPU loaded (the early swap: vcam.runtime.early_swap); counted in frames_out too.
    cpu_frames: int = 0
    switched_s: float | None = None  # vcam's start -> the switch from the CPU to the GPU (the early swap)
    #: Frames published without the pipeline (pixelated, or as they came) while the swap was shed under
    #: overload (the degrader's last rung, vcam.runtime.rounds.SHED_SWAP).
    shed_frames: int = 0
    error: str | None = None
    #: The input frames a conversion (every frame of a file, no loop) was to process: the file's
    #: frame count (capped by ``--frames``); None for live inputs, which have no end.
    frames_total: int | None = None
    #: The face swapped in when the run stopped: a name, '' for none (frames passed through), None
    #: when not known (stopped before the faces were loaded).
    face: str | None = None
    #: A conversion stopped (Ctrl-C) before the end of its input: its file is kept as NAME.partial.
    interrupted: bool = False
    #: The file output, as :meth:`vcam.stages.recording.FileOutput.describe` names it (codec, pixel
    #: format, size), and where it was kept; '' for other outputs.
    output: str = ""

    def percentile(self, q: float) -> float:
        return float(np.percentile(np.fromiter(self.latencies_ms, float), q)) if self.latencies_ms else 0.0

    @property
    def fps(self) -> float:
        return self.frames_out / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        of = f"{self.frames_total} input frames" if self.frames_total is not None else f"{self.frames_in}"
        face = "" if self.face is None else f"; face {self.face or 'none (pass-through)'}"
        return (
            f"stopped{' (interrupted)' if self.interrupted else ''}: {self.frames_out} frames published of {of} "
            f"in {self.seconds:.1f}s ({self.fps:.1f} fps) on {self.device}{face}; latency p50 {self.percentile(50):.1f} ms, "
            f"p99 {self.percentile(99):.1f} ms; dropped {self.dropped_capture} at capture, "
            f"{self.dropped_latency} over the latency budget"
            + (f" ({self.published_late} published late, to keep the picture moving)" if self.published_late else "")
            + (f"; {total} faces passed through ({guard_text(self.guarded)})" if (total := sum(self.guarded.values())) else "")
            + (f"; {swapped_locally_text(self.swapped_locally)}" if self.swapped_locally else "")
            + (f"; frame enhancer skipped on {self.upscale_skipped} (over budget)" if self.upscale_skipped else "")
            + (f"; {self.shed_frames} frames without the swap (overload)" if self.shed_frames else "")
            + (
                f"; {self.cpu_frames} swapped on the CPU while the GPU loaded"
                + (f" (on {self.device} from {self.switched_s:.1f} s)" if self.switched_s is not None else "")
                if self.cpu_frames
                else ""
            )
            + (f"; first frame {self.first_frame_s:.1f} s after start" if self.first_frame_s is not None else "")
            + (
                f" (through the pipeline {self.first_processed_s:.1f} s; {self.early_frames} early frames while the "
                "models loaded)"
                if self.early_frames and self.first_processed_s is not None
                else ""
            )
        )


#: Frames whose capture-to-publish delay makes the audio sync figure (``Status.av_delay_ms``): about
#: two seconds at 30 fps, so a change of load shows within seconds, one slow frame never.
AV_WINDOW = 60


class LiveStats:
    """Rolling fps and latency windows of the frame loop, folded into :class:`Status` on demand."""

    def __init__(self, summary: RunSummary) -> None:
        self.summary = summary
        self._in: deque[float] = deque(maxlen=120)
        self._out: deque[float] = deque(maxlen=120)
        self._lat: deque[float] = deque(maxlen=300)
        self._recent: deque[float] = deque(maxlen=AV_WINDOW)  # the audio sync's figure follows load within seconds
        self._stage_sum: dict[str, float] = {}
        self._over = 0
        self._late = 0  # > 0 while frames go out late (overloaded): counts down on on-time frames
        self.faces = 0
        #: Called once, when the next frame went out through the pipeline (the first, or the first
        #: through a full assembly an early swap switched to): the daemon lets the work it held
        #: back for the first frame begin then.
        self.on_first: Callable[[], Any] | None = None

    def frame_in(self, t_capture: float) -> None:
        self.summary.frames_in += 1
        self._in.append(t_capture)

    def processed(self, stats: FrameStats) -> None:
        for k, v in stats.stages.items():
            self._stage_sum[k] = self._stage_sum.get(k, 0.0) + v
        self.summary.full_scans += int(stats.full_scan)
        self.summary.upscale_skipped += int(stats.upscale_skipped)
        self.faces = stats.faces

    def published(self, t_capture: float, t_pub: float, *, late: bool = False) -> None:
        """A frame went out; ``late``: over the budget, sent because the picture would have frozen."""
        s = self.summary
        if s.frames_out == 0:
            s.first_processed_s = process.age()
            if s.first_frame_s is None:
                s.first_frame_s = s.first_processed_s
        if self.on_first is not None:  # once: the first frame out since it was set
            first, self.on_first = self.on_first, None
            first()
        s.frames_out += 1
        self._out.append(t_pub)
        ms = (t_pub - t_capture) * 1000.0
        self._lat.append(ms)
        self._recent.append(ms)
        s.latencies_ms.append(ms)
        if late:
            s.published_late += 1
            self._over = self._late = 30
        else:
            self._over = max(0, self._over - 1)
            self._late = max(0, self._late - 1)

    def published_early(self, t_capture: float, t_pub: float) -> None:
        """An early frame went out (pixelated while an early swap's CPU swap races the budget): the
        status line's rates and latencies count it (the camera moves), the swapped counts do not."""
        self._in.append(t_capture)
        self._out.append(t_pub)
        self._lat.append((t_pub - t_capture) * 1000.0)

    def dropped_late(self) -> None:
        self.summary.dropped_latency += 1
        self._over = 30

    def status(
        self, dropped_capture: int, guarded: dict[str, int], *, gpu=None, degraded=(), engines=(), frame_s: float = 0.0
    ) -> Status:
        """The live numbers; ``guarded``: model name -> faces it passed through (NaN/Inf) so far;
        ``gpu``: the newest GPU reading (a :class:`vcam.telemetry.GpuSample` or its dict, None
        without telemetry); ``degraded``: the stages turned off under load (``Degrader.off``);
        ``frame_s``: the camera's frame time (1 / its frame rate), part of ``av_delay_ms``."""
        s = self.summary
        if gpu is not None and not isinstance(gpu, dict):
            gpu = gpu.as_dict()
        st = Status(
            frames_in=s.frames_in,
            frames_out=s.frames_out,
            dropped_capture=dropped_capture,
            dropped_latency=s.dropped_latency,
            full_scans=s.full_scans,
            upscale_skipped=s.upscale_skipped,
            fps_in=_rate(self._in),
            fps_out=_rate(self._out),
            over_budget=self._over > 0,
            overloaded=self._late > 0,
            published_late=s.published_late,
            faces=self.faces,
            guarded=dict(guarded),
            gpu=dict(gpu) if gpu is not None else None,
            degraded=tuple(degraded),
            engines=tuple(engines),
        )
        if self._lat:
            arr = np.fromiter(self._lat, dtype=np.float64)
            st.latency_p50_ms = float(np.percentile(arr, 50))
            st.latency_p99_ms = float(np.percentile(arr, 99))
            st.av_delay_ms = float(np.median(np.fromiter(self._recent, dtype=np.float64))) + max(0.0, frame_s) * 1000.0
        return st

    def finish(self, seconds: float, dropped_capture: int, guarded: dict[str, int]) -> RunSummary:
        s = self.summary
        s.seconds = seconds
        s.dropped_capture = dropped_capture
        s.guarded = dict(guarded)
        n = max(s.frames_in, 1)
        s.stage_ms = {k: v * 1000.0 / n for k, v in self._stage_sum.items()}
        return s


def status_parts(status: Status) -> list[str]:
    """What a status shows beyond fps, latency and faces, each part a phrase: that the stream is
    paused, the per-model NaN/Inf guard counts when any is non-zero, the GPU reading (``GPU 61°C
    1980 MHz ...``) and the stages turned off under load (``degraded: upscale, enhancer off``), each
    only when there is one."""
    parts = ["paused (camera closed)"] if status.paused else []  # vcam.runtime.pause
    parts += status.engines  # 'swapper: remote gpu-box:8001 down since 12:01:03'
    if text := status.guard_text():
        parts.append(text)
    if status.gpu:
        from vcam.telemetry import gpu_text

        parts.append(gpu_text(status.gpu))
    if status.upscale_skipped:
        parts.append(f"upscale skipped {status.upscale_skipped} (over budget)")
    if status.overloaded or "swap" in status.degraded:  # the last rung says it is shedding while it lasts
        parts.append(overloaded_text(status.degraded))
    elif status.degraded:
        parts.append(degraded_text(status.degraded))
    return parts


def swapped_locally_text(faces: int) -> str:
    """``remote late/down, swapped locally 12 faces``: a remote swapper's faults taken here."""
    return f"remote late/down, swapped locally {faces} face{'s' if faces != 1 else ''}"


def overloaded_text(degraded) -> str:
    """What an overloaded stream says: the stages shed so far (``overloaded: shedding upscale,
    enhancer``), or that late frames go out while there is nothing left to shed."""
    return f"overloaded: shedding {', '.join(degraded)}" if degraded else "overloaded: publishing late frames"


def degraded_text(degraded) -> str:
    """``degraded: upscale, enhancer off``, or '' when no stage is off."""
    return f"degraded: {', '.join(degraded)} off" if degraded else ""


def status_suffix(status: Status) -> str:
    """What the live status line adds for ``status`` beyond fps, latency and faces (:func:`status_parts`,
    each after `` | ``: `` | NaN guard: inswapper_128 3 | GPU 61°C ... | degraded: upscale off``), else ''."""
    return "".join(f" | {part}" for part in status_parts(status))


def _rate(times: deque) -> float:
    if len(times) < 2:
        return 0.0
    span = times[-1] - times[0]
    return (len(times) - 1) / span if span > 0 else 0.0


__all__ = ["LiveStats", "RunSummary", "degraded_text", "overloaded_text", "status_parts", "status_suffix", "swapped_locally_text"]
