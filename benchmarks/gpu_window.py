"""What the GPU did over a window of a running daemon: every kernel, copy and memset of the process
(CUPTI through torch.profiler: CuPy's kernels and the engines' graph replays alike), by stream, over
a few seconds of steady state. Answers the question the CUDA events of one frame cannot: is the GPU
busy all the time (the rounds are GPU-bound: shorten the GPU work) or idle between rounds (the host
is the bottleneck), and which operations fill it.

:func:`summarize` is plain Python over the trace's events (tested on the CPU); :class:`Window` starts
and stops the profiler from the frame loop's own thread (the round hook).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The trace categories that are GPU work.
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _union(spans: list[tuple[float, float]]) -> float:
    """Total length covered by ``spans`` (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


#: Idle gaps (no GPU op on any stream) at least this long are listed with the op that ended them, in ms.
GAP_MS = 0.5


def _gaps(spans: list[tuple[float, float, str]], least: float) -> list[tuple[float, float, str]]:
    """The idle stretches between ``spans`` (start, end, name; overlaps merged) of at least
    ``least``: (start, length, the name of the op that ended it)."""
    out: list[tuple[float, float, str]] = []
    end = None
    for a, b, name in sorted(spans):
        if end is not None and a - end >= least:
            out.append((end, a - end, name))
        end = b if end is None else max(end, b)
    return out


def summarize(events: Iterable[dict[str, Any]], rounds: int = 0, top: int = 25) -> dict[str, Any]:
    """The GPU's work in a trace's complete ("X") events: the window (first op to last op end), the
    share of it the GPU was busy on any stream, each stream's busy time and ops, the operations by
    total time; per round too where ``rounds`` (the frame loop's rounds in the window) is given; the
    idle gaps of :data:`GAP_MS` or more (their count, total and longest, and the ops that ended the
    most idle time: what the GPU waited for). Times in ms."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS and e.get("dur") is not None]
    if not gpu:
        return {"ops": 0, "window_ms": 0.0, "busy_share": 0.0, "streams": {}, "top": [], "rounds": rounds, "gaps": None}
    t0 = min(e["ts"] for e in gpu)
    t1 = max(e["ts"] + e["dur"] for e in gpu)
    window = (t1 - t0) / 1e3
    streams: dict[str, list[tuple[float, float]]] = defaultdict(list)
    ops: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in gpu:
        sid = str(e.get("args", {}).get("stream", e.get("tid")))
        streams[sid].append((e["ts"], e["ts"] + e["dur"]))
        ops[(str(e["name"])[:80], sid)].append(e["dur"] / 1e3)
    busy = _union([s for v in streams.values() for s in v]) / 1e3
    gaps = _gaps([(e["ts"], e["ts"] + e["dur"], str(e["name"])[:80]) for e in gpu], GAP_MS * 1e3)
    after: dict[str, list[float]] = defaultdict(list)
    for _, length, name in gaps:
        after[name].append(length / 1e3)
    own = {sid: _union(v) / 1e3 for sid, v in streams.items()}  # each stream's busy ms
    per = max(rounds, 1)
    return {
        "ops": len(gpu),
        "window_ms": window,
        "busy_ms": busy,
        "busy_share": busy / window if window > 0 else 0.0,
        "rounds": rounds,
        "busy_ms_per_round": busy / per if rounds else None,
        "streams": {
            sid: {"busy_ms": own[sid], "busy_share": own[sid] / window, "ops": len(streams[sid])}
            for sid in sorted(own, key=lambda k: -own[k])
        },
        "gaps": {
            "count": len(gaps),
            "total_ms": sum(g[1] for g in gaps) / 1e3,
            "longest_ms": max((g[1] for g in gaps), default=0.0) / 1e3,
            "ended_by": [
                {"name": name, "count": len(d), "total_ms": sum(d)}
                for name, d in sorted(after.items(), key=lambda kv: -sum(kv[1]))[:8]
            ],
        },
        "top": [
            {"name": name, "stream": sid, "count": len(d), "total_ms": sum(d), "per_round_ms": sum(d) / per if rounds else None}
            for (name, sid), d in sorted(ops.items(), key=lambda kv: -sum(kv[1]))[:top]
        ],
    }


def report(s: dict[str, Any]) -> str:
    """The summary as lines of text."""
    if not s["ops"]:
        return "GPU window: no GPU operation recorded (no CUDA, or the profiler saw none)"
    r = s["rounds"]
    lines = [
        f"GPU window: {s['window_ms']:.0f} ms, {s['ops']} ops, busy {s['busy_share'] * 100:.1f} % on any stream"
        + (f"; {r} rounds: {s['busy_ms_per_round']:.2f} ms busy a round, {s['window_ms'] / r:.2f} ms a round" if r else ""),
        "  stream   busy %    ops",
    ]
    for sid, v in s["streams"].items():
        lines.append(f"  {sid:<8s} {v['busy_share'] * 100:6.1f} {v['ops']:6d}")
    g = s.get("gaps")
    if g and g["count"]:
        lines.append(
            f"  idle gaps >= {GAP_MS} ms: {g['count']}, {g['total_ms']:.1f} ms in all"
            + (f" ({g['total_ms'] / r:.2f} ms a round)" if r else "")
            + f", longest {g['longest_ms']:.2f} ms; the ops that ended them (ms, count, name):"
        )
        for o in g["ended_by"]:
            lines.append(f"  {o['total_ms']:8.3f}  x{o['count']:<5d} {o['name']}")
    lines.append("  operations by total time: ms" + (" a round" if r else "") + ", count, stream, name")
    for o in s["top"]:
        t = o["per_round_ms"] if r else o["total_ms"]
        lines.append(f"  {t:8.3f}  x{o['count']:<5d} s{o['stream']:<5s} {o['name']}")
    return "\n".join(lines)


class Window:
    """torch.profiler (CUDA activity only) from ``start_after`` seconds after construction for
    ``seconds``, started and stopped by :meth:`tick`, which the frame loop's thread calls (the round
    hook): Kineto must be started on the thread that first set it up, and a timer thread was refused
    ("External init callback must run in same thread as registerClient", H100, 2026-12-07).
    :meth:`result` writes the Chrome trace to ``trace`` and returns :func:`summarize`'s dict
    (``rounds``: a callable counting the loop's rounds so far, read at the window's two ends)."""

    def __init__(self, start_after: float, seconds: float, trace: Path, rounds: Any = None) -> None:
        self.seconds, self.trace = seconds, Path(trace)
        self._start_at = time.perf_counter() + start_after
        self._rounds = rounds or (lambda: 0)
        self._prof: Any = None
        self._first = 0
        self._counted = 0
        self._stop_at: float | None = None
        self._done = False
        self._error: BaseException | None = None

    def tick(self) -> None:
        """Start the profiler once its time came, stop it once the window is over (cheap otherwise)."""
        if self._done:
            return
        now = time.perf_counter()
        try:
            if self._prof is None and now >= self._start_at:
                from torch.profiler import ProfilerActivity, profile

                self._prof = profile(activities=[ProfilerActivity.CUDA])
                self._prof.start()
                self._first = self._rounds()
                self._stop_at = now + self.seconds
            elif self._stop_at is not None and now >= self._stop_at:
                self._counted = self._rounds() - self._first
                self._prof.stop()
                self._done = True
        except Exception as e:  # reported by result(); the run goes on
            self._error, self._done = e, True

    def result(self) -> dict[str, Any]:
        if self._error is not None:
            raise RuntimeError(f"the GPU window failed: {self._error}") from self._error
        if not self._done:
            raise TimeoutError("the GPU window did not end (the run was shorter than its start plus its length)")
        self._prof.export_chrome_trace(str(self.trace))
        events = json.loads(self.trace.read_text()).get("traceEvents", [])
        return summarize(events, rounds=self._counted)
