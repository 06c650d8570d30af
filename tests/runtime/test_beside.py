"""Beside a running daemon (issue 38): a live `vcam run` of this user, in the user's real runtime
folder (its control socket, lock and panel file) with its panel on the default port 8765, changes
nothing for the tests (tests/conftest.py gives each its own folders and panel port 0) nor for a
file conversion (README's first command), which goes ahead without touching the live daemon's
socket, while `vcam ctl` keeps answering from the live one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import at_terminal

ROOT = Path(__file__).resolve().parents[2]

#: A live daemon as far as vcam can tell here (no camera or v4l2loopback needed): the demo, paced
#: at 5 fps, to an output of its own (a given output counts as a device), with the panel and the
#: control socket, all at the user's defaults.
LIVE = """
import sys
from dataclasses import replace

from vcam.config import Config
from vcam.runtime.daemon import Daemon
from vcam.stages.outputs import NullOutput


cfg = Config()
cfg = cfg.replace(
    capture=replace(cfg.capture, input="demo", width=320, height=240, fps=5.0),
    pipeline=replace(cfg.pipeline, device="cpu"),
)
d = Daemon(cfg, output=NullOutput(320, 240), panel=True, announce=lambda line: print(line, flush=True))
d.install_signal_handlers()
print("stopped:", d.run().frames_out, flush=True)
"""


@pytest.fixture(scope="module")
def real_env():
    """This user's environment as it was before the tests isolated it (module fixtures come first)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("VCAM_PANEL_PORT", None)
    return env


@pytest.fixture(scope="module")
def live_daemon(real_env):
    """A live daemon of this user in the real runtime folder, or the one already running there."""
    p = subprocess.Popen(
        at_terminal([sys.executable, "-c", LIVE]),
        env=real_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 120
    assert p.stdout is not None
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("panel: "):
            break
    if p.poll() is not None and "another vcam" in "".join(lines):
        yield None  # this user's own daemon is running already: the neighbour the tests are to live beside
        return
    # on the default port, or (something else there) a free one it names
    assert any(ln.startswith("panel: http://127.0.0.1:8765/") for ln in lines) or "is in use" in "".join(lines), "".join(lines)
    try:
        yield p
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


@pytest.mark.slow
def test_tests_that_used_the_shared_socket_and_port_pass_beside_a_live_daemon(live_daemon, real_env):
    status = subprocess.run(
        [sys.executable, "-m", "vcam", "ctl", "status"], env=real_env, capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr  # the live daemon holds the user's socket
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/panel/test_panel.py", "tests/control/test_ctl.py", "tests/control/test_instance.py"],
        cwd=ROOT, env=real_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


@pytest.mark.slow
def test_a_conversion_goes_ahead_beside_a_live_daemon(live_daemon, real_env, tmp_path):
    """README's first command, the user's own dirs: not refused, the socket left to the live daemon."""
    target = tmp_path / "demo.mp4"
    r = subprocess.run(
        [sys.executable, "-m", "vcam", "run", "--input", "demo", "--output", f"file:{target}", "--frames", "30"],
        env=real_env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "30 frames published of 30 input frames" in r.stderr and target.is_file()
    status = subprocess.run(
        [sys.executable, "-m", "vcam", "ctl", "status"], env=real_env, capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr  # still the live daemon's
