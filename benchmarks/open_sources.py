"""How long a start takes to open its streams' sources: N streams of one clip opened one after another
(as start-up did before) against :func:`vcam.runtime.startup.open_sources` (at once, a thread each),
alternated round by round in one process (issue 39: four 1080p sources held a four-stream start
0.4 s on the H200's host before its models began to load).

    python -m benchmarks.open_sources [--streams 4] [--rounds 6] [--clip FILE] [--json OUT]

Without ``--clip``: a 1080p clip of one drifting portrait (the issue's ``faces:1``), made once in the
temp folder. Prints a table (ms to open all, per round and median) and writes JSON."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _streams(clip: Path, n: int) -> list[Any]:
    from vcam.config import Config
    from vcam.stages import capture

    cfg = Config()
    cc = replace(cfg.capture, input=str(clip), pacing="realtime")
    return [
        SimpleNamespace(name=f"s{k}", cfg=SimpleNamespace(capture=cc), delivery=capture.plan_delivery(cc, "", None), source=None)
        for k in range(n)
    ]


def one_by_one(streams: list[Any]) -> list[Any]:
    """The sources opened as start-up did before: one after another, in the calling thread."""
    from vcam.stages import capture

    return [capture.open_source(st.cfg.capture, delivery=st.delivery, compressed=True) for st in streams]


def at_once(streams: list[Any]) -> list[Any]:
    """The sources opened as start-up does (:func:`vcam.runtime.startup.open_sources`)."""
    from vcam.runtime.opened import Opened
    from vcam.runtime.startup import open_sources

    d = SimpleNamespace(streams=streams, given_sources={})
    open_sources(d, SimpleNamespace(opened=Opened()))  # type: ignore[arg-type]
    return [st.source for st in streams]


def measure(clip: Path, n: int, rounds: int) -> dict[str, list[float]]:
    import av  # noqa: F401  imported once, as by a start's first source (it is not what is timed)

    out: dict[str, list[float]] = {"one by one": [], "at once": []}
    ways = {"one by one": one_by_one, "at once": at_once}
    for r in range(rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            streams = _streams(clip, n)
            t0 = time.perf_counter()
            sources = ways[name](streams)
            out[name].append((time.perf_counter() - t0) * 1000.0)
            for s in sources:
                s.close()
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks import write_report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--clip", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    clip = a.clip
    if clip is None:
        from benchmarks.gpu_e2e import make_clip

        clip = Path(tempfile.gettempdir()) / "vcam-open-sources-faces1_1080p.mp4"
        if not clip.exists():
            part = clip.with_suffix(".part.mp4")
            make_clip(part, 30, 1)
            part.replace(clip)
    got = measure(clip, a.streams, a.rounds)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"{a.streams} sources of {clip.name}, {a.rounds} rounds alternated: ms to open them all")
    print(f"{'':<12} {'median':>8}  per round")
    for k, v in got.items():
        print(f"{k:<12} {med[k]:>8.1f}  " + ", ".join(f"{x:.0f}" for x in v))
    ratio = med["at once"] / med["one by one"] if med["one by one"] else float("nan")
    print(f"at once / one by one: {ratio:.2f}")
    if a.json:
        write_report(
            str(a.json),
            {"args": {**vars(a), "clip": str(clip), "json": str(a.json)}, "ms": got, "median_ms": med, "ratio": ratio},
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
