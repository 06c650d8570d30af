"""Where built engines live and how they are keyed.

A built engine (a TensorRT plan, an Inductor cache) is only valid for the exact model bytes, GPU,
library version, precision and shape profile it was built for. :class:`EngineKey` holds those five
facts; its :meth:`~EngineKey.digest` names the file, so a changed fact means a different file and a
rebuild, and an unchanged one means reuse. Each plan has a JSON sidecar with the key in clear text,
checked again on load (a renamed or hand-copied file with a stale key is rebuilt, never trusted).

Cache directory: an explicit ``cache_dir``; else ``$VCAM_ENGINE_CACHE``; else ``engines/`` at the root of a source checkout
(the folder with ``engines/README.md`` next to the ``vcam`` package); else the user cache dir
(:mod:`vcam.platform.folders`) ``.../vcam/engines``. Files are written to a temporary name and renamed, so a crash
never leaves a half-written plan under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

APP = "vcam"
KEY_VERSION = 1  # bump when the meaning of a key field changes
_SAMPLE = 64 * 1024  # bytes hashed at each end of a model file by model_identity


def sha256_file(path: str | os.PathLike, *, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_identity(model: bytes | bytearray | str | os.PathLike[str]) -> dict[str, Any]:
    """What identifies the ONNX source: bytes by their SHA-256; a file by its name, size,
    modification time and a hash of its first and last 64 KiB (no full read of 550 MB)."""
    if isinstance(model, (bytes, bytearray)):
        return {"sha256": hashlib.sha256(bytes(model)).hexdigest()}
    path = Path(model)
    st = path.stat()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_SAMPLE))
        if st.st_size > 2 * _SAMPLE:
            f.seek(st.st_size - _SAMPLE)
            h.update(f.read(_SAMPLE))
    return {"file": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sample": h.hexdigest()}


def profile_for(
    input_shapes: dict[str, tuple], max_batch: int, *, dynamic: tuple[int, int, int] = (32, 640, 2048)
) -> dict[str, tuple]:
    """Optimisation profile (min, opt, max) per input for batch 1..``max_batch``.

    ``input_shapes``: per input, the model's shape with ints for fixed dims and None/str for dynamic
    ones. The first dim is the batch: min 1, opt ``max_batch``, max ``max_batch``. Other dynamic
    dims take ``dynamic`` = (min, opt, max). Fixed dims stay as they are. Returned as
    ``{name: (min_shape, opt_shape, max_shape)}`` with tuples of ints (JSON-friendly and hashable).
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    prof = {}
    for name, shape in input_shapes.items():
        lo, opt, hi = [], [], []
        for i, d in enumerate(shape):
            if isinstance(d, int) and d > 0 and i > 0:
                dims = (d, d, d)
            elif i == 0:
                if isinstance(d, int) and d > 0:  # fixed batch: the profile cannot change it
                    dims = (d, d, d)
                else:
                    dims = (1, int(max_batch), int(max_batch))
            else:
                dims = (dynamic[0], dynamic[1], dynamic[2])
            lo.append(dims[0])
            opt.append(dims[1])
            hi.append(dims[2])
        prof[name] = (tuple(lo), tuple(opt), tuple(hi))
    return prof


@dataclass(frozen=True)
class EngineKey:
    """Everything a built engine depends on. ``profile``: see :func:`profile_for`."""

    model_sha256: str
    gpu: str  # device name and compute capability, e.g. "NVIDIA H200 (sm_90)"
    library: str  # e.g. "tensorrt 10.7.0"
    precision: str  # "fp16" | "fp32"
    profile: tuple  # ((name, (min, opt, max)), ...) sorted by name

    @classmethod
    def make(cls, *, model_sha256: str, gpu: str, library: str, precision: str, profile: dict[str, tuple]) -> EngineKey:
        if precision not in ("fp16", "fp32"):
            raise ValueError(f"precision must be fp16 or fp32, got {precision!r}")
        norm = tuple(sorted((str(n), tuple(tuple(int(d) for d in s) for s in shapes)) for n, shapes in profile.items()))
        return cls(model_sha256=model_sha256.lower(), gpu=gpu, library=library, precision=precision, profile=norm)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["profile"] = {n: [list(s) for s in shapes] for n, shapes in self.profile}
        d["key_version"] = KEY_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EngineKey:
        if d.get("key_version") != KEY_VERSION:
            raise ValueError(f"engine key version {d.get('key_version')} != {KEY_VERSION}")
        return cls.make(
            model_sha256=d["model_sha256"],
            gpu=d["gpu"],
            library=d["library"],
            precision=d["precision"],
            profile={n: tuple(tuple(s) for s in shapes) for n, shapes in d["profile"].items()},
        )

    def digest(self) -> str:
        """16 hex digits that change whenever any field changes."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def default_cache_dir() -> Path:
    """``$VCAM_ENGINE_CACHE``; else ``engines/`` of the source checkout this package runs from; else
    the user cache dir."""
    if os.environ.get("VCAM_ENGINE_CACHE"):
        return Path(os.environ["VCAM_ENGINE_CACHE"]).expanduser()
    repo = Path(__file__).resolve().parents[2]
    if (repo / "engines" / "README.md").is_file() and (repo / "vcam").is_dir() and os.access(repo / "engines", os.W_OK):
        return repo / "engines"
    from vcam.platform import folders

    return folders.cache_dir() / "engines"


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def engine_path(
    cache_dir: str | os.PathLike | None, model_path: str | os.PathLike, key: EngineKey, *, suffix: str = ".plan"
) -> Path:
    """``<cache>/<model stem>.<precision>.<digest><suffix>``."""
    stem = Path(model_path).stem
    return resolve_cache_dir(cache_dir) / f"{stem}.{key.precision}.{key.digest()}{suffix}"


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def lookup(path: Path, key: EngineKey) -> bytes | None:
    """The cached engine bytes at ``path`` if its sidecar records exactly ``key``, else None."""
    meta = sidecar(path)
    if not path.is_file() or not meta.is_file():
        return None
    try:
        stored = EngineKey.from_json(json.loads(meta.read_text()))
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None
    if stored != key:
        return None
    data = path.read_bytes()
    return data if data else None


def store(path: Path, key: EngineKey, data: bytes) -> Path:
    """Write ``data`` and its key sidecar atomically (temp name, then rename; plan first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, bytes(data))
    _atomic_write(sidecar(path), json.dumps(key.to_json(), indent=2, sort_keys=True).encode())
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def lock(path: Path) -> Any:
    """The lock one process holds while it builds ``path`` (``<entry>.lock``, a ``filelock.FileLock``:
    an OS lock, released when its process dies): a second process, or daemon, waits for it or
    builds something else, never the same entry at the same time."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path.with_name(path.name + ".lock"))


def locked(path: Path) -> bool:
    """Whether another process (or lock object) builds ``path`` now."""
    from filelock import Timeout

    probe = lock(path)
    try:
        probe.acquire(timeout=0)
    except Timeout:
        return True
    probe.release()
    return False


def failed_path(path: Path) -> Path:
    """Where a failed build of ``path`` is remembered (so no daemon retries it at every start)."""
    return path.with_name(path.name + ".failed")


def mark_failed(path: Path, reason: str) -> None:
    """Remember that building ``path`` failed, and why (one line); :func:`failure` reads it back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.failed.tmp")
    tmp.write_text(json.dumps({"reason": reason[:500], "when": time.time()}))
    os.replace(tmp, failed_path(path))


def failure(path: Path) -> str | None:
    """Why the last build of ``path`` failed, or None when none failed (or the mark was cleared)."""
    try:
        return str(json.loads(failed_path(path).read_text())["reason"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, OSError):
        return "unknown reason (unreadable mark)"


def clear_failure(path: Path) -> None:
    try:
        failed_path(path).unlink()
    except FileNotFoundError:
        pass


__all__ = [
    "clear_failure",
    "failed_path",
    "failure",
    "lock",
    "locked",
    "mark_failed",
    "EngineKey",
    "sha256_file",
    "model_identity",
    "profile_for",
    "default_cache_dir",
    "resolve_cache_dir",
    "engine_path",
    "sidecar",
    "lookup",
    "store",
]
