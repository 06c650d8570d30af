"""Audio in sync against a real OBS: how close OBS's audio sync offset stays to the video delay vcam
reports, and how soon it follows a change of load (:mod:`vcam.control.obs_audio`).

    python -m benchmarks.audio_sync [--phase 12] [--load-ms 60] [--json OUT]

Starts OBS under Xvfb (the tests' harness), an audio input "Mic/Aux" with its own offset of -20 ms,
and the daemon on the 320x240 demo (CPU, classic swap) with ``[obs] audio_sync = ["Mic/Aux"]``.
Three phases of ``--phase`` seconds: light, ``--load-ms`` more per frame (slept in the round hook),
light again. Every 0.25 s it reads the offset back from OBS and ``av_delay_ms`` from the state. It
prints the offset's distance to the figure (p50, p99, max; the first setting and the 3.5 s after
each load change left out: the figure moves first, the offset follows at most every 3 s), the
settings made, the time from each load change until the offset moved by half the load, and
whether the input's own offset was back after the daemon stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", type=float, default=12.0)
    ap.add_argument("--load-ms", type=float, default=60.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from obs_harness import CapturingOutput, ObsInstance, demo_daemon_config, solid_faces

    from vcam.config import ObsConfig
    from vcam.control.obs_scene import connect
    from vcam.runtime.daemon import Daemon
    from vcam.state import RuntimeState

    work = Path(tempfile.mkdtemp(prefix="vcam-audio-sync-"))
    load = {"s": 0.0}

    def hook(mark) -> None:
        if mark.phase == "begun" and load["s"]:
            time.sleep(load["s"])

    with ObsInstance(work / "obs") as obs:
        ocfg = ObsConfig(enabled=True, port=obs.port, password=obs.password, password_env="", audio_sync=["Mic/Aux"])
        client = connect(ocfg)
        scene = client.get_current_program_scene().current_program_scene_name
        client.create_input(scene, "Mic/Aux", "pulse_input_capture", {}, True)
        client.set_input_audio_sync_offset("Mic/Aux", -20)
        state = RuntimeState(solid_faces(("alice",)), active="alice")
        cfg = demo_daemon_config(work / "vcam.sock", obs=ocfg)
        daemon = Daemon(cfg, state=state, output=CapturingOutput(), hook=hook)
        daemon.start()
        samples, changes = [], []
        try:
            if not daemon.ready.wait(120):
                raise SystemExit("the daemon did not start")
            t0 = time.perf_counter()
            for i, s in enumerate((0.0, args.load_ms / 1000, 0.0)):
                load["s"] = s
                changes.append(time.perf_counter() - t0)
                end = t0 + (i + 1) * args.phase
                while time.perf_counter() < end:
                    off = int(client.get_input_audio_sync_offset("Mic/Aux").input_audio_sync_offset)
                    samples.append((time.perf_counter() - t0, off, state.read_status().av_delay_ms, s))
                    time.sleep(0.25)
        finally:
            daemon.stop()
        restored = int(client.get_input_audio_sync_offset("Mic/Aux").input_audio_sync_offset) == -20
        client.disconnect()
    report = summarise(samples, changes, args.load_ms, restored)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"report": report, "samples": samples}, indent=1))
    return 0


def summarise(samples: list, changes: list[float], load_ms: float, restored: bool) -> dict:
    set_at = [s for s in samples if s[1] != -20]
    first = set_at[0][0] if set_at else float("inf")
    settled = [s for s in set_at if s[0] > first and not any(c < s[0] < c + 3.5 for c in changes[1:])]
    gap = np.abs(np.array([s[1] - s[2] for s in settled])) if settled else np.zeros(1)
    follow = []
    for c in changes[1:]:
        before = next((s[1] for s in reversed(samples) if s[0] <= c), None)
        moved = next((s[0] - c for s in samples if s[0] > c and before is not None and abs(s[1] - before) >= load_ms / 2), None)
        follow.append(None if moved is None else round(moved, 2))
    offsets = [s[1] for s in samples]
    return {
        "first_set_s": round(first, 2),
        "gap_ms_p50": round(float(np.percentile(gap, 50)), 2),
        "gap_ms_p99": round(float(np.percentile(gap, 99)), 2),
        "gap_ms_max": round(float(gap.max()), 2),
        "settings_seen": sum(1 for a, b in zip(offsets, offsets[1:]) if a != b),
        "offset_light_heavy_light_ms": [
            int(np.median([s[1] for s in samples if c + 4 < s[0] <= c2]))
            for c, c2 in zip(changes, changes[1:] + [samples[-1][0]])
        ],
        "follow_s": follow,
        "restored_at_exit": restored,
    }


if __name__ == "__main__":
    raise SystemExit(main())
