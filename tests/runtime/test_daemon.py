"""The daemon end to end on the demo clip: clean start/stop, latency budget, CLI messages."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import POSIX_SIGNALS, at_terminal, demo_run, ended, need_torch, vcam_cli, windows_lacks
from typer.testing import CliRunner

from vcam.cli import app, format_status
from vcam.config import Config, Duration
from vcam.platform.signals import STOP_SIGNALS
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput
from vcam.state import Status
from vcam.status import RunSummary, status_suffix
from vcam.types import PixelFormat


def demo_cfg(**capture):
    cfg = Config()
    cap = dict(input="demo", width=640, height=360, pacing="fast")
    cap.update(capture)
    return cfg.replace(
        capture=replace(cfg.capture, **cap),
        pipeline=replace(cfg.pipeline, device="cpu", max_latency=Duration(0)),
        output=replace(cfg.output, target="null"),
    )


class Capturing(NullOutput):
    def __init__(self, w, h, fmt=PixelFormat.I420):
        super().__init__(w, h, 30.0, fmt=fmt)
        self.frames_seen = []

    def send(self, data):
        super().send(data)
        self.frames_seen.append(np.array(data, copy=True))


@pytest.mark.slow
def test_daemon_runs_demo_and_stops_cleanly():
    out = Capturing(640, 360)
    before = set(threading.enumerate())
    d = Daemon(demo_cfg(), output=out, control=False)
    s = d.run(max_frames=25)
    assert s.frames_in == 25 and s.frames_out == 25
    assert len(out.frames_seen) == 25 and out.frames_seen[0].shape == (540, 640)
    assert out.closed
    assert d.state.active == "astronaut"
    time.sleep(0.2)
    left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
    assert not left, left
    # The swap really happened: with swap off the same frames come out different.
    off = Capturing(640, 360)
    d2 = Daemon(demo_cfg(), output=off, control=False)
    d2.state.set_swap("off")
    d2.run(max_frames=3)
    assert np.abs(off.frames_seen[0].astype(int) - out.frames_seen[0]).mean() > 0.1


def test_the_end_of_a_run_stops_the_swappers_background_compile(monkeypatch):
    """A run inside a longer process (tests, a library user) never leaves its compile job running:
    the daemon's shutdown stops it (``Assembly.stop_builds`` closes the swap engine's loader)."""
    from types import SimpleNamespace

    from vcam.runtime.assemble import Assembly

    closed: list[str] = []
    stand_in = SimpleNamespace(
        swapper=SimpleNamespace(engine=SimpleNamespace(loader=SimpleNamespace(close=lambda: closed.append("loader"))))
    )
    Assembly.stop_builds(stand_in)  # type: ignore[arg-type]
    assert closed == ["loader"]
    Assembly.stop_builds(SimpleNamespace(swapper=SimpleNamespace()))  # type: ignore[arg-type]  # no engine (classic): nothing to stop
    calls: list[int] = []
    monkeypatch.setattr(Assembly, "stop_builds", lambda self: calls.append(len(calls)))
    d = Daemon(demo_cfg(), output=Capturing(640, 360), control=False)
    assert d.run(max_frames=3).frames_out == 3
    assert calls == [0]


@pytest.mark.slow
def test_the_search_worker_runs_and_stops_with_the_daemon():
    """``[track] search = worker``: the rolling search runs in its thread while faces are tracked,
    no frame has a scheduled full scan, and the thread is gone once the daemon has stopped."""
    cfg = demo_cfg()
    cfg = cfg.replace(track=replace(cfg.track, search="worker", rescan_every=5))
    out = Capturing(640, 360)
    d = Daemon(cfg, output=out, control=False)
    s = d.run(max_frames=20)
    assert s.frames_out == 20
    search = d.streams[0].pipeline.tracker.search
    assert search is not None and search.searches >= 1  # every 3 frames when the machine has a core to spare
    assert s.full_scans == 1  # the first frame; rescan_every 5 would have made 4
    time.sleep(0.2)
    assert not any(t.name == "vcam-search" and t.is_alive() for t in threading.enumerate())


@pytest.mark.slow
def test_a_paced_daemon_applies_each_predicted_frames_detection_while_it_waits():
    """Frames from a camera (paced) leave the frame loop idle between them: there it applies the
    detection of the frame swapped with predicted faces (``[track] predict``), so the next frame
    does not pay for it; every frame is still published. (At 10 fps the loop, about 10 ms a frame
    here, waits for most frames even on a busy machine; a frame already there when the loop comes
    back is not waited for, and its detection is applied at its start as before.)"""
    cfg = demo_cfg(pacing="realtime", fps=10.0)
    cfg = cfg.replace(track=replace(cfg.track, predict="on"))
    out = Capturing(640, 360)
    d = Daemon(cfg, output=out, control=False)
    s = d.run(max_frames=16)
    pipe = d.streams[0].pipeline
    assert s.frames_out == 16 and len(out.frames_seen) == 16 + s.early_frames
    assert pipe.predicted >= 10, pipe.predicted
    assert pipe.settled >= pipe.predicted // 2, (pipe.settled, pipe.predicted)


def test_latency_budget_drops_and_counts():
    cfg = demo_cfg(pacing="realtime")  # as a camera: lossless delivery never drops
    cfg = cfg.replace(pipeline=replace(cfg.pipeline, max_latency=Duration(1e-6)))
    out = Capturing(640, 360)
    s = Daemon(cfg, output=out, control=False).run(max_frames=10)
    assert s.frames_in == 10
    # Every frame is over a 1 us budget: most are dropped, and one goes out whenever nothing has for
    # the refresh interval (late, counted), so the camera never freezes; each frame is accounted for.
    assert s.frames_out >= 1 and s.published_late == s.frames_out
    assert s.frames_out + s.dropped_latency == 10
    assert out.frames == s.early_frames + s.frames_out


def test_status_line_shows_budget_exceeded():
    st = Status(fps_in=30, fps_out=12, latency_p50_ms=40, latency_p99_ms=80, over_budget=True, faces=1)
    line = format_status(st, "astronaut", True)
    assert "OVER LATENCY BUDGET" in line and "face astronaut" in line and "p99  80.0 ms" in line


def test_a_conversion_over_before_the_first_status_update_still_ends_with_its_bar(monkeypatch):
    """A short file converts in under a second, before the daemon's first status update: the
    terminal still shows the finished bar (CI saw only "starting..." once)."""
    import io

    from rich.console import Console

    import vcam.cli.run as run_cli
    from vcam.status import RunSummary

    out = io.StringIO()
    monkeypatch.setattr(run_cli, "console", Console(file=out, force_terminal=True, width=120))
    line = run_cli._StatusLine(enabled=True)
    line.summaries = lambda: {"cam": RunSummary(frames_out=120, frames_total=120, seconds=0.8)}
    with line:
        pass  # no update: the run ended first
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "converting" in screen and "120/120 frames 150.0 fps" in screen, screen


def test_status_logged_off_a_terminal_carries_no_markup(caplog):
    """`vcam -v run ... 2>log`: the status goes to the log as plain text (no `[bold red]`), a face
    name with brackets kept as it is."""
    import logging

    from vcam.cli.run import _StatusLine

    caplog.set_level(logging.INFO, logger="vcam.status")
    st = Status(fps_in=30, fps_out=12, latency_p50_ms=40, latency_p99_ms=80, over_budget=True, faces=1)
    _StatusLine(enabled=True).update(st, "[me]", True)
    _StatusLine(enabled=True).update_stream("cam[2]", st, "me", True)
    logged = [r.getMessage() for r in caplog.records if r.name == "vcam.status"]
    assert len(logged) == 2 and all("OVER LATENCY BUDGET" in m for m in logged), logged
    assert not any("[/" in m or "[bold" in m or "\\" in m for m in logged), logged
    assert "face [me]" in logged[0] and logged[1].startswith("cam[2] in ")


def test_nan_guard_counts_are_per_model_in_status_and_summary():
    st = Status(guarded={"inswapper_128": 3, "gfpgan_1.4": 0})
    assert st.guarded_total == 3 and st.guard_text() == "NaN guard: inswapper_128 3"
    assert status_suffix(st) == " | NaN guard: inswapper_128 3"
    assert status_suffix(Status(guarded={"inswapper_128": 0})) == "" and status_suffix(Status()) == ""
    assert st.as_dict()["guarded"] == {"inswapper_128": 3, "gfpgan_1.4": 0}
    line = RunSummary(guarded={"inswapper_128": 3, "gfpgan_1.4": 1}).line()
    assert line.endswith("; 4 faces passed through (NaN guard: inswapper_128 3, gfpgan_1.4 1)"), line
    assert "passed through" not in RunSummary(guarded={"inswapper_128": 0}).line()


@pytest.mark.slow
def test_daemon_publishes_the_guard_counts_of_each_model():
    """The frame loop reads the pipeline's per-model counts at each status interval."""
    cfg = demo_cfg(pacing="realtime")
    cfg = cfg.replace(status=replace(cfg.status, interval=Duration(0.05)))
    seen: list[Status] = []
    d = Daemon(cfg, output=Capturing(640, 360), control=False, on_status=lambda st, face, swap: seen.append(st))
    d.start()
    try:
        assert d.ready.wait(30)
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen, "no status within 30 s"
        assert seen[-1].guarded == {"classic": 0} and d.state.read_status().guarded == {"classic": 0}
    finally:
        d.stop()
    assert d.summary.guarded == {"classic": 0}


def test_stop_signals_held_while_an_output_opens_are_handled_on_the_way_out():
    """Two Ctrl-C while an output is being opened: nothing happens inside (the output reaches the
    stream first, where a forced exit's salvage finds it), then the first asks to stop and the
    second forces the exit."""
    d = Daemon(Config(), control=False)
    with pytest.raises(SystemExit) as exc:
        with d.held_signals():
            d.handle_exit(signal.SIGINT, None)
            d.handle_exit(signal.SIGINT, None)
            assert not d.should_exit and not d.force_exit
            opened = True
    assert opened and d.should_exit and d.force_exit and exc.value.code == 130
    d.should_exit = d.force_exit = False
    with d.held_signals():
        d.handle_exit(signal.SIGTERM, None)
    assert d.should_exit and not d.force_exit  # one signal: a clean stop, asked for after


def test_the_second_signal_leaves_the_recording_playable_before_the_exit_unwinds(tmp_path):
    """The forced exit keeps the file outputs where the second signal lands, before its SystemExit
    unwinds whatever code it interrupted (an output being closed, a capture thread joined): no
    path out of the process can then leave the hidden temporary file."""
    from vcam.stages.recording import FileOutput

    d = Daemon(Config(), control=False)
    out = FileOutput(tmp_path / "live.mp4", 64, 48, 30.0)
    for f in np.random.default_rng(0).integers(0, 255, (12, 48, 64, 3), dtype=np.uint8):
        out.send(f)
    d.streams[0].output = out
    d.handle_exit(signal.SIGINT, None)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # still being written
    with pytest.raises(SystemExit) as exc:
        d.handle_exit(signal.SIGINT, None)
    assert exc.value.code == 130 and d.force_exit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.partial.mp4"] and out.kept == out.partial_path


def test_after_a_run_stopped_by_a_signal_further_stop_signals_are_ignored(monkeypatch, tmp_path):
    """`vcam run` stopped by Ctrl-C: once the daemon has finished, only the summary is left, and a
    second signal then is ignored (it used to reach the early handler of vcam.__main__, whose
    SystemExit inside an import's callbacks was printed as an ignored exception with a traceback)."""

    def stopped_run(self, **kw):
        self.signalled = True
        return self.summary

    monkeypatch.setattr(Daemon, "run", stopped_run)
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        r = CliRunner().invoke(app, ["run", "--input", "demo", "--output", "null", "--device", "cpu", "--quiet"])
        after = {sig: signal.getsignal(sig) for sig in saved}
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert r.exit_code == 0, r.output
    assert all(h is signal.SIG_IGN for h in after.values()), after


def test_a_forced_exit_that_comes_out_as_another_error_still_leaves_with_130(monkeypatch):
    """The second Ctrl-C's SystemExit, raised inside threading's own locking (a thread being
    started while the models load), came out as RuntimeError("release unlocked lock"): a traceback
    and exit 1 in a busy full suite. `vcam run` leaves with 130 all the same, and prints nothing of it."""
    import vcam.cli.run as run_cli

    def forced_run(self, **kw):
        self.should_exit = self.force_exit = True
        raise RuntimeError("release unlocked lock")

    class Left(Exception):
        pass

    def leave(code):
        raise Left(code)

    monkeypatch.setattr(Daemon, "run", forced_run)
    monkeypatch.setattr(run_cli, "_leave", leave)
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        r = CliRunner().invoke(app, ["run", "--input", "demo", "--output", "null", "--device", "cpu", "--quiet"])
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert isinstance(r.exception, Left) and r.exception.args == (130,), (r.exception, r.output)
    assert "Traceback" not in r.output and "release unlocked lock" not in r.output, r.output


@pytest.mark.slow
def test_background_start_stop_while_frames_flow():
    cfg = demo_cfg(pacing="realtime")
    out = Capturing(640, 360)
    d = Daemon(cfg, output=out, control=False)
    d.start()
    assert d.ready.wait(30)
    deadline = time.time() + 30
    while out.frames < 5 and time.time() < deadline:
        time.sleep(0.05)
    d.stop()
    assert out.frames >= 5 and out.closed
    assert d._thread is not None and not d._thread.is_alive()


runner = CliRunner()


@pytest.mark.slow
def test_cli_run_to_file_decodes(tmp_path):
    target = tmp_path / "demo.mp4"
    r = runner.invoke(
        app,
        [
            "run",
            "--input",
            "demo",
            "--output",
            f"file:{target}",
            "--frames",
            "12",
            "--fast",
            "--max-latency",
            "0",
            "--device",
            "cpu",
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    with av.open(str(target)) as c:
        frames = list(c.decode(video=0))
    assert len(frames) == 12 and (frames[0].width, frames[0].height) == (1280, 720)


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["--input", "/nonexistent/clip.mp4"], 3, "not found"),
        # Linux lists its cameras first; Windows and macOS can only try to open the index.
        pytest.param(
            ["--input", "webcam:57"],
            3,
            "camera 57 not found" if sys.platform.startswith("linux") else "camera 57 could not",
            id="webcam57",
        ),
        (["--max-latency", "soon"], 2, "--max-latency: expected a duration like '33ms'"),
        (["--max-latency", "-5ms"], 2, "--max-latency: expected a duration like '33ms' or '0.5s', got '-5ms' (fix the flag)"),
        (["--device", "gpu"], 2, "--device: expected one of 'auto', 'cpu', 'cuda', got 'gpu' (fix the flag)"),
        (["--backend", "tensorflow"], 2, "--backend: expected one of"),
        (["--output", "printer"], 4, "use one of"),
        (["--face", "/nonexistent/me.jpg"], 7, "face photo not found"),
        (["--fast", "--realtime"], 2, "--fast and --realtime contradict each other (pass one of them)"),
        (["--duration", "soon"], 2, "--duration: expected a duration like '10s', got 'soon' (e.g. --duration 10s"),
        (["--panel", "70000"], 2, "--panel: expected a port number or 'off', got '70000'"),
        (["--map", "alice"], 2, "--map: expected TARGET=SOURCE, got 'alice'"),
    ],
)
def test_cli_bad_input_one_clear_line(args, code, needle, tmp_path):
    base = ["run", "--input", "demo", "--output", "null", "--frames", "3", "--quiet", "--device", "cpu"]
    r = runner.invoke(app, base + args)  # a repeated option: the last one wins
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    assert needle in r.output


def test_a_face_photo_without_a_face_stops_before_the_first_frame(tmp_path):
    """README: a --face photo in which no face is found is an error (exit 7), not a silent pass-through."""
    photo = tmp_path / "wall.png"
    yy, xx = np.mgrid[0:200, 0:200]
    import cv2

    cv2.imwrite(str(photo), np.dstack([xx, yy, xx // 2 + yy // 2]).astype(np.uint8))
    out = tmp_path / "o.mp4"
    r = runner.invoke(
        app,
        [
            "run",
            "--input",
            "demo",
            "--frames",
            "3",
            "--quiet",
            "--device",
            "cpu",
            "--face",
            str(photo),
            "--output",
            f"file:{out}",
        ],
    )
    assert r.exit_code == 7, r.output
    assert r.output.startswith("error: no face found in") and r.output.count("\n") == 1, r.output
    assert not out.exists()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "no face is found is an error (exit 7" in readme


@pytest.mark.slow
def test_summary_and_errors_never_wrap_mid_value():
    """Piped to a narrow consumer, each message stays on one line."""
    import re
    import time

    env = dict(os.environ, COLUMNS="30", TERM="dumb")
    t0 = time.perf_counter()
    p = vcam_cli("run", "--input", "demo", "--frames", "3", "--fast", "--output", "null", "--device", "cpu", env=env)
    wall = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr
    lines = (p.stdout + p.stderr).splitlines()
    summary = [ln for ln in lines if ln.startswith("stopped:")]
    assert len(summary) == 1 and "over the latency budget; first frame" in summary[0], lines
    # start-up as a user waits for it: from the process start (imports included) to the first frame
    first = float(re.search(r"first frame ([\d.]+) s after start$", summary[0]).group(1))
    assert 0.1 <= first <= wall + 0.1, (first, wall)
    assert any(ln.startswith("models: detector") and ln.rstrip().endswith("on cpu") for ln in lines), lines
    p = vcam_cli("run", "--input", "/nowhere/a/very/long/path/to/a/clip.mp4", env=env)
    assert p.returncode == 3 and len((p.stdout + p.stderr).strip().splitlines()) == 1, p.stderr


def test_cli_corrupt_video_and_bad_config(tmp_path):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(os.urandom(4096))
    r = runner.invoke(app, ["run", "--input", str(bad), "--output", "null", "--frames", "3", "--quiet"])
    assert r.exit_code == 3 and "error:" in r.output
    cfg = tmp_path / "c.toml"
    cfg.write_text("[output]\ntargte = 'null'\n")
    r = runner.invoke(app, ["run", "--config", str(cfg)])
    assert r.exit_code == 2
    assert "unknown key 'targte' in [output]; did you mean 'target'?" in r.output


@pytest.mark.slow
def test_fp16_on_cpu_warns_once_and_runs(tmp_path):
    args = ["--input", "demo", "--output", "null", "--frames", "5", "--fast", "--fp16", "--device", "cpu", "--quiet"]
    p = vcam_cli("run", *args, "--max-latency", "0", timeout=120)
    assert p.returncode == 0, p.stderr
    assert (p.stdout + p.stderr).count("--fp16 needs a CUDA GPU; running FP32 on the CPU") == 1
    assert "5 frames published of 5" in p.stderr


@pytest.mark.slow
@windows_lacks("SIGHUP and nohup")
def test_a_hangup_is_ignored_under_nohup(tmp_path):
    cmd = [sys.executable, "-m", "vcam", "run", "--input", "demo", "--realtime", "--output", "null", "--device", "cpu", "--quiet"]
    p = subprocess.Popen(at_terminal(cmd, nohup=True), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(2.0)
        p.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert p.poll() is None, "a hangup stopped a run started under nohup"
        p.send_signal(signal.SIGTERM)
        outp = ended(p, 60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and "stopped:" in outp, outp


@pytest.mark.slow
@windows_lacks(POSIX_SIGNALS)
@pytest.mark.parametrize("sig", STOP_SIGNALS)
@pytest.mark.parametrize("after", [0.0, 1.0], ids=["while-loading", "running"])
def test_signal_stops_daemon_cleanly(tmp_path, sig, after):
    # The output opens first (early frames) and the models load behind it for seconds on the CPU:
    # `after` 0 lands the signal in the load, whose native threads must end before the process does.
    target = tmp_path / "live.mp4"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # --realtime: a live recording, the demo loops until the signal
    cmd = [sys.executable, "-m", "vcam", "run", "--input", "demo", "--realtime", "--output", f"file:{target}"]
    cmd += ["--device", "cpu", "--quiet", "--max-latency", "0"]
    p = subprocess.Popen(at_terminal(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not list(tmp_path.glob("*.partial*")) and not target.exists():
            time.sleep(0.2)
        time.sleep(after)
        p.send_signal(sig)
        outp = ended(p, 60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, outp
    assert "stopped:" in outp and "Traceback" not in outp
    if after == 0.0 and not target.exists():
        # Stopped before the first frame reached the file: nothing is kept, and it says so.
        assert "no frames were written" in outp and list(tmp_path.iterdir()) == [], outp
        return
    with av.open(str(target)) as c:  # finalised: it decodes
        n = sum(1 for _ in c.decode(video=0))
    assert n > 0


def _live_recording(target, *extra: str, verbose: bool = False) -> subprocess.Popen:
    """A real `vcam run` of the live demo recorded to ``target``, returned once its (hidden) partial
    file exists: frames are being written. ``verbose``: its INFO lines too (`vcam -v`)."""
    cmd = [sys.executable, "-m", "vcam", *(["-v"] if verbose else []), "run", "--input", "demo", "--realtime"]
    cmd += ["--output", f"file:{target}", "--device", "cpu", "--max-latency", "0", *extra]
    p = subprocess.Popen(at_terminal(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list(target.parent.glob(".*partial*")):
        time.sleep(0.05)
    return p


@pytest.mark.slow
@windows_lacks(POSIX_SIGNALS)
@pytest.mark.parametrize("after", [0.0, 2.0])
@pytest.mark.parametrize("gap", [0.0, 0.01, 0.03, 0.1])
def test_a_double_ctrl_c_still_leaves_a_playable_recording(tmp_path, after, gap):
    """Issue 27 item 10: a second Ctrl-C at once (a forced exit) on a live recording may cut the
    file off while it is written or finished: it is still left playable, under its name or as
    NAME.partial.mp4, never only as a hidden temporary file."""
    # -v: a failure's message shows where the stop landed (the load, the frames, the output's close)
    p = _live_recording(tmp_path / "live.mp4", "--quiet", verbose=True)
    try:
        time.sleep(after)
        p.send_signal(signal.SIGINT)
        time.sleep(gap)  # the second lands in the stop the first began (closing the file, say)
        p.send_signal(signal.SIGINT)
        outp = ended(p, 60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode in (0, 130), outp  # 0: the first stop finished before the second came
    assert "Traceback" not in outp, outp
    names = sorted(x.name for x in tmp_path.iterdir())
    assert not [n for n in names if n.startswith(".")], (names, outp)  # no hidden partial left
    if not names:  # stopped before a frame reached the file: nothing to keep, and it says so (or
        # the second signal forced the exit before the first frame: nothing to salvage)
        assert "no frames were written" in outp or "forced exit" in outp, outp
        return
    assert names in (["live.mp4"], ["live.partial.mp4"]), names
    with av.open(str(tmp_path / names[0])) as c:
        assert next(c.decode(video=0), None) is not None  # it plays


@pytest.mark.slow
@windows_lacks(POSIX_SIGNALS)
def test_a_live_recording_stopped_by_ctrl_c_keeps_its_name_and_exits_0(tmp_path):
    """Ctrl-C is the normal stop of a live input recorded to a file: the named output, exit 0."""
    target = tmp_path / "cam.mp4"
    p = _live_recording(target)
    try:
        time.sleep(2.0)
        p.send_signal(signal.SIGINT)
        outp = ended(p, 60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, outp
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cam.mp4"]
    assert "stopped: " in outp and "(interrupted)" not in outp and "output: cam.mp4: H.264 (libx264) yuv420p" in outp, outp
    assert "converting" not in outp  # a live input has no end: no progress, only the status line on a terminal


@pytest.mark.slow
def test_run_with_a_neural_model_downloads_on_consent_or_says_how(tmp_path):
    """`vcam run --model inswapper_128_fp16`: without consent it names the missing files and the fix;
    with --download it fetches them (real HTTP on 127.0.0.1), verifies them and runs the swap."""
    from model_server import ModelServer

    from vcam.models import standin

    server = ModelServer(tmp_path / "www")
    try:
        for name in ("inswapper_128_fp16", "arcface_w600k_r50"):
            data = standin.write(name, tmp_path / f"{name}.onnx", tiny=True).read_bytes()
            server.publish(name, data)
        models = tmp_path / "models"
        cfg = tmp_path / "vcam.toml"
        cfg.write_text(f"[models]\ndir = '{models}'\nmirror = '{server.template}'\n")
        base = [
            "run",
            "--config",
            str(cfg),
            "--input",
            "demo",
            "--model",
            "inswapper_128_fp16",
            "--output",
            "null",
            "--frames",
            "4",
            "--fast",
            "--device",
            "cpu",
            "--quiet",
            "--max-latency",
            "0",
        ]
        r = runner.invoke(app, base)  # not a terminal: no prompt, one line saying how
        assert r.exit_code == 6
        assert "missing model files: arcface_w600k_r50.onnx, inswapper_128_fp16.onnx" in r.output
        assert "--download" in r.output and not models.joinpath("inswapper_128_fp16.onnx").exists()
        r = runner.invoke(app, base + ["--download"])
        assert r.exit_code == 0, r.output
        assert (models / "inswapper_128_fp16.onnx").is_file() and (models / "models.lock.json").is_file()
        assert "4 frames published of 4" in r.output
    finally:
        server.close()


@pytest.mark.slow
def test_face_added_to_the_bank_while_running_is_loaded_on_first_use(tmp_path):
    """`vcam faces add` while `vcam run` runs, then `vcam ctl face NAME`: loaded in the control thread,
    active from then on, frames never stop."""
    import cv2

    from vcam.control.client import send_command
    from vcam.stages.demo import portrait
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.faces import FaceBank

    cfg = demo_cfg(pacing="realtime")
    cfg = cfg.replace(faces=replace(cfg.faces, dir=str(tmp_path / "faces")))
    out = Capturing(640, 360)
    d = Daemon(cfg, output=out)
    d.start()
    try:
        assert d.ready.wait(30)
        photo = tmp_path / "grace.jpg"
        cv2.imwrite(str(photo), portrait("grace_hopper"))
        FaceBank(cfg.faces_dir).add(photo, "grace", None, detector=RetinaFaceDetector(cfg.detect))
        before = out.frames
        reply = send_command(cfg.socket_path, {"face": "grace"})
        assert reply["ok"] and reply["face"] == "grace"
        assert d.state.active == "grace" and sorted(d.state.names) == ["astronaut", "grace"]
        deadline = time.time() + 20
        while out.frames < before + 5 and time.time() < deadline:
            time.sleep(0.05)
        assert out.frames >= before + 5
    finally:
        d.stop()


@pytest.mark.slow
def test_without_face_nothing_is_swapped_in_even_with_a_face_bank(tmp_path):
    """README: no source face chosen, frames pass through unchanged, even with faces in the bank
    (no alphabetically first face is picked for the user); the summary names the active face."""
    import cv2

    from vcam.stages import demo
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.faces import FaceBank
    from vcam.stages.recording import FileOutput

    cfg = Config()
    photo = tmp_path / "grace.jpg"
    cv2.imwrite(str(photo), demo.portrait("grace_hopper"))
    FaceBank(cfg.faces_dir).add(photo, "aaron", None, detector=RetinaFaceDetector(cfg.detect))
    clip = demo.DemoClip(width=640, height=360, fps=30)
    src = tmp_path / "in.mp4"
    with FileOutput(src, 640, 360, 30.0, timing="frames") as out:
        for i in range(8):
            out.send(np.ascontiguousarray(clip.frame(i)))
    base = ["run", "--input", str(src), "--device", "cpu", "--quiet"]

    def frames_of(path):
        with av.open(str(path)) as c:
            return [f.to_ndarray(format="bgr24").astype(int) for f in c.decode(video=0)]

    r = runner.invoke(app, [*base, "--output", f"file:{tmp_path / 'plain.mp4'}"])
    assert r.exit_code == 0, r.output
    assert "8 frames published of 8 input frames" in r.output and "; face none (pass-through);" in r.output, r.output
    given = frames_of(src)

    # the largest change of a frame's worst 32x32 block: re-encoding noise only, or a face swapped in
    def worst_block(path):
        return max(
            cv2.resize(np.abs(a - b).mean(axis=2).astype(np.float32), (20, 12), interpolation=cv2.INTER_AREA).max()
            for a, b in zip(frames_of(path), given)
        )

    plain = worst_block(tmp_path / "plain.mp4")
    r = runner.invoke(app, [*base, "--face", "aaron", "--output", f"file:{tmp_path / 'swapped.mp4'}"])
    assert r.exit_code == 0 and "; face aaron;" in r.output, r.output
    swapped = worst_block(tmp_path / "swapped.mp4")
    assert plain < 8 and swapped > 2 * plain + 8, (plain, swapped)


@pytest.mark.slow
def test_daemon_runs_on_every_device(device):
    """The daemon end to end on the demo clip on each device (CUDA where present): frames flow, the
    face is swapped, and the summary says where each model ran."""
    cfg = demo_cfg()
    cfg = cfg.replace(pipeline=replace(cfg.pipeline, device=device, fp16=device == "cuda"))
    out = Capturing(640, 360)
    s = Daemon(cfg, output=out, control=False).run(max_frames=30)
    assert s.device == device and s.frames_out == 30 and out.frames == 30
    assert f"on {device}" in s.models and "detector retinaface_mnet025" in s.models
    off = Capturing(640, 360)
    d2 = Daemon(cfg, output=off, control=False)
    d2.state.set_swap("off")
    d2.run(max_frames=3)
    assert np.abs(off.frames_seen[0].astype(int) - out.frames_seen[0]).mean() > 0.1


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from vcam.models import standin

    d = tmp_path_factory.mktemp("models")
    for name in ("inswapper_128", "arcface_w600k_r50"):
        standin.write(name, d, tiny=True)
    cfg = d / "vcam.toml"
    cfg.write_text(f"[models]\ndir = '{d}'\n")
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_backend_flag_changes_what_runs(tiny_models, backend):
    """`--backend` reaches every model; the summary names the backend each one really ran on."""
    if backend == "torch":
        need_torch()
    args = demo_run("-c", str(tiny_models), "--fast", "--max-latency", "0", "--model", "inswapper_128", "--backend", backend)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    models = next(ln for ln in r.output.splitlines() if ln.startswith("models:"))
    for role in ("detector retinaface_mnet025", "swapper inswapper_128", "recogniser arcface_w600k_r50"):
        assert f"{role}: {backend} fp32 on cpu" in models, models


def test_tensorrt_where_it_cannot_run_is_one_clear_line(tiny_models):
    r = runner.invoke(app, demo_run("-c", str(tiny_models), "--backend", "tensorrt"))
    assert r.exit_code == 6, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: no inference backend can run retinaface_mnet025 on cpu: tensorrt: TensorRT runs on CUDA only (device is cpu)"
    ), r.output


def test_check_says_where_each_model_would_run(tiny_models, tmp_path):
    """`vcam check` answers from the same table `vcam run` uses: the device, the backend per device,
    each model's files and placement; a missing model is a FAIL naming the pull command."""
    r = runner.invoke(app, ["check", "-c", str(tiny_models)])
    text = r.output
    assert "device: frames run on cpu" in text and "inference on cpu: auto picks onnxruntime" in text
    assert "swapper: classic -> built in" in text
    cfg = tmp_path / "neural.toml"
    cfg.write_text(tiny_models.read_text() + "\n[swap]\nswapper = 'inswapper_128'\n")
    r = runner.invoke(app, ["check", "-c", str(cfg)])
    assert "PASS swapper: inswapper_128 -> onnxruntime on cpu; files: inswapper_128 " in r.output, r.output
    assert "PASS recogniser: arcface_w600k_r50 -> onnxruntime on cpu" in r.output
    cfg.write_text(tiny_models.read_text() + "\n[swap]\nswapper = 'hyperswap_1a_256'\n")
    r = runner.invoke(app, ["check", "-c", str(cfg)])
    assert "FAIL swapper: hyperswap_1a_256 -> onnxruntime on cpu; files: hyperswap_1a_256 missing" in r.output
    assert "vcam models pull hyperswap_1a_256" in r.output


# -- early frames: the camera published unswapped while the models load -----------------------------


def _slow_models(monkeypatch, seconds: float = 0.6, fail: Exception | None = None):
    """Loading the models takes ``seconds`` longer (or fails with ``fail``), as a GPU start does."""
    from vcam.runtime import assemble

    build = assemble.build

    def slow(*a, **kw):
        time.sleep(seconds)
        if fail is not None:
            raise fail
        return build(*a, **kw)

    monkeypatch.setattr(assemble, "build", slow)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pixelate", "camera"])
def test_a_live_run_publishes_early_frames_while_the_models_load(monkeypatch, mode):
    from vcam.runtime.rounds import pixelate
    from vcam.stages.demo import DemoClip

    _slow_models(monkeypatch)
    cfg = demo_cfg(pacing="realtime")
    if mode == "camera":
        cfg = cfg.replace(pipeline=replace(cfg.pipeline, early_frames="camera"))
    out = Capturing(640, 360, fmt=PixelFormat.BGR)
    t0 = time.perf_counter()
    s = Daemon(cfg, output=out, control=False).run(max_frames=8)
    took = time.perf_counter() - t0
    # about 30 fps for the 0.6 s of loading; --frames counts the frames through the pipeline
    assert 8 <= s.early_frames <= 60 and s.frames_out == 8 and s.frames_in == 8, s
    assert len(out.frames_seen) == s.early_frames + 8
    assert s.first_frame_s is not None and s.first_processed_s is not None
    assert s.first_processed_s - s.first_frame_s >= 0.4, "the first frame did not come before the models"
    assert f"{s.early_frames} early frames while the models loaded" in s.line()
    # the early frames are the camera's own frames (the demo clip's), pixelated by default: no face to see
    clip = DemoClip(width=640, height=360, fps=30)
    frames = [clip.frame(i) for i in range(int(took * 30) + 40)]
    expected = [pixelate(f) for f in frames] if mode == "pixelate" else frames
    for got in out.frames_seen[: s.early_frames]:
        assert any(np.array_equal(got, f) for f in expected), "an early frame is not the camera's"
        if mode == "pixelate":
            assert len(np.unique(got.reshape(-1, 3), axis=0)) <= 24 * 14, "not coarse blocks"
    # the pipeline's frames are swapped: none of them is a clip frame as it was
    assert not any(np.array_equal(out.frames_seen[-1], f) for f in frames)


@pytest.mark.slow
def test_no_early_frames_in_a_file_conversion_or_when_turned_off(monkeypatch):
    _slow_models(monkeypatch, 0.3)
    out = Capturing(640, 360)
    s = Daemon(demo_cfg(pacing="fast"), output=out, control=False).run(max_frames=5)  # every frame kept: swapped
    assert s.early_frames == 0 and len(out.frames_seen) == 5 and s.first_frame_s == s.first_processed_s
    cfg = demo_cfg(pacing="realtime")
    cfg = cfg.replace(pipeline=replace(cfg.pipeline, early_frames="off"))
    out = Capturing(640, 360)
    s = Daemon(cfg, output=out, control=False).run(max_frames=5)
    assert s.early_frames == 0 and len(out.frames_seen) == 5


@pytest.mark.slow
def test_models_that_fail_to_load_stop_the_early_frames_with_their_error(monkeypatch):
    from vcam.errors import ModelError

    _slow_models(monkeypatch, 0.3, fail=ModelError("the swapper model is broken", hint="run vcam models verify"))
    out = Capturing(640, 360)
    daemon = Daemon(demo_cfg(pacing="realtime"), output=out, control=False)
    with pytest.raises(ModelError, match="broken"):
        daemon.run(max_frames=5)
    assert daemon.summary.early_frames >= 1 and daemon.summary.frames_out == 0
    assert not any(t.name == "vcam-capture" and t.is_alive() for t in threading.enumerate())


@pytest.mark.slow
def test_a_stop_while_the_models_load_is_not_kept_waiting_for_them(monkeypatch):
    _slow_models(monkeypatch, 4.0)
    out = Capturing(640, 360)
    daemon = Daemon(demo_cfg(pacing="realtime"), output=out, control=False)
    daemon.start()
    deadline = time.monotonic() + 3.0
    while daemon.summary.early_frames < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert daemon.summary.early_frames >= 3
    t0 = time.perf_counter()
    daemon.stop(timeout=3.0)
    assert time.perf_counter() - t0 < 1.5, "the stop waited for the models"
    assert not daemon._thread.is_alive() and daemon.summary.frames_out == 0 and daemon.summary.error is None
    # The load goes on in the background, and the daemon says so (the CLI then ends with os._exit);
    # this process waits for it, so it never exits under a model load.
    assert daemon.load_in_flight
    daemon.loading.join(30)
    assert not daemon.load_in_flight


def test_av_delay_is_the_recent_median_plus_the_frame_time():
    """``Status.av_delay_ms`` (what OBS's audio sync offset is set to): the median capture-to-publish
    time of the last AV_WINDOW frames plus the camera's frame time; the all-run p50 lags behind it
    after a change of load."""
    from vcam.status import AV_WINDOW, LiveStats, RunSummary

    live = LiveStats(RunSummary())
    assert live.status(0, {}, frame_s=1 / 30).av_delay_ms == 0.0  # nothing published yet
    for i in range(200):
        live.published(i * 0.033, i * 0.033 + 0.020)  # 20 ms each
    st = live.status(0, {}, frame_s=1 / 30)
    assert st.av_delay_ms == pytest.approx(20.0 + 1000 / 30)
    for i in range(200, 200 + AV_WINDOW):
        live.published(i * 0.033, i * 0.033 + 0.080)  # load: 80 ms each
    st = live.status(0, {}, frame_s=1 / 30)
    assert st.av_delay_ms == pytest.approx(80.0 + 1000 / 30)
    assert st.latency_p50_ms == pytest.approx(20.0)  # the whole window's p50 has not moved yet
    assert live.status(0, {}).av_delay_ms == pytest.approx(80.0)  # no frame time known: the delay alone


@windows_lacks(POSIX_SIGNALS)
def test_a_child_that_does_not_stop_fails_its_test_with_every_thread_s_stack():
    """The tests' stop helper (``conftest.ended``): a child of ``at_terminal`` still running at the
    timeout is asked for its threads' stacks (the fault handler, SIGABRT), and the failure shows them."""
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(600,)).start()\nprint('up', flush=True)\n"
    p = subprocess.Popen(at_terminal([sys.executable, "-c", code]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout is not None and p.stdout.readline() == "up\n"
    with pytest.raises(pytest.fail.Exception) as failed:
        ended(p, 0.5)
    assert p.poll() is not None
    text = str(failed.value)
    assert "after it was told to stop" in text, text
    assert "Fatal Python error: Aborted" in text and "most recent call first" in text, text
