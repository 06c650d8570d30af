"""The model files' digests remembered between starts: one small JSON file in the user's cache dir
(``model-hashes.json``), keyed by a file's absolute path, size and modification time (ns).

The lock file beside the models (:class:`vcam.models.download.ModelStore`) already trusts a file
whose size and modification time it recorded; this cache covers the starts it does not: a models
folder the user cannot write (no lock entry can be made), a file whose lock entry is stale, a
second models folder. A warm start then reads no model file to hash it (560 MB of stand-in
inswapper and recogniser: 1.55 s on the H200 host).

The cache is advisory: a file that cannot be read or parsed, or an entry of the wrong shape, is
ignored (the file is hashed) and the cache written again whole, through a temporary file and an
atomic rename, so a crash never leaves half a cache; a write that fails is logged and forgotten.
It never touches a model file.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: The cache file's name in the user's cache dir (:func:`vcam.platform.folders.cache_dir`).
NAME = "model-hashes.json"
#: Entries kept (the most recent): model files a user has, with room to spare.
MAX_ENTRIES = 256
_VERSION = 1


class HashCache:
    """(path, size, mtime_ns) -> (crc32, sha256) of model files, in the JSON file ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    @staticmethod
    def _key(file: Path, size: int, mtime_ns: int) -> str:
        return f"{os.path.abspath(file)}\0{size}\0{mtime_ns}"

    def _read(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            log.info("model hash cache %s unreadable (%s): ignored, written again", self.path, exc)
            return {}
        files = data.get("files") if isinstance(data, dict) and data.get("version") == _VERSION else None
        if not isinstance(files, dict):
            return {}
        return {
            k: v
            for k, v in files.items()
            if isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)
        }

    def get(self, file: Path, size: int, mtime_ns: int) -> tuple[str, str] | None:
        """The (crc32, sha256) remembered for ``file`` at this size and modification time, else None."""
        got = self._read().get(self._key(file, size, mtime_ns))
        return (got[0], got[1]) if got is not None else None

    def put(self, file: Path, size: int, mtime_ns: int, crc: str, sha: str) -> None:
        """Remember ``file``'s digests (an older entry of the same path replaced); never raises."""
        path = os.path.abspath(file)
        with self._lock:
            files = {k: v for k, v in self._read().items() if k.split("\0", 1)[0] != path}
            files[self._key(file, size, mtime_ns)] = [crc, sha]
            keep = dict(list(files.items())[-MAX_ENTRIES:])
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps({"version": _VERSION, "files": keep}, indent=1) + "\n", encoding="utf-8")
                os.replace(tmp, self.path)
            except OSError as exc:
                log.info("model hash cache %s not written (%s)", self.path, exc)
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    pass
