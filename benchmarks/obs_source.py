"""The direct OBS source in a browser, as OBS's Browser Source shows it (issue 42).

    python -m benchmarks.obs_source [--size 1920x1080] [--seconds 10] [--rounds 3] [--swap on|off] [--search auto|worker|frame]
        [--json bench_obs_source.json]

The real daemon on the demo clip (CPU, classic swap, paced like a 30 fps camera) with ``--output
obs-source``, and headless Chromium opening the source's URL itself, as a Browser Source does (the
MJPEG answer is the page: Chromium's image document). Each published frame carries its number in a
strip of black and white 16-px blocks at its top left (written into the published frame after the
output took it, before the source's tap); a script in the page draws that strip of the shown
picture onto a canvas at every animation frame (same origin: readable) and notes each new number
with the time it was first seen. In one run, each round takes every mode once, the order rotated
from round to round (:data:`MODES`):

- ``off``: nobody watching (the page on ``about:blank``; the source's tap returns at once);
- ``reader``: a plain HTTP reader in its own process reads the source and throws it away: what the
  source itself costs the daemon (encoding and serving every frame);
- ``browser``: the page showing the source: that plus Chromium decoding and painting every frame
  on the same cores.

Per segment (a settled window of ``--seconds``): the daemon's published frames a second and its
process's CPU per frame (every thread), the encoder's CPU per frame, parts sent a second,
Chromium's CPU (all its processes, in cores), the frame thread's time in the tap; in ``browser``:
frames shown / frames published between the first and the last number seen, the page's animation
frames a second (Chromium's own paint count: a frame published between two paints cannot be
shown), publish-to-shown p50/p99 (the page's clock and the daemon's are the same machine's). The
fps ratios are taken per round (a mode against ``off`` of the same round) and their median kept.
Prints a table and writes JSON with the load average at the start and the end. ``measure`` is what
tests/panel/test_panel_source.py runs, shorter and smaller.
"""

from __future__ import annotations

import argparse
import bisect
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_report
from vcam.panel.source import published_of

BITS = 24  # frame numbers up to 16.7 M
BLOCK = 16  # px: one JPEG block a bit, so no bit bleeds into the next

WATCH = """
window.seen = []; const img = document.images[0]; const w = %(bits)d * %(block)d, b = %(block)d;
const c = document.createElement('canvas'); c.width = w; c.height = b;
const g = c.getContext('2d', {willReadFrequently: true}); let last = -1;
window.ticks = 0;
function tick() {
  window.ticks++;
  if (img.naturalWidth) {
    g.drawImage(img, 0, 0, w, b, 0, 0, w, b); const p = g.getImageData(0, 0, w, b).data; let k = 0;
    for (let i = 0; i < %(bits)d; i++) { if (p[((b >> 1) * w + i * b + (b >> 1)) * 4 + 1] > 127) k += 2 ** i; }
    if (k !== last) { last = k; window.seen.push([k, performance.timeOrigin + performance.now()]); }
  }
  requestAnimationFrame(tick);
}
requestAnimationFrame(tick);
"""


def stamp(data: np.ndarray, number: int) -> None:
    """``number`` in ``BITS`` blocks along the top left of a BGR frame (white: 1)."""
    for i in range(BITS):
        data[:BLOCK, i * BLOCK : (i + 1) * BLOCK] = 255 if (number >> i) & 1 else 0


def browser(width: int, height: int) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    opts.binary_location = "/usr/bin/chromium"
    opts.page_load_strategy = "none"  # an MJPEG page never finishes loading
    d = webdriver.Chrome(options=opts, service=Service("/usr/bin/chromedriver"))
    d.set_window_size(width, height)
    return d


class Stamper:
    """Wraps the daemon's tap: numbers each published frame and keeps its publish time."""

    def __init__(self, d: Any) -> None:
        self.d, self.published, self.url = d, {}, ""
        self.times: list[float] = []  # the publish times in frame order (numbers from 1)
        self.tap_us: list[float] = []
        self.ready = threading.Event()

    def announce(self, line: str) -> None:
        if not line.startswith("OBS source: "):
            return
        self.url = line.split(": ", 1)[1]
        tap = self.d.rounds.tap

        def stamped(st: Any, data: Any) -> None:
            n = len(self.published) + 1
            stamp(data, n)
            self.published[n] = now = time.time()
            self.times.append(now)
            t0 = time.perf_counter()
            tap(st, data)  # the panel's preview and the source's offer: the frame thread's share
            self.tap_us.append((time.perf_counter() - t0) * 1e6)

        self.d.rounds.tap = stamped
        self.ready.set()


READER = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as res:
    while res.read(1 << 16):
        pass
"""

MODES = ("off", "reader", "browser")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and all its descendants so far (Linux /proc;
    0.0 elsewhere): Chromium's processes under its driver."""
    procs: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        procs[int(entry.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += procs.get(p, (0, 0.0))[1]
        todo.extend(c for c, (parent, _) in procs.items() if parent == p)
    return total


def shown_in(seen: list, published: dict[int, float], sent: dict[int, float], paints: float) -> dict:
    """What the page showed: frames shown of those published between the first and the last it
    showed, publish-to-shown delays, how many were published less than a paint after the one
    before, and of the frames not shown: how many the server never sent, and how many it sent less
    than a paint before the next one it sent (a display showing the newest picture at each paint
    skips such a frame: a loss in the page's paint cadence, not in the source)."""
    shown = {int(k): t / 1000.0 for k, t in seen if int(k) in published}
    if len(shown) < 2:
        nan = float("nan")
        return {"shown": len(shown), "published": 0, "bunched": 0, "unsent": 0, "sent_bunched": 0, "p50_ms": nan, "p99_ms": nan}
    first, last = min(shown), max(shown)
    paint = 1.0 / max(paints, 1.0)
    lat = np.asarray([(t - published[k]) * 1000.0 for k, t in shown.items()])
    gaps = np.diff([published[k] for k in range(first, last + 1)])
    missed = [k for k in range(first, last + 1) if k not in shown]
    order = sorted(k for k in sent if first <= k <= last + 1)
    after = {a: sent[b] - sent[a] for a, b in zip(order, order[1:])}  # to the next part sent
    return {
        "shown": len(shown),
        "published": last - first + 1,
        "bunched": int((gaps < paint).sum()),
        "unsent": sum(1 for k in missed if k not in sent),
        "sent_bunched": sum(1 for k in missed if k in after and after[k] < paint),
        # per frame not shown: ms from its publish to its send and from its send to the next send
        "missed": [
            [k, round((sent[k] - published[k]) * 1e3, 1), round(after.get(k, -1e-3) * 1e3, 1)] for k in missed if k in sent
        ],
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


class Segments:
    """The run's viewers of the source, one mode at a time (:data:`MODES`): nobody, a plain HTTP
    reader in its own process (the source's own cost: encoding and serving), headless Chromium."""

    def __init__(self, page: Any, url: str, tap: Any, stamper: Stamper) -> None:
        self.page, self.url, self.tap = page, url, tap
        self.reader: subprocess.Popen | None = None
        self.chromium = int(page.service.process.pid)
        self.sent: dict[int, float] = {}  # frame number -> when its part was first handed to the server
        real = tap.parts
        times = stamper.times

        async def parts(stream: str, hub: Any, closing: Any) -> Any:
            async for chunk in real(stream, hub, closing):
                stamp = published_of(chunk)
                if stamp is not None:  # the offer's clock: after the frame's stamp, before the next one's
                    self.sent.setdefault(bisect.bisect_right(times, stamp), time.time())
                yield chunk

        tap.parts = parts

    def begin(self, mode: str) -> None:
        sent = self.tap.sent
        if mode == "reader":
            self.reader = subprocess.Popen([sys.executable, "-c", READER, self.url])
        elif mode == "browser":
            self.page.get(self.url)
            end = time.monotonic() + 30.0
            ready = "return document.images.length && document.images[0].naturalWidth"
            while time.monotonic() < end and not self.page.execute_script(ready):
                time.sleep(0.1)
            self.page.execute_script(WATCH % {"bits": BITS, "block": BLOCK})
        end = time.monotonic() + 30.0
        while mode != "off" and self.tap.sent == sent and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1.0)  # settled: the reader's start-up and the page's first paints out of the window
        if mode == "browser":
            self.page.execute_script("window.seen = []; window.ticks = 0;")

    def end(self, mode: str, published: dict[int, float], seconds: float) -> dict:
        row: dict[str, Any] = {}
        if mode == "browser":
            seen = self.page.execute_script("return window.seen") or []
            row["paints"] = self.page.execute_script("return window.ticks") / seconds  # animation frames a second
            row |= shown_in(seen, published, self.sent, row["paints"])
            self.page.get("about:blank")
        if self.reader is not None:
            self.reader.terminate()
            self.reader.wait(10)
            self.reader = None
        return row

    def close(self) -> None:
        if self.reader is not None:
            self.reader.kill()
            self.reader.wait(10)


def segment(d: Any, stamper: Stamper, views: Segments, mode: str, seconds: float) -> dict:
    """One measured window of ``seconds`` with the source's viewer ``mode``: the daemon's fps and
    CPU per frame, the encoder's CPU per frame, parts sent, Chromium's CPU, what the page showed."""
    tap, summary = views.tap, d.streams[0].summary
    views.begin(mode)
    t0, n0, c0, b0 = time.perf_counter(), summary.frames_out, time.process_time(), tree_cpu(views.chromium)
    e0, v0, s0, k0 = tap.encode_cpu, tap.offered - tap.replaced - tap.stale, tap.sent, len(stamper.tap_us)
    time.sleep(seconds)
    wall, frames = time.perf_counter() - t0, summary.frames_out - n0
    cpu, chromium = time.process_time() - c0, tree_cpu(views.chromium) - b0
    encoded = tap.offered - tap.replaced - tap.stale - v0
    taps = np.asarray(stamper.tap_us[k0:] or [0.0])
    row: dict[str, Any] = {
        "mode": mode,
        "fps": frames / wall,
        "cpu_ms_per_frame": cpu * 1000.0 / max(frames, 1),  # the daemon's process, every thread
        "encode_ms_per_frame": (tap.encode_cpu - e0) * 1000.0 / max(encoded, 1),
        "sent_per_s": (tap.sent - s0) / wall,
        "chromium_cores": chromium / wall,
        "tap_mean_us": float(taps.mean()),
        "tap_max_us": float(taps.max()),
    }
    return row | views.end(mode, stamper.published, wall)


def _median(rows: list[dict], key: str) -> float:
    vals = [x[key] for x in rows if key in x and x[key] == x[key]]
    return float(np.median(vals)) if vals else float("nan")


def summarize(rows: list[dict]) -> dict:
    """The run's figures: per mode the medians over its segments; fps ratios per round (a mode
    against ``off`` of the same round), their median."""
    res: dict[str, Any] = {}
    for mode in MODES:
        mine = [x for x in rows if x["mode"] == mode]
        for key in ("fps", "cpu_ms_per_frame", "encode_ms_per_frame", "sent_per_s", "chromium_cores", "tap_mean_us"):
            res[f"{key}_{mode}"] = _median(mine, key)
    for mode in ("reader", "browser"):
        ratios = [
            on["fps"] / off["fps"]
            for on in rows
            for off in rows
            if on["mode"] == mode and off["mode"] == "off" and on["round"] == off["round"] and off["fps"]
        ]
        res[f"fps_ratio_{mode}"] = float(np.median(ratios)) if ratios else 0.0
    res["fps_ratio"] = res["fps_ratio_browser"]  # the Done-when's ratio: the source on, in Chromium
    pages = [x for x in rows if x["mode"] == "browser"]
    res["shown_ratio"] = sum(x["shown"] for x in pages) / max(1, sum(x["published"] for x in pages))
    published = max(1, sum(x["published"] for x in pages))
    for key in ("bunched", "unsent", "sent_bunched"):
        res[key] = sum(x[key] for x in pages) / published
    for key in ("paints", "p50_ms", "p99_ms"):
        res[key] = _median(pages, key)
    res["shown_per_s"] = res["shown_ratio"] * res["fps_browser"]
    return res


def measure(
    width: int, height: int, seconds: float, rounds: int, folder: Path, log=print, swap: bool = True, search: str = "auto"
) -> dict:
    """The run the module docstring describes; its segments and their medians. ``swap=False``:
    the swap switched off (`vcam ctl swap off`: detection and tracking still run), for a machine
    too busy to swap at the size asked. ``search``: ``[track] search`` (``auto`` picks a worker
    beside the frame when the machine's load at the start leaves a core idle, else the frame: the
    result's ``search`` says which ran)."""
    from vcam.config_file import build
    from vcam.runtime.daemon import Daemon
    from vcam.stages.publish import open_output

    cfg = build(
        {
            "capture": {"input": "demo", "width": width, "height": height, "pacing": "realtime"},
            "pipeline": {"device": "cpu", "max_latency": 0},
            "degrade": {"enabled": False},  # the swap stays on in every segment: the modes compare
            "track": {"search": search},
            "output": {"target": "obs-source"},
            "control": {"socket": str(folder / "vcam.sock")},
            "panel": {"port": 0},
        }
    )
    out = open_output(cfg.output, width, height, 30.0)  # given: a live run, as `vcam run --output obs-source`
    holder: list[Stamper] = []
    d = Daemon(cfg, output=out, panel=True, announce=lambda line: holder[0].announce(line))
    stamper = Stamper(d)
    holder.append(stamper)
    page = browser(width, height)
    rows: list[dict] = []
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    views: Segments | None = None
    try:
        d.start()
        if not stamper.ready.wait(120):
            raise RuntimeError("the daemon announced no OBS source")
        if not swap:
            d.streams[0].state.set_swap(False)
        end = time.monotonic() + 120.0
        while d.assembly is None and time.monotonic() < end:  # the models in use: past the early frames
            time.sleep(0.1)
        time.sleep(3.0)
        views = Segments(page, stamper.url, d.up.panel.panel.source, stamper)
        for r in range(rounds):
            for mode in MODES[r % 3 :] + MODES[: r % 3]:  # each mode in each place of the order
                row = {"round": r + 1} | segment(d, stamper, views, mode, seconds)
                rows.append(row)
                log(
                    f"  round {r + 1} {mode:7}: {row['fps']:.1f} fps, {row['cpu_ms_per_frame']:.0f} ms CPU a frame"
                    + (f", encoder {row['encode_ms_per_frame']:.1f} ms" if mode != "off" else "")
                    + (
                        f", shown {row['shown']}/{row['published']}, p50 {row['p50_ms']:.0f} ms, "
                        f"page {row['paints']:.0f} paints/s, Chromium {row['chromium_cores']:.2f} cores"
                        if mode == "browser"
                        else ""
                    )
                )
    finally:
        if views is not None:
            views.close()
        page.quit()
        d.stop()
    tap = d.up.panel.panel.source  # what the source's encoder did with the frames offered
    return {
        "size": f"{width}x{height}",
        "swap": swap,
        "search": "worker" if d.assembly is not None and d.assembly.tracker.search is not None else "frame",
        "seconds": seconds,
        "rounds": rounds,
        "segments": rows,
        **summarize(rows),
        "offered": tap.offered,
        "replaced": tap.replaced,  # by a newer frame before the encoder was free
        "stale": tap.stale,  # overwritten in the ring while the encoder read them
        "encoded": max(f.version for f in tap.frames.values()) if tap.frames else 0,
        "sent": tap.sent,  # parts the readers were sent (a repeat of a still picture counts)
        "load_average_start": load,
        "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench_obs_source.json")
    ap.add_argument("--swap", default="on", choices=("on", "off"), help="off: `vcam ctl swap off` (a busy machine)")
    ap.add_argument("--search", default="auto", choices=("auto", "worker", "frame"), help="[track] search")
    args = ap.parse_args(argv)
    w, _, h = args.size.lower().partition("x")
    with tempfile.TemporaryDirectory(prefix="vcam-bench-obs-source-") as tmp:
        folder = Path(tmp) / "run"
        folder.mkdir(mode=0o700)
        res = measure(int(w), int(h), args.seconds, args.rounds, folder, swap=args.swap == "on", search=args.search)
    what = "classic swap" if res["swap"] else "swap off"
    print(
        f"\n{args.size}, CPU demo ({what}, search {res['search']} ({args.search}), 30 fps camera), "
        f"{args.rounds} x {args.seconds:g} s per mode, alternated"
    )
    print(f"{'':34}{'off':>9}{'reader':>9}{'browser':>9}")
    for label, key, form in (
        ("daemon fps", "fps", "{:9.1f}"),
        ("daemon CPU ms a frame", "cpu_ms_per_frame", "{:9.1f}"),
        ("encoder CPU ms a frame", "encode_ms_per_frame", "{:9.2f}"),
        ("parts sent a second", "sent_per_s", "{:9.1f}"),
        ("Chromium CPU, cores", "chromium_cores", "{:9.2f}"),
        ("tap on the frame thread us", "tap_mean_us", "{:9.0f}"),
    ):
        print(f"{label:34}" + "".join(form.format(res[f"{key}_{m}"]) for m in MODES))
    print(f"{'fps / off (per round, median)':34}{'1':>9}{res['fps_ratio_reader']:9.3f}{res['fps_ratio_browser']:9.3f}")
    print(f"{'frames shown / published':34}{res['shown_ratio'] * 100:>26.1f}%")
    print(f"{'frames shown a second':34}{res['shown_per_s']:>27.1f}")
    print(f"{'page paints a second':34}{res['paints']:>27.1f}")
    print(f"{'published < 1 paint apart':34}{res['bunched'] * 100:>26.1f}%")
    print(f"{'not shown: never sent':34}{res['unsent'] * 100:>26.1f}%")
    print(f"{'not shown: sent < 1 paint before next':34}{res['sent_bunched'] * 100:>22.1f}%")
    print(f"{'publish-to-shown p50 / p99 ms':34}{res['p50_ms']:>19.0f} / {res['p99_ms']:.0f}")
    print(f"offered to the encoder {res['offered']}, replaced by a newer one {res['replaced']}, stale {res['stale']},")
    print(f"encoded {res['encoded']}, sent {res['sent']}")
    print(f"load average (1, 5, 15 min) at the start {res['load_average_start']}, at the end {res['load_average_end']}")
    return write_report(args.json, res)


if __name__ == "__main__":
    main()
