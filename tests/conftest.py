"""Shared test helpers.

``require(component, reason)``: skip a test whose component is missing here, or fail it when the
environment variable VCAM_REQUIRE (comma list, set by .ci/run) names that component, so a skip in CI
can never hide a missing install step.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest


def demo_run(*extra: str) -> list[str]:
    """``vcam run`` arguments: 3 frames of the demo clip to the null output on the CPU, quiet."""
    return ["run", "--input", "demo", "--output", "null", "--frames", "3", "--device", "cpu", "--quiet", *extra]


def vcam_cli(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``python -m vcam ARGS`` in a real process (text output captured)."""
    return subprocess.run([sys.executable, "-m", "vcam", *args], capture_output=True, text=True, timeout=timeout, **kw)


def two_people():
    """A 960x480 frame with the astronaut on the left and Grace Hopper on the right, faces 160 px wide."""
    from vcam.stages import demo
    from vcam.stages.detect import RetinaFaceDetector

    det = RetinaFaceDetector()
    items = []
    for name, cx in (("astronaut", 240), ("grace_hopper", 720)):
        img = demo.portrait(name)
        box = demo.face_box(img, det)
        anchor = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
        items.append((img, demo.placement(anchor, (cx, 240), 160 / float(box[2] - box[0]), 0.0)))
    return demo.compose((960, 480), items)


def _serve_env() -> None:
    """The serving environment of `vcam serve` stays where it is made for this user (the tests'
    isolated cache dirs would make it again, a minute each), unless VCAM_SERVE_ENV names one."""
    from vcam.runtime.serve import env_dir

    os.environ.setdefault("VCAM_SERVE_ENV", str(env_dir()))


_serve_env()


@pytest.fixture(scope="session")
def triton(tmp_path_factory):
    """The bundled Triton on 127.0.0.1 serving tiny stand-ins (see tests/triton_server.py):
    ``(server, models dir)``."""
    import triton_server

    root = tmp_path_factory.mktemp("triton")
    skip_on_windows(TRITON_SERVER)  # tools/windows-tests
    models = triton_server.place_standins(root / "models")
    server = triton_server.start(triton_server.export(models, root / "repo"), log=root / "server.log")
    yield server, models
    server.stop()


def require(component, reason):
    req = {s.strip() for s in os.environ.get("VCAM_REQUIRE", "").split(",") if s.strip()}
    (pytest.fail if component in req else pytest.skip)(f"{component} unavailable: {reason}")


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Keep every test away from the real user's config, face bank and model dirs."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(home / "run"))
    (home / "run").mkdir(mode=0o700)
    monkeypatch.delenv("VCAM_CONFIG", raising=False)
    monkeypatch.setenv("VCAM_ENGINE_CACHE", str(home / "engines"))  # not the checkout's engines/
    # No compiled engines built in the background by the swappers tests make ([pipeline] compile =
    # "auto" does on CUDA): the tests of that feature unset it.
    monkeypatch.setenv("VCAM_NO_BACKGROUND_COMPILE", "1")
    # --- beside a running daemon (issue 38, item 7) -------------------------------------------------
    # The runtime folder above holds the control socket, its lock, the OBS scene locks and the panel
    # file; the panel's default port is 0 (any free one), so a `vcam run` of this user, 8765 taken,
    # changes nothing here (tests/runtime/test_beside.py runs some tests beside one).
    monkeypatch.setenv("VCAM_PANEL_PORT", "0")
    # --- end beside a running daemon ------------------------------------------------------------------
    yield


def _make_ops(name):
    if name == "cuda":
        from vcam.ops import cuda_status

        ok, why = cuda_status()
        if not ok:
            require("gpu", why)
        from vcam.ops.cuda import CudaOps

        return CudaOps()
    from vcam.ops.numpy import NumpyOps

    return NumpyOps()


@pytest.fixture(scope="module", params=["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def ops(request):
    """One test body over both ops implementations (kornia-style device parametrisation): NumPy
    always, CUDA where a GPU with CuPy is present (skipped with the reason elsewhere)."""
    return _make_ops(request.param)


@pytest.fixture(scope="module", params=["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """``cpu`` always, ``cuda`` where the GPU path can run (CuPy and a CUDA engine backend)."""
    if request.param == "cuda":
        _make_ops("cuda")
        try:
            import torch
        except ImportError as exc:
            require("gpu", f"torch does not import ({exc})")
        if not torch.cuda.is_available():
            require("gpu", "torch sees no CUDA device")
        return "cuda"
    return "cpu"


def host(ops, a):
    """An ops array on the host (NumPy)."""
    return ops.to_host(a) if ops.device != "cpu" else np.asarray(a)


def poisoned(ops, shape, dtype):
    """A buffer in the ops' memory filled with garbage (NaN or 77), so unwritten elements show."""
    a = np.full(shape, np.nan if np.dtype(dtype).kind == "f" else 77, dtype=dtype)
    return ops.asarray(a) if ops.device != "cpu" else a


class ScriptedEngine:
    """A fake :class:`vcam.engines.Engine` whose outputs ``make(n, h, w)`` computes from the input
    shape (exact decoding tests). A fixed batch of 1 in ``shape`` runs item by item, as the real
    engines do; ``epilogue`` is applied in its NumPy form. Input shapes of every model call are
    recorded in ``calls``, the last input in ``last``."""

    backend, device, precision = "scripted", "cpu", "fp32"

    def __init__(self, shape, make, *, epilogue=None, max_batch=8):
        from vcam.engines import TensorInfo

        self.inputs = [TensorInfo("input", shape, "float32")]
        self.outputs = list(epilogue.outputs) if epilogue is not None else []
        self.make, self.epilogue, self.max_batch = make, epilogue, max_batch
        self.calls, self.last, self.name = [], None, "scripted"

    def describe(self):
        return "scripted"

    def input_buffers(self, n, shapes=None):
        return {"input": np.zeros((n, *shapes["input"]), np.float32)}

    def _call(self, x):
        assert x.dtype == np.float32 and x.flags.c_contiguous
        self.calls.append(x.shape)
        self.last = x.copy()
        n, _, h, w = x.shape
        return self.make(n, h, w)

    def run(self, feeds):
        x = np.ascontiguousarray(feeds["input"])
        if self.inputs[0].fixed_batch == 1 and x.shape[0] > 1:
            parts = [self._call(x[i : i + 1]) for i in range(x.shape[0])]
            outs = [np.concatenate(p, axis=0) for p in zip(*parts)]
        else:
            outs = self._call(x)
        return self.epilogue.numpy(outs) if self.epilogue is not None else outs

    def run_device(self, feeds, stream=None):
        return self.run(feeds)


class CountingEngine:
    """Wraps a real engine and records the input shape of every call."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run_device(self, feeds, stream=None):
        self.calls.append(tuple(next(iter(feeds.values())).shape))
        return self.engine.run_device(feeds, stream)


def need_torch():
    """PyTorch, or a skip (a failure where CI installs it: VCAM_REQUIRE names ``torch``)."""
    try:
        import torch
    except ImportError as exc:
        require("torch", f"PyTorch is not installed ({exc}); pip install torch --index-url https://download.pytorch.org/whl/cpu")
    return torch


#: Runs ``argv[2:]`` with the stop signals at their defaults (``argv[1]`` "nohup": SIGHUP ignored),
#: which ``exec`` keeps: no Python code runs in the child between fork and exec (a ``preexec_fn``
#: does, and there gRPC's fork handlers, loaded by an earlier test of the session, restart a poller
#: whose descriptor the child's close_fds then closes: "epoll_wait error: Bad file descriptor", abort).
#: Python's fault handler is on in the child, so :func:`ended` can ask a child that does not stop
#: for its threads' stacks.
_AT_TERMINAL = (
    "import os, signal, sys\n"
    "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
    "    nohup = sig == signal.SIGHUP and sys.argv[1] == 'nohup'\n"
    "    signal.signal(sig, signal.SIG_IGN if nohup else signal.SIG_DFL)\n"
    "os.environ['PYTHONFAULTHANDLER'] = '1'\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def at_terminal(cmd: list[str], *, nohup: bool = False) -> list[str]:
    """``cmd`` for a child that a test stops with a signal: the stop signals at their defaults, as
    in a terminal session (``nohup``: SIGHUP ignored, as under nohup). A runner started in the
    background has SIGINT ignored (and under nohup SIGHUP), which the child would inherit and vcam
    rightly keeps ignoring. Windows: ``cmd`` as it is (its console events are not inherited so)."""
    if sys.platform == "win32":
        return list(cmd)
    return [sys.executable, "-c", _AT_TERMINAL, "nohup" if nohup else "terminal", *cmd]


def ended(p: subprocess.Popen, timeout: float) -> str:
    """The rest of ``p``'s output once it has ended (its stdout a text pipe, stderr with it), which
    it must within ``timeout``: a child told to stop that is still running then fails the test with
    every thread's stack (a child of :func:`at_terminal` has Python's fault handler on, and SIGABRT
    makes it print them), so a stop that hangs once in a while says where."""
    try:
        return p.communicate(timeout=timeout)[0] or ""
    except subprocess.TimeoutExpired:
        pass
    if sys.platform != "win32":
        import signal

        p.send_signal(signal.SIGABRT)
    try:
        rest = p.communicate(timeout=30)[0] or ""
    except subprocess.TimeoutExpired:
        p.kill()
        rest = p.communicate()[0] or ""
    pytest.fail(f"still running {timeout:.0f} s after it was told to stop; its output and threads then:\n{rest[-15000:]}")


# --- Windows (issue 38, tools/windows-tests) -------------------------------------------------------
# Windows runs the fast tests under Wine in CI. A test of a facility Windows lacks skips with
# `windows_lacks(facility)`, whose reason names it: tools/windows-tests counts any other test that
# passes on Linux and skips on Windows as a defect.

WINDOWS = sys.platform == "win32"
#: What a test that stops a child with ``send_signal`` (SIGINT, SIGTERM, SIGHUP) needs; Windows stops
#: a console program with console control events instead (tools/windows-tests' stop step sends them).
POSIX_SIGNALS = "POSIX signals sent to another process"
#: What `vcam serve` and the remote-engine tests run: NVIDIA Triton from nvidia-pytriton (Linux wheels only).
TRITON_SERVER = "the Triton server of `vcam serve` (nvidia-pytriton has Linux wheels only)"


def windows_lacks(facility: str) -> pytest.MarkDecorator:
    """A ``skipif`` mark for a test of a POSIX facility that Windows has not (a pty, Unix sockets,
    file modes, uids, symlinks without developer mode ...), named in the reason."""
    return pytest.mark.skipif(WINDOWS, reason=f"{facility}: not on Windows")


def skip_on_windows(facility: str) -> None:
    """The same skip from inside a test (a facility found missing at run time)."""
    if WINDOWS:
        pytest.skip(f"{facility}: not on Windows")


def c_library(tmp_path, source: str, name: str):
    """A shared library built from C ``source`` with the system's cc as ``tmp_path / name``; a skip
    where there is no cc (and on Windows, which has none here)."""
    cc = None if WINDOWS else shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("cc: not on Windows" if WINDOWS else "a C compiler (cc) to build a test library: none here")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / name
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True, capture_output=True)
    return out


def can_symlink(where) -> bool:
    """Whether a symlink can be made in ``where``: Windows needs developer mode or a privilege for
    one, and Wine 8.0 reports success but makes nothing."""
    probe = where / ".symlink-probe"
    try:
        probe.symlink_to(where, target_is_directory=True)
    except (OSError, NotImplementedError):
        return False
    made = probe.is_symlink()
    if made:
        probe.unlink()
    return made


def need_symlinks(where) -> None:
    """Skip a test that makes symlinks where none can be made, naming the facility."""
    if not can_symlink(where):
        pytest.skip("symlinks: not on Windows without developer mode (nor under Wine)" if WINDOWS else "no symlinks here")


@pytest.fixture(autouse=True)
def _isolated_windows_dirs(tmp_path_factory, monkeypatch):
    """The user folders on Windows (vcam/platform/folders.py reads %LOCALAPPDATA% at each call, as
    POSIX reads XDG_*): set everywhere, so a test's `python -m vcam` on Windows is isolated too."""
    home = tmp_path_factory.mktemp("appdata")
    for name, folder in (("LOCALAPPDATA", "Local"), ("APPDATA", "Roaming")):
        (home / folder).mkdir()  # Windows makes them with the profile
        monkeypatch.setenv(name, str(home / folder))
    yield


# --- end of the Windows block ----------------------------------------------------------------------
