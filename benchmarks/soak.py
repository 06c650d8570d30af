"""A long run with control traffic: does the camera ever stop moving? (issue 27)

    python -m benchmarks.soak [--minutes 20] [--size 640x360] [--busy] [--json soak.json]

Runs the daemon in this process on the demo clip, paced like a camera at 30 fps (CPU, the classic
swap, the default latency budget), to a null output that stamps every published frame, with its
control socket, while a client thread sends `vcam ctl`-style commands (status every 0.2 s, a face
switch every 2 s, a swap toggle pair every 10 s, a burst of 50 status requests every minute).
``--busy`` runs ``stress-ng --cpu N`` (N = the cores) beside it. Every 30 s it records the
published fps, the longest gap between published frames, RSS, open file descriptors and threads.
Prints a table (one row a minute) and writes JSON with every sample.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks import demo_daemon, write_report


def _proc() -> tuple[float, int, int]:
    """(RSS MB, open fds, threads) of this process."""
    rss = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir("/proc/self/fd")), threading.active_count()


def _traffic(sock: Path, stop: threading.Event, answers: dict) -> None:
    from vcam.control.client import send_command

    def ask(cmd: dict) -> None:
        try:
            ok = send_command(str(sock), cmd, timeout=5)["ok"]
            answers["ok" if ok else "refused"] += 1
        except Exception:
            answers["failed"] += 1

    t0 = time.monotonic()
    k = 0
    while not stop.wait(0.2):
        k += 1
        ask({"status": True})
        if k % 10 == 0:
            ask({"face": "next"})
        if k % 50 == 0:
            ask({"swap": "toggle"})
            ask({"swap": "toggle"})
        if k % 300 == 0:
            burst = [threading.Thread(target=ask, args=({"status": True},)) for _ in range(50)]
            for t in burst:
                t.start()
            for t in burst:
                t.join()
    answers["seconds"] = time.monotonic() - t0


def run(minutes: float, width: int, height: int, root: Path) -> dict:
    sock = root / "vcam.sock"
    daemon, out = demo_daemon(sock, width=width, height=height)
    daemon.start()
    stop = threading.Event()
    answers = {"ok": 0, "refused": 0, "failed": 0}
    samples = []
    try:
        if not daemon.ready.wait(120):
            raise RuntimeError(f"the daemon did not start: {daemon.summary.error}")
        client = threading.Thread(target=_traffic, args=(sock, stop, answers), daemon=True)
        client.start()
        t0 = time.perf_counter()
        n0 = len(out.stamps)
        while time.perf_counter() - t0 < minutes * 60:
            time.sleep(30.0)
            stamps = np.array(out.stamps[n0 - 1 if n0 else 0 :])
            n0 = len(out.stamps)
            gaps = np.diff(stamps) if len(stamps) > 1 else np.array([30.0])
            rss, fds, threads = _proc()
            samples.append(
                {
                    "t_s": round(time.perf_counter() - t0, 1),
                    "fps": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
                    "max_gap_s": float(gaps.max()),
                    "max_gap_at_s": round(float(stamps[int(gaps.argmax()) + 1] - t0), 2) if len(stamps) > 1 else None,
                    "gaps_over_1s": int((gaps > 1.0).sum()),
                    "rss_mb": round(rss, 1),
                    "fds": fds,
                    "threads": threads,
                    "overloaded": bool(daemon.streams[0].live.status(0, {}).overloaded),
                    "degraded": list(daemon.degrader.off) if daemon.degrader is not None else [],
                }
            )
            s = samples[-1]
            print(
                f"{s['t_s']:7.0f} s  fps {s['fps']:5.1f}  longest gap {s['max_gap_s'] * 1e3:6.0f} ms at {s['max_gap_at_s']} s  "
                f"RSS {s['rss_mb']:.0f} MB  fds {s['fds']}  threads {s['threads']}  degraded {s['degraded']}",
                flush=True,
            )
    finally:
        stop.set()
        daemon.stop()
    summary = daemon.summary
    return {
        "samples": samples,
        "answers": answers,
        "max_gap_s": max(s["max_gap_s"] for s in samples) if samples else None,
        "gaps_over_1s": sum(s["gaps_over_1s"] for s in samples),
        "summary": summary.line(),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--busy", action="store_true", help="stress-ng --cpu (all cores) beside the run")
    ap.add_argument("--json", default="soak.json")
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)9.0f ms %(name)s: %(message)s")
    w, h = (int(v) for v in args.size.lower().split("x"))
    stress = None
    if args.busy:
        if shutil.which("stress-ng") is None:
            ap.error("--busy needs stress-ng (apt-get install stress-ng)")
        stress = subprocess.Popen(["stress-ng", "--cpu", str(os.cpu_count() or 2), "--quiet"])
    try:
        result = run(args.minutes, w, h, Path(tempfile.mkdtemp(prefix="vcam-soak-")))
    finally:
        if stress is not None:
            stress.terminate()
            stress.wait(10)

    from rich.console import Console
    from rich.table import Table

    busy = ", busy" if args.busy else ""
    table = Table(title=f"{args.minutes:g}-minute soak, {args.size} demo at 30 fps, control traffic{busy}")
    for col in ("minute", "fps", "longest gap ms", "gaps > 1 s", "RSS MB", "fds", "threads", "degraded"):
        table.add_column(col, justify="right")
    for s in result["samples"][1::2]:
        table.add_row(
            f"{s['t_s'] / 60:.0f}", f"{s['fps']:.1f}", f"{s['max_gap_s'] * 1e3:.0f}", str(s["gaps_over_1s"]),
            f"{s['rss_mb']:.0f}", str(s["fds"]), str(s["threads"]), ", ".join(s["degraded"]) or "-",
        )  # fmt: skip
    con = Console(width=160)
    con.print(table)
    con.print(f"longest gap over the run: {result['max_gap_s'] * 1e3:.0f} ms; gaps over 1 s: {result['gaps_over_1s']}")
    con.print(f"control answers: {result['answers']}")
    con.print(result["summary"])
    payload = write_report(args.json, {"minutes": args.minutes, "size": args.size, "busy": args.busy, **result})
    con.print(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
