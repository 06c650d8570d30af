"""``vcam serve``: the Triton server bundled in the ``nvidia-pytriton`` wheel, in its own environment.

PyTriton pins numpy < 2 (with numpy 2 forced it answered with empty outputs) and its server needs
the interpreter's ``libpython3.X.so``, so it never runs in vcam's process: :func:`ensure_env` makes
a virtual environment under the user cache dir on first use (pinned: :data:`PINS`), once (a lock
and a marker file make it idempotent; a half-made one is made again), from a Python that has a
shared libpython (:func:`find_python`). :class:`TritonServer` starts ``vcam/assets/triton_worker.py``
there on an exported repository (:mod:`vcam.models.serving`): the dynamic batcher of each
``config.pbtxt``, gRPC, HTTP health/ready (``/v2/health/ready``) and Prometheus metrics
(``/metrics``). Errors are one line (:class:`~vcam.errors.EngineUnavailable`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from pathlib import Path

from vcam.errors import EngineUnavailable
from vcam.platform import folders, locks, process

#: What the serving environment installs (one line each, as pip takes them).
PINS = ("nvidia-pytriton==0.7.0", "numpy>=1.26,<2", "onnxruntime>=1.17,<2")
WORKER = Path(__file__).resolve().parents[1] / "assets" / "triton_worker.py"
DIRECT = Path(__file__).resolve().parents[1] / "assets" / "triton_direct.py"
#: How ``vcam serve`` runs the models: ``python-backend``, the bundled ``tritonserver`` directly on a
#: repository of Triton's own Python backend (vcam/assets/triton_model.py); ``pytriton``, PyTriton's
#: Triton (vcam/assets/triton_worker.py), whose Python backend forwards each request over PyTriton's
#: proxy to a second Python process.
SERVERS = ("python-backend", "pytriton")
DEFAULT_SERVER = "python-backend"
_LIBPY = (
    "import sys, sysconfig, os; v = sysconfig.get_config_var; "
    "print(v('LIBDIR') or ''); print(v('LDLIBRARY') or ''); print(v('INSTSONAME') or ''); print('%d.%d' % sys.version_info[:2])"
)


def _system_site() -> bool:
    """``VCAM_SERVE_SYSTEM_SITE=1``: the environment also sees this Python's packages (torch for
    ``--vcam-engine`` on a GPU machine); its own numpy < 2 still comes first."""
    return os.environ.get("VCAM_SERVE_SYSTEM_SITE", "") == "1"


def env_dir() -> Path:
    """Where the serving environment lives (``$VCAM_SERVE_ENV`` or the user cache dir)."""
    if os.environ.get("VCAM_SERVE_ENV"):
        return Path(os.environ["VCAM_SERVE_ENV"]).expanduser()
    tag = hashlib.sha256(("\n".join(PINS) + ("+system" if _system_site() else "")).encode()).hexdigest()[:8]
    return folders.cache_dir() / f"serve-env-{tag}"


def _shared_lib(python: str) -> tuple[str, str] | None:
    """(folder holding ``python``'s ``libpython3.X.so``, version) or None when it has none."""
    try:
        out = subprocess.run([python, "-c", _LIBPY], capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) < 4:
        return None
    libdir, ldlib, soname, version = out[:4]
    names = [n for n in (ldlib, soname, f"libpython{version}.so", f"libpython{version}.so.1.0") if n.endswith((".so", ".so.1.0"))]
    for name in names:  # its own build's library only: another build of 3.X may not match it
        if libdir and (Path(libdir) / name).is_file():
            return libdir, version
    return None


def find_python() -> tuple[str, str, str]:
    """(interpreter, its libpython folder, version): ``$VCAM_SERVE_PYTHON``, this one, then python3.12,
    3.11, 3.13, 3.10 on PATH; the first with a shared libpython (PyTriton ships stubs for 3.8-3.13)."""
    cands = [os.environ.get("VCAM_SERVE_PYTHON", ""), sys.executable] + [
        shutil.which(f"python3.{m}") or "" for m in (12, 11, 13, 10)
    ]
    tried = []
    for py in dict.fromkeys(c for c in cands if c):
        if (found := _shared_lib(py)) is not None:
            return py, found[0], found[1]
        tried.append(py)
    raise EngineUnavailable(
        f"no Python with a shared libpython for the Triton server (tried {', '.join(tried)})",
        hint="install a Python 3.10-3.13 built with --enable-shared and name it in VCAM_SERVE_PYTHON",
    )


def _see_base_venv(base: str, py: Path, env: dict[str, str] | None = None) -> None:
    """``--system-site-packages`` sees the base interpreter's packages; when ``base`` is itself a
    virtual environment (torch installed in one, as on many GPU images) its packages are added too,
    by a ``.pth`` file: after the environment's own, so its numpy < 2 still comes first."""
    probe = "import site, sys; print(int(sys.prefix != sys.base_prefix)); print(*site.getsitepackages(), sep='\\n')"
    lines = subprocess.run(
        [base, "-c", probe], capture_output=True, text=True, timeout=60, check=True, env=env
    ).stdout.splitlines()
    if not lines or lines[0] != "1":
        return
    own = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    ).stdout.strip()  # fmt: skip
    (Path(own) / "vcam-base-venv.pth").write_text("".join(f"{d}\n" for d in lines[1:]))


def ensure_env(*, quiet: bool = True) -> tuple[Path, str]:
    """The serving environment's python and the libpython folder, made on first use (idempotent)."""
    root = env_dir()
    marker = root / "vcam-serve.txt"
    want = "\n".join(PINS)
    py = root / "bin" / "python"
    if marker.is_file() and py.exists():
        text = marker.read_text().split("\n", 1)
        if len(text) == 2 and text[1] == want:
            return py, text[0]
    root.parent.mkdir(parents=True, exist_ok=True)
    with locks.hold(root.parent / f".{root.name}.lock"):  # a second `vcam serve` waits for the first's install
        if marker.is_file() and marker.read_text().split("\n", 1)[1:] == [want] and py.exists():
            return py, marker.read_text().split("\n", 1)[0]
        base, libdir, _ = find_python()
        shutil.rmtree(root, ignore_errors=True)  # a half-made environment is made again
        out = subprocess.DEVNULL if quiet else None
        # The caller's PYTHONPATH is not the environment's: packages pip found there would count as
        # installed and be missing once the server runs without it.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        try:
            venv = [base, "-m", "venv", *(["--system-site-packages"] if _system_site() else []), str(root)]
            subprocess.run(venv, check=True, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
            if _system_site():
                _see_base_venv(base, py, env)
            subprocess.run(
                [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q", *PINS],
                check=True, stdout=out, stderr=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            last = (exc.stderr or "").strip().splitlines()
            shutil.rmtree(root, ignore_errors=True)
            raise EngineUnavailable(
                f"cannot make the serving environment in {root}: {last[-1] if last else exc}",
                hint=f"check the network to the package index, or install {' '.join(PINS)} there by hand",
            ) from None
        marker.write_text(f"{libdir}\n{want}")
        return py, libdir


class TritonServer:
    """The bundled Triton serving ``repo`` (a started process; :meth:`stop` ends its process group)."""

    def __init__(
        self,
        repo: str | os.PathLike[str],
        *,
        address: str = "127.0.0.1",
        grpc_port: int = 8001,
        http_port: int = 8000,
        metrics_port: int = 8002,
        threads: int = 0,
        instances: int = 1,
        tls: tuple[str, str, str] | None = None,
        log: str | os.PathLike[str] | None = None,
        runner: tuple[str, dict[str, str]] | None = None,
        server: str = DEFAULT_SERVER,
    ) -> None:
        self.repo = Path(repo)
        if not any((p / "config.pbtxt").is_file() for p in self.repo.glob("*")):
            raise EngineUnavailable(
                f"no model in {self.repo} (NAME/config.pbtxt)", hint="write one with `vcam serve export DIR --model NAME`"
            )
        if server not in SERVERS:
            raise EngineUnavailable(f"no Triton server kind {server!r}", hint=f"choose one of {', '.join(SERVERS)}")
        py, libdir = ensure_env()
        self.kind = server
        self.address, self.grpc_port, self.http_port, self.metrics_port = address, grpc_port, http_port, metrics_port
        self._served: Path | None = None
        if server == "pytriton":
            args = _pytriton_args(py, self.repo, address, self.ports(), threads, instances, tls, runner)
        else:
            self._served = Path(tempfile.mkdtemp(prefix=f"vcam-served-{os.getpid()}-", dir=_scratch()))
            served = _python_repository(self.repo, self._served, threads, instances, runner)
            args = [str(py), str(DIRECT), str(served), "--parent", str(os.getpid()), "--"]
            args += _direct_options(address, self.ports(), tls)
        env = dict(os.environ)
        # The caller's path (numpy 2) must not shadow the environment's own: a runner's folders go
        # after it (_runner_path).
        env.pop("PYTHONPATH", None)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
        env.setdefault("PYTRITON_HOME", str(folders.cache_dir() / "pytriton"))
        self._log = open(log, "a") if log else None
        self.lines: deque[str] = deque(maxlen=200)
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **process.own_group()
        )
        self._ready = threading.Event()
        self._log_lock = threading.Lock()  # the pump writes the log, stop closes it
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            with self._log_lock:
                if self._log is not None:
                    self._log.write(line)
                    self._log.flush()
            # PyTriton's worker says READY once its models are bound (its Triton starts before that)
            if line.startswith("READY") or (self.kind != "pytriton" and "Started GRPCInferenceService" in line):
                self._ready.set()

    def ports(self) -> tuple[int, int, int]:
        """(gRPC, HTTP, metrics)."""
        return self.grpc_port, self.http_port, self.metrics_port

    @property
    def url(self) -> str:
        return f"grpc://{self.address}:{self.grpc_port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the models are bound and both ``/v2/health/ready`` and ``/metrics`` answer (Triton
        opens its metrics port after the model endpoints); one-line error otherwise."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                tail = [ln for ln in self.lines if ln.strip()][-1:] or ["(no output)"]
                raise EngineUnavailable(f"the Triton server exited ({self.proc.returncode}): {tail[0][:200]}")
            if self._ready.is_set() and self.ready() and self._answers(self.metrics_port, "/metrics"):
                return
            time.sleep(0.1)
        self.stop()
        raise EngineUnavailable(f"the Triton server was not ready after {timeout:.0f} s", hint="see its log (--log)")

    def ready(self) -> bool:
        return self._answers(self.http_port, "/v2/health/ready")

    def _answers(self, port: int, path: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}:{port}{path}", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.address}:{self.metrics_port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def kill(self) -> None:
        """SIGKILL the whole server (a crash, for tests)."""
        process.stop_group(self.proc, kill=True)
        self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            process.stop_group(self.proc)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        else:  # the worker is gone: make sure its server is too
            process.stop_group(self.proc, kill=True)
        self._pump_thread.join(5)  # the server's last lines into the log (a child still holding the pipe: no longer)
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None
        if self._served is not None:
            shutil.rmtree(self._served, ignore_errors=True)
            self._served = None

    def __enter__(self) -> TritonServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _scratch() -> Path:
    """Where the served repositories go (``vcam-served-PID-*``, removed by :meth:`TritonServer.stop`);
    those of processes that are gone (killed before their stop) are removed here."""
    d = folders.cache_dir() / "served"
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob("vcam-served-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not process.alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return d


def _pytriton_args(
    py: Path,
    repo: Path,
    address: str,
    ports: tuple[int, int, int],
    threads: int,
    instances: int,
    tls: tuple[str, str, str] | None,
    runner: tuple[str, dict[str, str]] | None,
) -> list[str]:
    """vcam/assets/triton_worker.py's command line (PyTriton's Triton)."""
    args = [str(py), str(WORKER), str(repo), "--address", address, "--grpc-port", str(ports[0])]
    args += ["--http-port", str(ports[1]), "--metrics-port", str(ports[2]), "--threads", str(threads)]
    args += ["--instances", str(instances), "--parent", str(os.getpid())]
    if tls:
        args += ["--tls-cert", tls[0], "--tls-key", tls[1], "--tls-ca", tls[2]]
    if runner:  # (module:function, {model: its original ONNX}): the models run in that callable
        args += ["--runner", runner[0], "--runner-path", _runner_path()]
        args += [a for model, source in runner[1].items() for a in ("--source", f"{model}={source}")]
    return args


def _python_repository(repo: Path, out: Path, threads: int, instances: int, runner: tuple[str, dict[str, str]] | None) -> Path:
    from vcam.errors import ModelError
    from vcam.models.serving import python_backend_repository

    spec, sources = runner or ("", {})
    path = _runner_path()
    try:
        return python_backend_repository(
            repo, out, threads=threads, instances=instances, runner=spec, sources=sources, runner_path=path
        )
    except ModelError as exc:
        raise EngineUnavailable(str(exc), hint=exc.hint) from None


def _runner_path() -> str:
    """Where this process imports vcam and its packages from (the checkout or site-packages holding
    vcam, PYTHONPATH, site-packages): a runner's folders in the server, after its own packages."""
    import site

    own = [str(Path(__file__).resolve().parents[2]), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
    return os.pathsep.join(dict.fromkeys(p for p in [*own, *site.getsitepackages(), user] if p))


#: ``vcam serve --engine vcam``'s runner (vcam/runtime/serve_runner.py).
VCAM_RUNNER = "vcam.runtime.serve_runner:torch_engine"
ENGINES = ("auto", "onnxruntime", "vcam")


def torch_sees_a_gpu() -> bool:
    """Whether torch is installed here and sees a CUDA GPU (``--engine auto`` takes vcam's engine then)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def runner_for(engine: str, repo: Path, originals: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """``vcam serve --engine``'s runner: vcam's engine (:data:`VCAM_RUNNER`) on each model's own ONNX
    file (``originals``; with ``engine="vcam"`` and none, the repository's exported files), or None
    for onnxruntime. ``auto``: vcam's engine where torch sees a GPU and the originals are known."""
    if engine == "vcam":
        found = {p.name: str(p / "1" / "model.onnx") for p in repo.glob("*") if (p / "1" / "model.onnx").is_file()}
        return VCAM_RUNNER, {**found, **originals}
    if engine == "auto" and originals and torch_sees_a_gpu():
        return VCAM_RUNNER, dict(originals)
    return None


def _direct_options(address: str, ports: tuple[int, int, int], tls: tuple[str, str, str] | None) -> list[str]:
    """``tritonserver``'s options: the three endpoints on ``address``, metrics on, statistics open,
    stop on a model's load error."""
    args = [f"--grpc-address={address}", f"--grpc-port={ports[0]}", f"--http-address={address}"]
    args += [f"--http-port={ports[1]}", f"--metrics-address={address}", f"--metrics-port={ports[2]}"]
    args += ["--allow-metrics=true", "--allow-gpu-metrics=false", "--exit-on-error=true", "--strict-model-config=true"]
    if tls:
        args += ["--grpc-use-ssl=true", f"--grpc-server-cert={tls[0]}", f"--grpc-server-key={tls[1]}"]
        if tls[2]:
            args += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={tls[2]}"]
    return args


__all__ = [
    "DEFAULT_SERVER",
    "ENGINES",
    "PINS",
    "SERVERS",
    "VCAM_RUNNER",
    "TritonServer",
    "env_dir",
    "ensure_env",
    "find_python",
    "runner_for",
    "torch_sees_a_gpu",
]
