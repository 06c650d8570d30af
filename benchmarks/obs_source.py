"""The direct OBS source in a browser, as OBS's Browser Source shows it (issue 42).

    python -m benchmarks.obs_source [--size 1920x1080] [--seconds 10] [--rounds 2] [--swap on|off]
        [--json bench_obs_source.json]

The real daemon on the demo clip (CPU, classic swap, paced like a 30 fps camera) with ``--output
obs-source``, and headless Chromium opening the source's URL itself, as a Browser Source does (the
MJPEG answer is the page: Chromium's image document). Each published frame carries its number in a
strip of black and white 16-px blocks at its top left (written into the published frame after the
output took it, before the source's tap); a script in the page draws that strip of the shown
picture onto a canvas at every animation frame (same origin: readable) and notes each new number
with the time it was first seen. In one run, alternating (off, on, on, off, ...):

- ``off``: the page on ``about:blank`` (nobody watching: the source's tap returns at once);
- ``on``: the page showing the source.

Per mode: the daemon's published frames per second. Per ``on`` segment: frames shown / frames
published between the first and the last number seen, and publish-to-shown p50/p95 (the page's
clock and the daemon's are the same machine's). Prints a table and writes JSON. ``measure`` is what
tests/panel/test_panel_source.py runs, shorter and smaller.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import write_report

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
            self.published[n] = time.time()
            t0 = time.perf_counter()
            tap(st, data)  # the panel's preview and the source's offer: the frame thread's share
            self.tap_us.append((time.perf_counter() - t0) * 1e6)

        self.d.rounds.tap = stamped
        self.ready.set()


def on_segment(page: Any, url: str, seconds: float, published: dict[int, float]) -> dict:
    """The page on the source for ``seconds``: what it showed."""
    page.get(url)
    end = time.monotonic() + 30.0
    while time.monotonic() < end and not page.execute_script("return document.images.length && document.images[0].naturalWidth"):
        time.sleep(0.1)
    page.execute_script(WATCH % {"bits": BITS, "block": BLOCK})
    t0 = time.perf_counter()
    time.sleep(seconds)
    seen = page.execute_script("return window.seen") or []
    paints = page.execute_script("return window.ticks") / (time.perf_counter() - t0)  # animation frames a second
    page.get("about:blank")
    shown = {int(k): t / 1000.0 for k, t in seen if int(k) in published}
    if len(shown) < 2:
        return {"shown": len(shown), "published": 0, "paints": paints, "p50_ms": float("nan"), "p95_ms": float("nan")}
    first, last = min(shown), max(shown)
    lat = np.asarray([(t - published[k]) * 1000.0 for k, t in shown.items()])
    gaps = np.diff([published[k] for k in range(first, last + 1)])
    # frames the next one followed within one paint (a busy machine publishes in bursts): a display
    # showing the newest frame at each paint skips such a frame unless the path between re-spaces it
    bunched = int((gaps < 1.0 / max(paints, 1.0)).sum())
    return {
        "shown": len(shown),
        "published": last - first + 1,
        "paints": paints,
        "bunched": bunched,
        "p50_ms": float(np.percentile(lat, 50)),
        "p95_ms": float(np.percentile(lat, 95)),
    }


def measure(width: int, height: int, seconds: float, rounds: int, folder: Path, log=print, swap: bool = True) -> dict:
    """The run the module docstring describes; its segments and their medians. ``swap=False``:
    the swap switched off (`vcam ctl swap off`: detection and tracking still run), for a machine
    too busy to swap at the size asked."""
    from vcam.config_file import build
    from vcam.runtime.daemon import Daemon
    from vcam.stages.publish import open_output

    cfg = build(
        {
            "capture": {"input": "demo", "width": width, "height": height, "pacing": "realtime"},
            "pipeline": {"device": "cpu", "max_latency": 0},
            "degrade": {"enabled": False},  # the swap stays on in every segment: the modes compare
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
        summary = d.streams[0].summary
        for r in range(rounds):
            for on in (False, True) if r % 2 == 0 else (True, False):
                t0, n0, k0 = time.perf_counter(), summary.frames_out, len(stamper.tap_us)
                row: dict[str, Any] = {"on": on}
                if on:
                    row |= on_segment(page, stamper.url, seconds, stamper.published)
                else:
                    time.sleep(seconds)
                row["fps"] = (summary.frames_out - n0) / (time.perf_counter() - t0)
                taps = np.asarray(stamper.tap_us[k0:] or [0.0])
                row["tap_mean_us"], row["tap_max_us"] = float(taps.mean()), float(taps.max())
                rows.append(row)
                log(
                    f"  round {r + 1} source {'on ' if on else 'off'}: {row['fps']:.1f} fps"
                    + (f", shown {row['shown']}/{row['published']}, p50 {row['p50_ms']:.0f} ms" if on else "")
                    + (f", page {row['paints']:.0f} paints/s" if on else "")
                )
    finally:
        page.quit()
        d.stop()
    tap = d.up.panel.panel.source  # what the source's encoder did with the frames offered
    ons, offs = [x for x in rows if x["on"]], [x for x in rows if not x["on"]]
    fps_on, fps_off = float(np.median([x["fps"] for x in ons])), float(np.median([x["fps"] for x in offs]))
    return {
        "size": f"{width}x{height}",
        "swap": swap,
        "seconds": seconds,
        "rounds": rounds,
        "segments": rows,
        "shown_ratio": sum(x["shown"] for x in ons) / max(1, sum(x["published"] for x in ons)),
        "p50_ms": float(np.median([x["p50_ms"] for x in ons])),
        "p95_ms": float(np.median([x["p95_ms"] for x in ons])),
        "paints": float(np.median([x["paints"] for x in ons])),
        "bunched": sum(x.get("bunched", 0) for x in ons) / max(1, sum(x["published"] for x in ons)),
        "fps_on": fps_on,
        "fps_off": fps_off,
        "fps_ratio": fps_on / fps_off if fps_off else 0.0,
        "tap_mean_us_on": float(np.median([x["tap_mean_us"] for x in ons])),
        "tap_mean_us_off": float(np.median([x["tap_mean_us"] for x in offs])),
        "tap_max_us_on": max(x["tap_max_us"] for x in ons),
        "offered": tap.offered,
        "replaced": tap.replaced,  # by a newer frame before the encoder was free
        "stale": tap.stale,  # overwritten in the ring before the encoder copied them
        "encoded": max(f.version for f in tap.frames.values()) if tap.frames else 0,
        "sent": tap.sent,  # parts the page was sent (a repeat of a still picture counts)
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="bench_obs_source.json")
    ap.add_argument("--swap", default="on", choices=("on", "off"), help="off: `vcam ctl swap off` (a busy machine)")
    args = ap.parse_args(argv)
    w, _, h = args.size.lower().partition("x")
    with tempfile.TemporaryDirectory(prefix="vcam-bench-obs-source-") as tmp:
        folder = Path(tmp) / "run"
        folder.mkdir(mode=0o700)
        res = measure(int(w), int(h), args.seconds, args.rounds, folder, swap=args.swap == "on")
    what = "classic swap" if res["swap"] else "swap off"
    print(f"\n{args.size}, CPU demo ({what}, 30 fps camera), {args.rounds} x {args.seconds:g} s per mode")
    print(f"{'':28}{'value':>10}")
    print(f"{'frames shown / published':28}{res['shown_ratio'] * 100:>9.1f}%")
    print(f"{'publish-to-shown p50 ms':28}{res['p50_ms']:>10.0f}")
    print(f"{'publish-to-shown p95 ms':28}{res['p95_ms']:>10.0f}")
    print(f"{'page paints per second':28}{res['paints']:>10.0f}")
    print(f"{'published < 1 paint apart':28}{res['bunched'] * 100:>9.1f}%")
    print(f"{'daemon fps, source off':28}{res['fps_off']:>10.1f}")
    print(f"{'daemon fps, source on':28}{res['fps_on']:>10.1f}")
    print(f"{'fps on / off':28}{res['fps_ratio']:>10.3f}")
    taps = f"(off: {res['tap_mean_us_off']:.0f}; max on {res['tap_max_us_on']:.0f})"
    print(f"{'tap on the frame thread us':28}{res['tap_mean_us_on']:>10.0f} {taps}")
    print(f"offered to the encoder {res['offered']}, replaced by a newer one {res['replaced']}, stale {res['stale']},")
    print(f"encoded {res['encoded']}, sent to the page {res['sent']}")
    print(f"(1-min load average at the end: {res['load_average']})")
    return write_report(args.json, res)


if __name__ == "__main__":
    main()
