"""A remote swapper's server misbehaving during a live run, against a real Triton on 127.0.0.1
(tests/triton_server.py): paused (SIGSTOP), killed, slow, or answering malformed replies through a
fault-injecting gRPC proxy. The camera is a still image, so every published frame's face can be
compared with the input's: no frame carries the real face unless ``on_fault = "pass"``; the faces
without an answer are swapped locally within the budget; swapping goes back to the server within a
second of its return; the log has one line when the server goes down and one when it is back."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from triton_server import FAULTS, FaultProxy, export, free_ports, place_standins, start

from vcam import config_file
from vcam.runtime.daemon import Daemon
from vcam.stages import demo
from vcam.stages.outputs import NullOutput
from vcam.types import PixelFormat

W, H = 640, 360
TIMEOUT = 0.5  # the frame's budget for the server: generous, the machine is busy


class Faces(NullOutput):
    """Keeps, for each published frame, when it went out and how far its face differs from the input's."""

    def __init__(self, still: np.ndarray, box: tuple[int, int, int, int]) -> None:
        super().__init__(W, H, 30.0, fmt=PixelFormat.BGR)
        x1, y1, x2, y2 = box
        self.box = box
        self.real = still[y1:y2, x1:x2].astype(np.int16)
        self.times: list[float] = []
        self.diffs: list[float] = []

    def send(self, data):
        super().send(data)
        x1, y1, x2, y2 = self.box
        crop = np.asarray(data)[y1:y2, x1:x2].astype(np.int16)
        self.diffs.append(float(np.abs(crop - self.real).mean()))
        self.times.append(time.perf_counter())


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """A server of its own (the tests pause and kill it) on fixed ports, the still camera image and
    the inner part of its face box."""
    root = tmp_path_factory.mktemp("faults")
    models = place_standins(root / "models")
    repo = export(models, root / "repo", served=(("inswapper_128", "inswapper_128", False, False),))
    ports = free_ports(3)
    server = start(repo, ports=ports, log=root / "server.log")
    clip = demo.DemoClip(W, H)
    still = clip.frame(0)
    cv2.imwrite(str(root / "still.png"), still)
    x1, y1, x2, y2 = clip.truth(0)[0]
    dx, dy = 0.3 * (x2 - x1), 0.3 * (y2 - y1)  # the middle of the face: inside any paste mask
    box = (int(x1 + dx), int(y1 + dy), int(x2 - dx), int(y2 - dy))
    rig = {"server": server, "repo": repo, "ports": ports, "models": models, "root": root, "still": still, "box": box}
    yield rig
    rig["server"].stop()


@pytest.fixture
def served(rig):
    """The rig with its server up: a server paused and resumed by the test before may die after
    that test ended (Triton's Python backend, with calls in flight), or a test killed it; a run
    started against a dead one starts with it down (tested on its own). Started again here, where
    it is not running."""
    server = rig["server"]
    if server.proc.poll() is not None:
        server.stop()
        rig["server"] = start(rig["repo"], ports=rig["ports"], log=rig["root"] / "server.log")
    else:
        rig["server"].wait_ready(60)
    return rig


def _cfg(rig, url: str, faces: Path, **engine):
    return config_file.build(
        {
            "capture": {"input": str(rig["root"] / "still.png"), "width": W, "height": H, "pacing": "realtime"},
            "models": {"dir": str(rig["models"])},
            "faces": {"dir": str(faces)},
            "pipeline": {"backend": "onnxruntime", "device": "cpu", "max_latency": 0, "max_faces": 2},
            "swap": {"swapper": "inswapper_128", "source": str(Path(demo.__file__).parents[1] / "assets" / "astronaut.jpg")},
            "output": {"target": "null"},
            "status": {"interval": "0.1s"},
            "engines": {"swapper": {"backend": "remote", "url": url, "timeout": f"{TIMEOUT}s", **engine}},
        }
    )


class Live:
    """A daemon running in the background with its swaps recorded: ``(time, faces, faces without a
    good answer)`` per call, and the remote engine's log lines."""

    def __init__(self, rig, url: str, faces: Path, **engine) -> None:
        self.out = Faces(rig["still"], rig["box"])
        self.d = Daemon(_cfg(rig, url, faces, **engine), output=self.out, control=False)
        self.swaps: list[tuple[float, int, int]] = []
        self.lines: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda rec: self.lines.append(rec.getMessage())  # type: ignore[method-assign]
        handler.setLevel(logging.INFO)
        self.handler = handler

    def __enter__(self) -> Live:
        logging.getLogger("vcam.engines.remote").addHandler(self.handler)
        self.d.start()
        assert self.d.ready.wait(120), "the daemon did not start"
        assert self.d.assembly is not None, f"the daemon ended at start-up: {self.d.summary.error or self.d.summary.line()}"
        self.sw = self.d.assembly.swapper
        eng = self.eng = self.sw.engine
        wait = eng.wait

        def recorded(handle):
            outs = wait(handle)
            self.swaps.append((time.perf_counter(), handle[0], eng.last_failed))
            return outs

        eng.wait = recorded
        assert self.until(lambda: self.good_after(0) >= 10 and not eng.in_episode, 60), "no swapping through the server"
        self.lines.clear()  # a server still coming up at the start (it starts down, then back): not the test's episode
        return self

    def __exit__(self, *exc) -> None:
        self.d.stop()
        logging.getLogger("vcam.engines.remote").removeHandler(self.handler)

    def good_after(self, t: float) -> int:
        return sum(1 for s, n, f in self.swaps if s > t and n and not f)

    def first_good_after(self, t: float) -> float:
        return next(s for s, n, f in self.swaps if s > t and n and not f)

    def faulted(self, t0: float, t1: float) -> int:
        return sum(f for s, n, f in self.swaps if t0 <= s <= t1)

    @staticmethod
    def until(cond, limit: float) -> bool:
        end = time.perf_counter() + limit
        while not cond() and time.perf_counter() < end:
            time.sleep(0.01)
        return bool(cond())

    def frames(self, t0: float, t1: float = float("inf")) -> tuple[np.ndarray, np.ndarray]:
        """(times, face differences) of the frames published between ``t0`` and ``t1``."""
        times, diffs = np.array(self.out.times), np.array(self.out.diffs)
        keep = (times >= t0) & (times <= t1)
        return times[keep], diffs[keep]

    def swapped_from(self) -> float:
        """When the first frame with a swapped face went out (the early frames before it are
        pixelated or the camera's own: the pipeline's business, not the server's)."""
        return self.swaps[0][0]

    def real_face_threshold(self) -> float:
        """Below this a published face is the camera's own: a fifth of the least difference while
        the server swapped (the input itself differs by nothing)."""
        healthy = self.frames(self.swapped_from() + 0.2, self.t_fault)[1]
        assert len(healthy) > 5
        return 0.2 * float(healthy.min())


def _healthy_gap(live: Live) -> float:
    times = live.frames(live.swapped_from() + 0.2, live.t_fault)[0]
    return float(np.diff(times).max())


def _answers(server) -> bool:
    """Whether ``server`` answers an inference of its own of the served swapper (zeros), from a
    client of the test's, within 5 s: a server that does not is broken on its side."""
    import tritonclient.grpc as tc

    if server.proc.poll() is not None:
        return False
    client = tc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        meta = client.get_model_metadata("inswapper_128", as_json=True, client_timeout=5.0)
        inputs = []
        for spec in meta["inputs"]:
            shape = [1 if int(d) < 0 else int(d) for d in spec["shape"]]
            inp = tc.InferInput(spec["name"], shape, spec["datatype"])
            inp.set_data_from_numpy(np.zeros(shape, dtype=tc.triton_to_np_dtype(spec["datatype"])))
            inputs.append(inp)
        client.infer("inswapper_128", inputs, client_timeout=5.0)
        return True
    except Exception as exc:
        print(f"the server does not answer a call of the test's own: {exc}")
        return False
    finally:
        client.close()


def _pause(server) -> None:
    os.kill(-server.proc.pid, signal.SIGSTOP)  # the worker and its tritonserver: one process group


def _resume(server) -> None:
    os.kill(-server.proc.pid, signal.SIGCONT)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault,on_fault", [("pause", "local"), ("slow", "local"), ("kill", "local"), ("pause", "pass"), ("pause", "pixelate")]
)
def test_a_paused_slow_or_killed_server_never_shows_the_real_face(served, tmp_path, fault, on_fault):
    rig = served
    server = rig["server"]
    proxy = FaultProxy(f"127.0.0.1:{rig['ports'][0]}", delay=2 * TIMEOUT) if fault == "slow" else None
    url = proxy.url if proxy else server.url
    try:
        with Live(rig, url, tmp_path / "faces", on_fault=on_fault) as live:
            time.sleep(1.0)
            live.t_fault = time.perf_counter()
            if fault == "pause":
                _pause(server)
            elif fault == "slow":
                proxy.fault = "slow"
            else:
                server.kill()
            time.sleep(3.0)
            t_out = time.perf_counter()
            if fault == "pause":
                _resume(server)
            elif fault == "slow":
                proxy.fault = ""
            else:
                server = rig["server"] = start(rig["repo"], ports=rig["ports"], log=rig["root"] / "server.log")
            t_back = time.perf_counter()
            if fault == "pause":  # Triton's Python backend (both server kinds) may die resumed with calls in flight
                live.until(lambda: live.good_after(t_back) >= 3 or server.proc.poll() is not None, 10)
                if live.good_after(t_back) < 3 and not _answers(server):  # the server's fault, not the client's
                    print("the paused server no longer answers once resumed (crashed, or its backend died): started again")
                    server.stop()
                    server = rig["server"] = start(rig["repo"], ports=rig["ports"], log=rig["root"] / "server.log")
                    t_back = time.perf_counter()
            assert live.until(lambda: live.good_after(t_back) >= 3, 10), "swapping did not go back to the server"
            time.sleep(0.5)
    finally:
        if proxy is not None:
            proxy.close()
    resumed = live.first_good_after(t_back) - t_back
    during = live.frames(live.t_fault, t_out)[0]  # the server out, nothing else going on
    restart = live.frames(t_out, t_back)[0]  # a Triton starting again on the same two cores: frames come late
    after = live.frames(live.swapped_from() + 0.2)[1]
    limit = live.real_face_threshold()
    real = int((after < limit).sum())
    faulted = live.faulted(live.t_fault, t_back)
    gap = float(np.diff(during).max())
    print(
        f"{fault}/{on_fault}: {len(during)} frames while the server was out, longest gap {gap:.3f} s "
        f"(healthy {_healthy_gap(live):.3f} s), {faulted} faces without an answer, "
        f"{live.sw.swapped_locally} swapped locally, {real} of {len(after)} frames with the real face; "
        f"back to the server {resumed:.2f} s after its return; log: {live.lines}"
    )
    assert faulted > 0
    if on_fault == "pass":  # the comparison sees the real face where it goes out
        assert real > 0, "the real face went out unseen: the comparison proves nothing"
    else:
        assert real == 0, f"{real} published frames carried the real face"
    if on_fault == "local":
        assert live.sw.swapped_locally >= faulted
        assert "remote late/down, swapped locally" in live.d.summary.line()
    # Frames keep coming within the budget: no gap over the server's timeout beyond the healthy rhythm.
    assert len(during) > 10 and gap <= max(TIMEOUT + 0.5, 3 * _healthy_gap(live)), f"longest gap {gap:.3f} s"
    if len(restart) > 1:
        slow = float(np.diff(restart).max())
        assert slow <= max(1.5, 4 * _healthy_gap(live)), f"longest gap {slow:.3f} s while the server started again"
    assert resumed <= 1.0, f"swapping went back to the server {resumed:.2f} s after its return"
    downs = [ln for ln in live.lines if "down since" in ln]
    assert len(downs) == 1 and len(live.lines) <= 2, live.lines


@pytest.mark.slow
def test_a_live_run_survives_every_malformed_answer_with_one_line_per_episode(served, tmp_path):
    rig = served
    proxy = FaultProxy(f"127.0.0.1:{rig['ports'][0]}", delay=2 * TIMEOUT)
    episodes: list[tuple[str, float, float, int]] = []  # (fault, start, end, log lines before it)
    try:
        with Live(rig, proxy.url, tmp_path / "faces") as live:
            time.sleep(0.5)
            live.t_fault = time.perf_counter()
            for fault in FAULTS:
                before, t0 = len(live.lines), time.perf_counter()
                proxy.fault = fault
                assert live.until(lambda t0=t0: live.faulted(t0, float("inf")) >= 8, 20), f"{fault}: no fault seen"
                time.sleep(0.5)
                proxy.fault = ""
                t1 = time.perf_counter()
                assert live.until(lambda t1=t1: live.good_after(t1) >= 5 and not live.eng.in_episode, 20), (
                    f"{fault}: swapping did not go back to the server"
                )
                episodes.append((fault, t0, t1, before))
            live.until(lambda: any("swapped locally" in e for e in live.d.state.read_status().engines), 2)
            notes = live.d.state.read_status().engines
            alive = live.d._thread is not None and live.d._thread.is_alive()
            error = live.d.summary.error
    finally:
        proxy.close()
    assert alive and error is None, f"the run stopped: {error}"
    limit = live.real_face_threshold()
    for k, (fault, t0, t1, before) in enumerate(episodes):
        times, diffs = live.frames(t0, t1)
        lines = live.lines[before : episodes[k + 1][3] if k + 1 < len(episodes) else len(live.lines)]
        assert len(times) >= 5, f"{fault}: {len(times)} frames published while it lasted"
        assert (diffs >= limit).all(), f"{fault}: the real face went out"
        assert np.diff(times).max() <= max(TIMEOUT + 0.5, 3 * _healthy_gap(live)), f"{fault}: frames stopped"
        assert len(lines) <= 2 and sum("down since" in ln for ln in lines) <= 1, f"{fault}: {lines}"
    assert live.sw.swapped_locally > 0
    assert any(e.startswith("swapper: remote late/down, swapped locally ") for e in notes), notes
    print(f"{len(FAULTS)} faults, {live.sw.swapped_locally} faces swapped locally; log: {live.lines}")


@pytest.mark.slow
def test_a_run_started_while_the_server_is_down_swaps_locally_from_its_first_frame(served, tmp_path):
    """The server is not there when ``vcam run`` starts (not started yet, or gone): the run starts
    all the same, with the server down (one line), its faces swapped locally from the first swapped
    frame; once the server is up, its model is read and checked and swapping goes to it within a
    second."""
    rig = served
    rig["server"].kill()
    rig["server"].proc.wait(30)
    out = Faces(rig["still"], rig["box"])
    d = Daemon(_cfg(rig, rig["server"].url, tmp_path / "faces"), output=out, control=False)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda rec: lines.append(rec.getMessage())  # type: ignore[method-assign]
    logging.getLogger("vcam.engines.remote").addHandler(handler)
    try:
        d.start()
        assert d.ready.wait(120) and d.assembly is not None, f"the run ended at start-up: {d.summary.error}"
        sw = d.assembly.swapper
        eng = sw.engine
        assert eng.down and not eng.described
        assert Live.until(lambda: sw.swapped_locally >= 20, 60), "no face swapped locally"
        t_down = time.perf_counter()
        time.sleep(1.0)
        rig["server"] = start(rig["repo"], ports=rig["ports"], log=rig["root"] / "server.log")
        t_back = time.perf_counter()
        n_local = sw.swapped_locally
        calls: list[tuple[float, int]] = []
        wait = eng.wait

        def recorded(handle):
            outs = wait(handle)
            calls.append((time.perf_counter(), handle[0] - eng.last_failed))
            return outs

        eng.wait = recorded
        assert Live.until(lambda: sum(1 for _, good in calls if good) >= 5, 15), "swapping did not go to the server"
        resumed = next(t for t, good in calls if good) - t_back
        n_served = sum(1 for _, good in calls if good)
        times, diffs = np.array(out.times), np.array(out.diffs)
    finally:
        d.stop()
        logging.getLogger("vcam.engines.remote").removeHandler(handler)
    swapped = diffs[times >= t_down]  # the frames swapped locally, then by the server
    print(
        f"{n_local} faces swapped locally before the server started, {n_served} by it after; back "
        f"{resumed:.2f} s after it answered; face differences min {swapped.min():.1f}; log: {lines}"
    )
    assert eng.described and not eng.in_episode
    assert d.summary.error is None
    assert resumed <= 1.0, f"swapping went to the server {resumed:.2f} s after it was up"
    # No frame with the real face, through the whole run: the input differs from itself by nothing.
    assert swapped.min() > 5.0, f"a frame went out with the real face (difference {swapped.min():.1f})"
    assert "unreachable at start" in lines[0] and "swapped locally" in lines[0], lines
    assert sum("down since" in ln for ln in lines) == 1 and len(lines) <= 2, lines
