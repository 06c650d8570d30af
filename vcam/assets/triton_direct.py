"""Run the ``tritonserver`` binary that the ``nvidia-pytriton`` wheel bundles directly, on a
repository for Triton's own Python backend (``vcam serve --server python-backend``): no PyTriton,
so no proxy hop between Triton's stub and a second Python process.

Runs in the serving environment's Python (started by vcam.runtime.serve) and imports nothing from
vcam. Prepares a backend folder once (the bundled backend with the stub built for this Python),
starts the server with the serving environment's ``bin`` first on PATH (the stub's embedded
Python finds its prefix, and so this environment's numpy < 2, from the ``python3`` on PATH), passes
the server's output through, and stops it (SIGTERM, then SIGKILL) on SIGTERM/SIGINT, once the
process that started this one is gone, or once a part of it died (a stub that aborts leaves the
server up with its requests hanging): then it exits with 3.

    python triton_direct.py REPO --parent PID -- [tritonserver options]
"""

import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

PARTS = ("libtriton_python.so", "triton_python_backend_utils.py")


def dist() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.origin:
        sys.exit("error: nvidia-pytriton is not installed in the serving environment (run `vcam serve setup`)")
    return Path(spec.origin).parent / "tritonserver"


def backends(root: Path) -> Path:
    """``ENV/vcam-backends`` with ``python/`` linking the bundled backend and this Python's stub."""
    version = "%d.%d" % sys.version_info[:2]
    out = Path(sys.prefix) / "vcam-backends"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        sys.exit(f"error: nvidia-pytriton has no Python backend stub for Python {version}")
    want = {name: root / "backends" / "python" / name for name in PARTS}
    want["triton_python_backend_stub"] = stub
    here = out / "python"
    if all((here / n).resolve() == p.resolve() for n, p in want.items() if (here / n).exists()) and all(
        (here / n).exists() for n in want
    ):
        return out
    tmp = out.with_name(f"vcam-backends.{os.getpid()}")
    (tmp / "python").mkdir(parents=True, exist_ok=True)
    for name, target in want.items():
        (tmp / "python" / name).symlink_to(target)
    try:
        os.rename(tmp, out)  # a second server made it at the same time: theirs is the same
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv or len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    own, rest = argv[:cut], argv[cut + 1 :]
    repo = own[0]
    parent = int(own[own.index("--parent") + 1]) if "--parent" in own else 0
    root = dist()
    libs = root.parent.parent / "nvidia_pytriton.libs"
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    cmd = [str(root / "bin" / "tritonserver"), f"--model-repository={repo}", f"--backend-directory={backends(root)}"]
    cmd += [f"--cache-directory={root / 'caches'}", *rest]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    fatal = []

    def stop(*_):  # from a signal handler too: never waits here
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            killer = threading.Timer(20.0, lambda: proc.returncode is None and proc.kill())
            killer.daemon = True
            killer.start()

    def watch():
        while parent and os.getppid() == parent and proc.poll() is None:
            time.sleep(0.5)
        stop()

    def relay():  # the server's and its stubs' output, passed through; a part that died stops it all
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if not fatal and line.startswith("terminate called"):
                fatal.append(line.strip())
                print("a part of the server died (its Python backend's stub, or the server): stopping it", flush=True)
                stop()

    signal.signal(signal.SIGTERM, lambda *_: stop())
    signal.signal(signal.SIGINT, lambda *_: stop())
    threading.Thread(target=watch, daemon=True).start()
    threading.Thread(target=relay, daemon=True).start()
    while True:
        try:
            rc = proc.wait()
            return 3 if fatal else rc
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main())
