"""A real OBS Studio under Xvfb for tests (see docs/obs.md of the shared notes for the recipe).

``ObsInstance`` owns one Xvfb display and one OBS process with a throw-away ``XDG_CONFIG_HOME``,
a random websocket password and a free port. ``start()`` returns once the websocket port accepts
connections; ``stop()`` asks OBS to exit with SIGINT (it saves and quits in about 2 s) and falls
back to SIGKILL; ``kill()`` is the crash a test wants to survive; ``restart()`` starts OBS again on
the same port, password and config (the scene collection saved by the previous run is kept).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from vcam.stages.outputs import OutputBase

GLOBAL_INI = """\
[General]
FirstRun=true
LastVersion=486539266
EnableAutoUpdates=false
ConfirmOnExit=false

[Basic]
Profile=CI
ProfileDir=CI
SceneCollection=CI
SceneCollectionFile=CI

[BasicWindow]
SysTrayEnabled=false
PreviewEnabled=false

[OBSWebSocket]
FirstLoad=false
ServerEnabled=true
ServerPort={port}
AlertsEnabled=false
AuthRequired=true
ServerPassword={password}
"""

# Small canvas, 10 fps: keeps the software renderer's CPU use low on 2-core CI machines.
BASIC_INI = """\
[General]
Name=CI

[Video]
BaseCX=640
BaseCY=360
OutputCX=640
OutputCY=360
FPSType=1
FPSInt=10
"""


def missing_programs() -> list[str]:
    """Names of the programs this harness needs that are not on PATH."""
    return [p for p in ("obs", "Xvfb") if shutil.which(p) is None]


def _clean_env() -> dict[str, str]:
    """os.environ without what an imported OpenCV wheel adds (its own Qt plugins and fonts, and a
    LD_LIBRARY_PATH into site-packages), which would make OBS load the wrong Qt plugins and abort."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QT_")}
    ld = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and "site-packages" not in p]
    if ld:
        env["LD_LIBRARY_PATH"] = ":".join(ld)
    else:
        env.pop("LD_LIBRARY_PATH", None)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class ObsInstance:
    def __init__(self, workdir: Path, *, port: int | None = None, password: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.password = password or secrets.token_urlsafe(18)
        self.config_home = self.workdir / "xdg"
        self.log_path = self.workdir / "obs-stdout.log"
        self.display: str | None = None
        self._xvfb: subprocess.Popen | None = None
        self._obs: subprocess.Popen | None = None
        self._write_config()

    # -- setup ---------------------------------------------------------------------------------
    def _write_config(self) -> None:
        obs_dir = self.config_home / "obs-studio"
        (obs_dir / "basic" / "profiles" / "CI").mkdir(parents=True, exist_ok=True)
        (obs_dir / "basic" / "scenes").mkdir(parents=True, exist_ok=True)
        (obs_dir / "global.ini").write_text(GLOBAL_INI.format(port=self.port, password=self.password))
        (obs_dir / "basic" / "profiles" / "CI" / "basic.ini").write_text(BASIC_INI)

    def _start_xvfb(self) -> None:
        read_fd, write_fd = os.pipe()
        self._xvfb = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1280x720x24", "-nolisten", "tcp", "-noreset"],
            pass_fds=(write_fd,),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(write_fd)
        with os.fdopen(read_fd) as fh:
            number = fh.readline().strip()
        if not number:
            raise RuntimeError("Xvfb did not report a display number")
        self.display = f":{number}"

    # -- lifecycle -----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._obs is not None and self._obs.poll() is None

    def start(self, timeout: float = 30.0) -> ObsInstance:
        if self._xvfb is None or self._xvfb.poll() is not None:
            self._start_xvfb()
        env = _clean_env()
        env.update(
            XDG_CONFIG_HOME=str(self.config_home), DISPLAY=self.display or "", QT_QPA_PLATFORM="xcb", LIBGL_ALWAYS_SOFTWARE="1"
        )
        log = open(self.log_path, "ab")
        self._obs = subprocess.Popen(
            ["obs", "--minimize-to-tray", "--disable-updater", "--disable-missing-files-check", "--multi"],
            env=env,
            cwd=self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._obs.poll() is not None:
                raise RuntimeError(f"OBS exited with {self._obs.returncode} while starting; see {self.log_path}")
            if _port_open(self.port):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"OBS websocket did not open port {self.port} within {timeout:g}s; see {self.log_path}")

    def stop(self, timeout: float = 15.0) -> None:
        """Quit OBS the way a user would (SIGINT saves the scene collection)."""
        if self._obs is not None and self._obs.poll() is None:
            self._obs.send_signal(signal.SIGINT)
            try:
                self._obs.wait(timeout)
            except subprocess.TimeoutExpired:
                self._obs.kill()
                self._obs.wait()
        self._obs = None

    def wait_saved(self, names: list[str], timeout: float = 20.0) -> bool:
        """Whether OBS wrote its scene collection with every one of ``names`` within ``timeout``
        seconds (stretched 4x for a busy 2-core machine). OBS saves a change a moment after it (a
        deferred save): a test that kills OBS right after building a scene finds on restart only
        what was saved by then (seen: one face of three)."""
        scenes = self.config_home / "obs-studio" / "basic" / "scenes"

        def saved() -> bool:
            text = "".join(p.read_text(errors="replace") for p in scenes.glob("*.json"))
            return all(json.dumps(n) in text for n in names)

        return wait_for(saved, timeout)

    def kill(self) -> None:
        """Crash OBS (SIGKILL): the connection drops without a websocket close."""
        if self._obs is not None and self._obs.poll() is None:
            self._obs.kill()
            self._obs.wait()
        self._obs = None

    def restart(self) -> ObsInstance:
        if self.running:
            self.stop()
        # The port may linger for a moment after a kill; start() polls until OBS listens again.
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._xvfb is not None and self._xvfb.poll() is None:
            self._xvfb.terminate()
            try:
                self._xvfb.wait(5)
            except subprocess.TimeoutExpired:
                self._xvfb.kill()
                self._xvfb.wait()
        self._xvfb = None

    def __enter__(self) -> ObsInstance:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


# --- a daemon on the demo clip, for the control end-to-end tests ------------------------------

COLOURS = {"alice": (0, 0, 255), "bob": (255, 0, 0), "carol": (0, 255, 0)}  # BGR, one per face


class CapturingOutput(OutputBase):
    """An output for ``Daemon(output=...)``: keeps the newest BGR frame and counts frames."""

    def __init__(self, width: int = 320, height: int = 240) -> None:
        from vcam.types import PixelFormat

        super().__init__()
        self.fmt = PixelFormat.BGR
        self.width, self.height = width, height
        self.last = None
        self._ready = True

    def send(self, data) -> None:
        import numpy as np

        self.last = np.array(data, copy=True)
        self.frames += 1


def solid_faces(names=("alice", "bob")):
    """SourceFaces whose crops are one solid colour each (see COLOURS)."""
    import numpy as np

    from vcam.types import SourceFace

    out = {}
    for n in names:
        img = np.empty((128, 128, 3), np.uint8)
        img[...] = COLOURS[n]
        out[n] = SourceFace(name=n, image=img)
    return out


def colour_pixels(frame, name: str) -> int:
    """How many pixels of ``frame`` are (nearly) the solid colour of face ``name``."""
    import numpy as np

    want = np.array(COLOURS[name], np.int16)
    return int((np.abs(frame.astype(np.int16) - want).max(axis=2) < 40).sum())


def wait_for(pred, timeout: float) -> bool:
    """Whether ``pred()`` came true within ``timeout`` seconds, stretched 4x for a busy 2-core machine."""
    end = time.monotonic() + timeout * 4
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def face_x(frame, name: str = "alice") -> float | None:
    """The mean column of the pixels in face ``name``'s solid colour (None when there are few)."""
    import numpy as np

    want = np.array(COLOURS[name], np.int16)
    ys, xs = np.nonzero(np.abs(frame.astype(np.int16) - want).max(axis=2) < 40)
    return float(xs.mean()) if xs.size > 200 else None


def steady_face_x(output) -> float:
    """The median of three readings of :func:`face_x` on ``output``'s newest frames (one is there)."""
    import numpy as np

    xs = []
    while len(xs) < 3:
        if (x := face_x(output.last)) is not None:
            xs.append(x)
        time.sleep(0.1)
    return float(np.median(xs))


def demo_daemon_config(socket_path, obs=None):
    """The demo clip at 320x240 on the CPU, classic swap without colour matching (so the pasted
    face keeps its solid colour), no latency drops, control socket at ``socket_path``."""
    from vcam.config_file import build

    cfg = build(
        {
            "capture": {"input": "demo", "width": 320, "height": 240},
            "pipeline": {"device": "cpu", "max_latency": 0},
            "swap": {"swapper": "classic", "color_match": False},
            "control": {"socket": str(socket_path)},
        }
    )
    return cfg.replace(obs=obs) if obs is not None else cfg


def with_map_targets(state):
    """``state`` with a target loader, as a run started with [[swap.map]] has: targets 'ann' and 'ben'
    can be loaded (anything else is unknown, as a bank would answer)."""
    import numpy as np

    from vcam.errors import FaceError
    from vcam.types import SourceFace

    def load_target(name: str) -> SourceFace:
        if name not in ("ann", "ben"):
            raise FaceError(f"unknown map target '{name}'", hint="known faces: ann, ben")
        return SourceFace(name=name, image=np.zeros((128, 128, 3), np.uint8), embeddings={"r": np.ones(4, np.float32)})

    state.set_target_loader(load_target)
    return state
