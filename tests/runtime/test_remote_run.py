"""The daemon swapping through a real Triton server (tests/triton_server.py): the same pixels as the
local swap, `vcam run --config remote.toml` end to end, and a server killed mid-run: the published
stream never stops, the faces are swapped locally and counted, the status says the server is down,
and swapping resumes once it is back (tests/runtime/test_remote_faults.py: the faces compared)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import vcam_cli
from triton_server import export, free_ports, place_standins, start

from vcam import config_file
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput
from vcam.types import PixelFormat


class Timed(NullOutput):
    """Keeps each published frame (BGR) and when it went out."""

    def __init__(self, w: int, h: int, keep: bool = False) -> None:
        super().__init__(w, h, 30.0, fmt=PixelFormat.BGR)
        self.times: list[float] = []
        self.kept: list[np.ndarray] = []
        self.keep = keep

    def send(self, data):
        super().send(data)
        self.times.append(time.perf_counter())
        if self.keep:
            self.kept.append(np.array(data, copy=True))


def _cfg(models: Path, faces: Path, url: str = "", pacing: str = "fast", **engine):
    data = {
        "capture": {"input": "demo", "width": 640, "height": 360, "pacing": pacing},
        "models": {"dir": str(models)},
        "faces": {"dir": str(faces)},
        "pipeline": {"backend": "onnxruntime", "device": "cpu", "max_latency": 0, "max_faces": 2},
        "swap": {"swapper": "inswapper_128"},
        "output": {"target": "null"},
        "status": {"interval": "0.1s"},
    }
    if url:
        data["engines"] = {"swapper": {"backend": "remote", "url": url, "timeout": "5s", **engine}}
    return config_file.build(data)


def _run(cfg, frames: int) -> list[np.ndarray]:
    out = Timed(640, 360, keep=True)
    d = Daemon(cfg, output=out, control=False)
    d.run(max_frames=frames)
    return out.kept


@pytest.mark.slow
def test_the_daemon_through_the_server_publishes_the_local_pixels(triton, tmp_path):
    server, models = triton
    local = _run(_cfg(models, tmp_path / "a"), 6)
    remote = _run(_cfg(models, tmp_path / "b", server.url), 6)
    assert len(local) == len(remote) == 6
    diffs = [int(np.abs(a.astype(int) - b.astype(int)).max()) for a, b in zip(local, remote)]
    assert max(diffs) <= 1, diffs
    base = _cfg(models, tmp_path / "c")
    classic = _run(base.replace(swap=replace(base.swap, swapper="classic")), 6)
    changed = [int((a != b).any(axis=2).sum()) for a, b in zip(local, classic)]
    assert min(changed) > 500, "no face was swapped: the comparison would prove nothing"


@pytest.mark.slow
def test_vcam_run_with_a_remote_config_file(triton, tmp_path):
    server, models = triton
    toml = tmp_path / "remote.toml"
    toml.write_text(
        f"""[models]\ndir = '{models}'\n[faces]\ndir = '{tmp_path / "faces"}'\n[swap]\nswapper = 'inswapper_128'\n"""
        f"""[engines.swapper]\nbackend = "remote"\nurl = "{server.url}"\ntimeout = "5s"\n"""
    )
    out = tmp_path / "out.mp4"
    res = vcam_cli("run", "--config", str(toml), "--input", "demo", "--output", f"file:{out}", "--frames", "5", "--device", "cpu")
    assert res.returncode == 0, res.stderr[-2000:]
    assert out.stat().st_size > 0
    assert f"remote inswapper_128 at {server.url.split('//')[1]}" in res.stdout + res.stderr


@pytest.mark.slow
def test_a_killed_server_never_stops_the_stream_and_swapping_resumes(tmp_path):
    models = place_standins(tmp_path / "models")
    repo = export(models, tmp_path / "repo", served=(("inswapper_128", "inswapper_128", False, False),))
    ports = free_ports(3)
    server = start(repo, ports=ports, log=tmp_path / "server.log")
    cfg = _cfg(models, tmp_path / "faces", server.url, pacing="realtime", timeout="0.5s")
    out = Timed(640, 360)
    swaps: list[tuple[float, int, int]] = []  # (time, faces, faces without an answer)
    d = Daemon(cfg, output=out, control=False)
    d.start()
    try:
        assert d.ready.wait(120), "the daemon did not start"
        eng = d.assembly.swapper.engine
        wait = eng.wait

        def recorded(handle):
            outs = wait(handle)
            swaps.append((time.perf_counter(), handle[0], eng.last_failed))
            return outs

        eng.wait = recorded

        def until(cond, limit):
            end = time.perf_counter() + limit
            while not cond() and time.perf_counter() < end:
                time.sleep(0.01)
            return cond()

        assert until(lambda: sum(1 for _, n, f in swaps if n and not f) >= 10, 60), "no swapping before the kill"
        t_kill = time.perf_counter()
        server.kill()
        assert until(lambda: eng.down, 5), "the engine did not notice the server is gone"
        assert until(lambda: any("down since" in e for e in d.state.read_status().engines), 5)
        note = d.state.read_status().engines[0]
        assert note.startswith(f"swapper: remote 127.0.0.1:{ports[0]} down since "), note
        time.sleep(2.0)
        t_restart = time.perf_counter()
        server = start(repo, ports=ports, log=tmp_path / "server.log")  # about 10 s of start-up
        t_back = time.perf_counter()
        assert until(lambda: any(t > t_back and n and not f for t, n, f in swaps), 10), "swapping did not resume"
        t_resumed = next(t for t, n, f in swaps if t > t_back and n and not f)
        time.sleep(0.5)
    finally:
        d.stop()
        server.stop()
    # While the server is down: the bound is 0.2 s; on a loaded machine frames come late whatever the
    # server does, so the healthy stretch before the kill is the yardstick too.
    down = [t for t in out.times if t_kill - 0.5 <= t <= t_restart]
    gaps = np.diff(down)
    healthy = np.diff([t for t in out.times if t < t_kill])
    allowed = max(0.2, 1.5 * float(healthy.max()))
    assert len(down) > 20 and gaps.max() <= allowed, (
        f"longest gap {gaps.max():.3f} s over {len(down)} frames while down (healthy: {healthy.max():.3f} s)"
    )
    # While a new Triton starts (on the same two cores here) and swapping resumes: never a stop.
    back = np.diff([t for t in out.times if t_restart <= t <= t_resumed + 0.5])
    assert len(back) > 10 and back.max() <= max(1.0, 3 * float(healthy.max())), f"longest gap {back.max():.3f} s"
    passed = sum(f for t, n, f in swaps if t_kill <= t <= t_back)
    # on_fault = "local" (the default): those faces were swapped here, counted apart from the NaN guard
    assert passed > 0 and d.assembly.swapper.swapped_locally >= passed
    assert d.summary.swapped_locally >= passed and d.summary.guarded.get("inswapper_128", 0) == 0
    print(
        f"kill: {len(down)} frames while down, longest gap {gaps.max():.3f} s (healthy {healthy.max():.3f} s), "
        f"{passed} faces swapped locally, swapping resumed {t_resumed - t_back:.2f} s after the server was back"
    )
    assert t_resumed - t_back <= 2.0, f"swapping resumed {t_resumed - t_back:.2f} s after the server was back"
