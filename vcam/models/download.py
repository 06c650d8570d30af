"""Model files on disk: resumable verified downloads, and verification on every load.

Rules:
- A download goes to ``NAME.onnx.part`` and resumes from the bytes already there (HTTP Range).
  Transient failures (connection reset, timeouts, HTTP 5xx/429) are retried with exponential
  backoff, resuming each time; HTTP 404 moves on to the mirror at once.
- The finished ``.part`` is checked against the CRC-32 in the ``.hash`` sibling (8 hex digits) and
  any pinned SHA-256; only then is it renamed to its final name. A failing file is deleted, never
  left under the final name.
- The first verified SHA-256 of each file is recorded in ``models.lock.json`` in the models dir;
  every later load recomputes it and refuses a file that changed. A SHA-256 pinned by the user in
  ``[models] sha256`` wins over the lock file.
- Files placed by hand are accepted when their ``.hash`` sibling (if any) matches and their tensors
  match the registry; their SHA-256 is then locked like a download's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from vcam.errors import ModelError
from vcam.models import registry
from vcam.models.hash_cache import HashCache
from vcam.models.registry import ModelSpec

log = logging.getLogger(__name__)

LOCK_NAME = "models.lock.json"
CHUNK = 1 << 20
USER_AGENT = "vcam-model-fetch/1"


# -- hashing --------------------------------------------------------------------------------------
def file_digests(path: Path) -> tuple[str, str]:
    """(crc32 as 8 lowercase hex digits, sha256 hex) of a file, in one pass."""
    crc = 0
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK)
            if not block:
                break
            crc = zlib.crc32(block, crc)
            sha.update(block)
    return f"{crc & 0xFFFFFFFF:08x}", sha.hexdigest()


def crc32_text(data: bytes) -> str:
    """The ``.hash`` file content for ``data``: CRC-32 as 8 lowercase hex digits, no newline."""
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def _parse_hash(text: str, where: str) -> str:
    value = text.strip().lower()
    if len(value) != 8 or any(c not in "0123456789abcdef" for c in value):
        raise ModelError(f"{where} is not a CRC-32 hash file (expected 8 hex digits, got {text[:40]!r})")
    return value


# -- HTTP -----------------------------------------------------------------------------------------
class _Permanent(Exception):
    """A failure retrying the same URL cannot fix (404, 403, bad range)."""


class _Transient(Exception):
    """A failure worth retrying (5xx, timeouts, resets, truncated bodies)."""


def _is_offline(exc: BaseException) -> bool:
    import urllib.error

    reason = getattr(exc, "reason", exc)
    return isinstance(reason, (socket.gaierror, ConnectionRefusedError, OSError)) and not isinstance(exc, urllib.error.HTTPError)


def _open(url: str, *, start: int = 0, timeout: float = 30.0):
    import urllib.error
    import urllib.request  # here, not at the top: a start that downloads nothing skips urllib, http and ssl

    headers = {"User-Agent": USER_AGENT}
    if start:
        headers["Range"] = f"bytes={start}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and start:
            return exc  # the caller decides (the .part may already be complete)
        if exc.code in (404, 410, 401, 403):
            raise _Permanent(f"HTTP {exc.code} {exc.reason}") from None
        if exc.code >= 500 or exc.code == 429:
            raise _Transient(f"HTTP {exc.code} {exc.reason}") from None
        raise _Permanent(f"HTTP {exc.code} {exc.reason}") from None


def fetch_text(url: str, *, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5) -> str:
    """Small text file (a ``.hash``) with retries. Raises _Permanent / _Transient / URLError."""
    import urllib.error
    from http.client import HTTPException

    last: Exception | None = None
    for attempt in range(retries + 1):
        try:
            with _open(url, timeout=timeout) as resp:
                return resp.read(4096).decode("ascii", "replace")
        except _Transient as exc:
            last = exc
        except (urllib.error.URLError, TimeoutError, ConnectionError, HTTPException, socket.timeout) as exc:
            last = exc
            if _is_offline(exc) and not isinstance(exc, (TimeoutError, socket.timeout)):
                raise
        if attempt < retries:
            time.sleep(backoff * (2**attempt))
    assert last is not None
    raise _Transient(str(last))


ProgressFn = Callable[[int, int | None], None]


def download_to(
    url: str,
    part: Path,
    *,
    retries: int = 4,
    backoff: float = 0.5,
    timeout: float = 30.0,
    progress: ProgressFn | None = None,
) -> int:
    """Download ``url`` into ``part``, resuming from its current size. Returns the final size.

    Raises _Permanent (404 ...), _Transient after the retries are spent, or URLError when the host
    cannot be reached at all.
    """
    import urllib.error
    from http.client import HTTPException, IncompleteRead

    last: Exception | None = None
    for attempt in range(retries + 1):
        start = part.stat().st_size if part.exists() else 0
        try:
            resp = _open(url, start=start, timeout=timeout)
            with resp:
                status = getattr(resp, "status", None) or resp.getcode()
                if status == 416:  # nothing left to send: the .part is complete (verification decides)
                    return start
                if start and status == 200:
                    start = 0  # server ignored Range: start over
                length = resp.headers.get("Content-Length")
                total = start + int(length) if length is not None else None
                if status == 206:
                    content_range = resp.headers.get("Content-Range", "")
                    if not content_range.startswith(f"bytes {start}-"):
                        raise _Transient(f"unexpected Content-Range {content_range!r} for a resume from byte {start}")
                    if "/" in content_range and content_range.rsplit("/", 1)[1].isdigit():
                        total = int(content_range.rsplit("/", 1)[1])
                done = start
                if progress:
                    progress(done, total)
                with open(part, "ab" if start else "wb") as fh:
                    while True:
                        try:
                            block = resp.read(CHUNK)
                        except IncompleteRead as exc:  # keep what arrived, resume after it
                            fh.write(exc.partial)
                            done += len(exc.partial)
                            raise _Transient(f"connection closed at byte {done}") from None
                        if not block:
                            break
                        fh.write(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
                if total is not None and done < total:
                    raise _Transient(f"connection closed at byte {done} of {total}")
                return done
        except _Permanent:
            raise
        except _Transient as exc:
            last = exc
        except (urllib.error.URLError, TimeoutError, ConnectionError, HTTPException, socket.timeout, OSError) as exc:
            if isinstance(exc, urllib.error.URLError) and _is_offline(exc) and not part.exists():
                raise
            last = exc
        if attempt < retries:
            got = part.stat().st_size if part.exists() else 0
            log.info("download of %s interrupted at byte %d (%s); retrying", url, got, last)
            time.sleep(backoff * (2**attempt))
    raise _Transient(f"gave up after {retries + 1} attempts: {last}")


# -- the store ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileState:
    name: str
    path: Path | None
    state: str  # "embedded", "missing", "partial", "present", "verified"
    detail: str = ""


class _RichProgress:
    """A rich progress bar per file; a no-op when disabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar = None
        self._task = None

    def __enter__(self) -> _RichProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._bar.__enter__()
        return self

    def start(self, label: str) -> ProgressFn | None:
        if not self._bar:
            return None
        task = self._bar.add_task(label, total=None)

        def update(done: int, total: int | None) -> None:
            self._bar.update(task, completed=done, total=total)

        return update

    def __exit__(self, *exc) -> None:
        if self._bar:
            self._bar.__exit__(*exc)


class ModelStore:
    """Model files in one directory, with the lock file beside them.

    ``mirrors``: URL templates with ``{base}`` and ``{file}`` tried before the registry's own URLs
    (a local mirror, or a test server); ``official=False`` skips the registry's own URLs. ``pins``: file name (or
    model name) -> SHA-256. ``hash_cache``: a file remembering the digests of the files hashed
    (:class:`~vcam.models.hash_cache.HashCache`, in the user's cache dir), so a start whose lock
    file cannot trust a file (a folder it cannot write, a stale entry) still reads it only once.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        pins: dict[str, str] | None = None,
        mirrors: Sequence[str] = (),
        allow_download: bool = False,
        progress: bool = True,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: float = 30.0,
        official: bool = True,
        hash_cache: str | os.PathLike | None = None,
    ) -> None:
        self.root = Path(root)
        self.hash_cache = HashCache(hash_cache) if hash_cache is not None else None
        self.official = official
        self.pins = {k: v.lower() for k, v in (pins or {}).items()}
        self.mirrors = list(mirrors)
        self.allow_download = allow_download
        self.progress = progress
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self._lock = threading.Lock()

    # -- paths and lock file ----------------------------------------------------------------------
    def path(self, name: str) -> Path:
        spec = registry.get(name)
        if spec.file is None:
            raise ModelError(f"{name} is built in and has no file", hint="nothing to download")
        return self.root / spec.file

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    def read_lock(self) -> dict:
        try:
            data = json.loads(self.lock_path.read_text())
        except FileNotFoundError:
            return {"files": {}}
        except (OSError, ValueError) as exc:
            raise ModelError(
                f"{self.lock_path} is unreadable: {exc}", hint="fix or delete it; files will be re-verified"
            ) from None
        data.setdefault("files", {})
        return data

    def _record(self, file: str, sha: str, crc: str, size: int, origin: str) -> None:
        from filelock import FileLock

        path = self.root / file
        self.root.mkdir(parents=True, exist_ok=True)
        # Another store of the same folder (a second load in this process, another vcam) may record
        # at the same time: one at a time (an flock), each through its own temporary file.
        with self._lock, FileLock(str(self.lock_path) + ".lk"):
            data = self.read_lock()
            data["files"][file] = {
                "sha256": sha,
                "crc32": crc,
                "size": size,
                "mtime_ns": path.stat().st_mtime_ns if path.is_file() else None,
                "source": origin,
                "verified": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            tmp = self.lock_path.with_name(f"{LOCK_NAME}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, self.lock_path)

    def _remember(self, file: str, sha: str, crc: str, size: int, origin: str) -> None:
        """:meth:`_record` for a file verified in place: a lock file that cannot be written (a models
        folder the user cannot write) costs one log line and the check at the next start (with the
        hash cache, without reading the file), never the run."""
        try:
            self._record(file, sha, crc, size, origin)
        except OSError as exc:
            log.info("%s not recorded in %s (%s): checked again at the next start", file, self.lock_path, exc)

    def _pin(self, spec: ModelSpec) -> str | None:
        return self.pins.get(spec.file) or self.pins.get(spec.name) or (spec.sha256.lower() if spec.sha256 else None)

    def _urls(self, spec: ModelSpec, file: str) -> list[str]:
        own = [m.format(base=spec.base, file=file) for m in self.mirrors]
        return own + (spec.urls(file) if self.official else [])

    # -- status and verification ------------------------------------------------------------------
    def state(self, name: str) -> FileState:
        spec = registry.get(name)
        if spec.file is None:
            return FileState(name, None, "embedded", spec.embedded or "")
        path = self.root / spec.file
        if not path.exists():
            part = path.with_name(path.name + ".part")
            if part.exists():
                return FileState(name, path, "partial", f"{part.stat().st_size} bytes downloaded")
            return FileState(name, path, "missing")
        locked = self.read_lock()["files"].get(spec.file)
        return FileState(name, path, "verified" if locked else "present", locked["sha256"][:12] if locked else "")

    def _reject(self, path: Path, message: str, hint: str) -> None:
        """Move a file that failed verification out of the way (never deleted: it may be the
        user's) and raise."""
        aside = path.with_name(path.name + ".rejected")
        try:
            os.replace(path, aside)
            moved = f"; moved to {aside.name}"
        except OSError:
            moved = ""
        raise ModelError(message + moved, hint=hint)

    def verify(self, name: str, *, full: bool = False) -> str:
        """Check the file on disk; returns its SHA-256. Raises ModelError naming what differs.

        Order: the user's pin, else the lock file; a file with neither is verified against its
        ``.hash`` sibling (when present) and the registry's tensors, then locked. A file verified
        before whose size and modification time are unchanged (and whose locked SHA-256 equals the
        pin, if any) is trusted without reading it again (hashing 560 MB costs seconds at every
        start); ``full`` (``vcam models verify``) always re-reads it.
        """
        spec = registry.get(name)
        if spec.file is None:
            return ""
        path = self.root / spec.file
        if not path.is_file():
            raise ModelError(f"model {name} is missing: {path}", hint=self.how_to_get([name]))
        pin = self._pin(spec)
        locked = self.read_lock()["files"].get(spec.file)
        if locked and not full:
            st = path.stat()
            same = locked.get("size") == st.st_size and locked.get("mtime_ns") == st.st_mtime_ns
            if same and (not pin or pin == locked.get("sha256")):
                return str(locked["sha256"])
        crc, sha = self._digests(path, full)
        if pin:
            if sha != pin:
                self._reject(
                    path,
                    f"{path} does not match the pinned SHA-256 (expected {pin[:16]}..., got {sha[:16]}...)",
                    hint="run `vcam models pull " + name + "`, or fix [models] sha256 in the config",
                )
        elif locked:
            if sha != locked.get("sha256"):
                self._reject(
                    path,
                    f"{path} changed since it was verified (SHA-256 {sha[:16]}... != locked {locked['sha256'][:16]}...)",
                    hint=f"run `vcam models pull {name}`; if you replaced it on purpose, rename it back and remove "
                    f"its entry from {self.lock_path}",
                )
            if locked.get("mtime_ns") != path.stat().st_mtime_ns or locked.get("size") != path.stat().st_size:
                # the same bytes (touched, copied, or locked by an older vcam): trust them from now on
                self._remember(spec.file, sha, crc, path.stat().st_size, str(locked.get("source", "manual")))
            return sha
        hash_path = path.with_name(spec.hash_file)
        if hash_path.is_file():
            want = _parse_hash(hash_path.read_text(errors="replace"), str(hash_path))
            if crc != want:
                self._reject(
                    path,
                    f"{path} fails its CRC-32 check ({crc} != {want} from {hash_path.name})",
                    hint=f"the file is corrupt or incomplete; run `vcam models pull {name}`",
                )
        self.check_tensors(name, path)
        if not locked:
            self._remember(spec.file, sha, crc, path.stat().st_size, "pinned" if pin else "manual")
        return sha

    def _digests(self, path: Path, full: bool) -> tuple[str, str]:
        """(crc32, sha256) of ``path``: from the hash cache when it has the file at this size and
        modification time (never for ``full``), else read (and remembered there)."""
        cache = self.hash_cache
        if cache is None:
            return file_digests(path)
        st = path.stat()
        got = None if full else cache.get(path, st.st_size, st.st_mtime_ns)
        if got is not None:
            return got
        crc, sha = file_digests(path)
        after = path.stat()
        if (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns):  # not written meanwhile
            cache.put(path, st.st_size, st.st_mtime_ns, crc, sha)
        return crc, sha

    def check_tensors(self, name: str, path: Path) -> None:
        """The ONNX file's inputs (names and ranks) must match the registry row, and it must have at
        least the declared outputs (a file may carry more, e.g. an extra mask)."""
        import onnx

        spec = registry.get(name)
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as exc:
            raise ModelError(
                f"{path} is not a readable ONNX model: {exc}", hint=f"delete it and run `vcam models pull {name}`"
            ) from None
        init = {i.name for i in model.graph.initializer}
        got_in = {i.name: len(i.type.tensor_type.shape.dim) for i in model.graph.input if i.name not in init}
        got_out = len(model.graph.output)
        del model
        want_in = {t.name: len(t.shape) for t in spec.inputs}
        if spec.kind in ("swapper", "recogniser", "enhancer", "converter") and (got_in != want_in or got_out < len(spec.outputs)):
            raise ModelError(
                f"{path.name} has inputs {got_in} and {got_out} outputs; {name} should have inputs {want_in} "
                f"and at least {len(spec.outputs)} outputs",
                hint="this is not the expected model file; check the name",
            )

    def ensure(self, names: Iterable[str], *, download: bool | None = None) -> dict[str, Path]:
        """Paths of verified files for ``names``, downloading missing ones when allowed.

        ``download``: None follows ``allow_download``. When something is missing and downloads are
        not allowed (or the host is unreachable) one ModelError names every missing file and where
        to put it by hand.
        """
        names = list(dict.fromkeys(names))
        allow = self.allow_download if download is None else download
        missing = [n for n in names if registry.get(n).file and not self.path(n).is_file()]
        if missing and not allow:
            raise ModelError(
                "missing model files: " + ", ".join(registry.get(n).file for n in missing),
                hint=f"run `vcam models pull {' '.join(missing)}` (or pass --download), or {self.how_to_get(missing)}",
            )
        out: dict[str, Path] = {}
        if missing:
            self.pull(missing)
        for n in names:
            spec = registry.get(n)
            if spec.file is None:
                continue
            self.verify(n)
            out[n] = self.path(n)
        return out

    def how_to_get(self, names: Sequence[str]) -> str:
        parts = []
        for n in names:
            spec = registry.get(n)
            urls = spec.urls()
            if urls:
                parts.append(f"{spec.file} (with {spec.hash_file}) from {urls[0]}")
        return f"download {'; '.join(parts)} and put them in {self.root}"

    # -- downloading ------------------------------------------------------------------------------
    def pull(self, names: Sequence[str] | str, *, force: bool = False) -> list[Path]:
        """Download (if needed) and verify each model; returns their paths."""
        if isinstance(names, str):
            names = [names]
        specs = [registry.get(n) for n in names]
        out: list[Path] = []
        offline: list[tuple[ModelSpec, str]] = []
        with _RichProgress(self.progress) as bars:
            for spec in specs:
                if spec.file is None:
                    continue
                path = self.root / spec.file
                if path.is_file() and not force:
                    try:
                        self.verify(spec.name)
                        out.append(path)
                        continue
                    except ModelError as exc:
                        if path.exists():
                            raise
                        log.warning("%s; downloading it again", exc)
                try:
                    out.append(self._pull_one(spec, bars))
                except _Offline as exc:
                    offline.append((spec, str(exc)))
        if offline:
            files = ", ".join(s.file for s, _ in offline)
            raise ModelError(
                f"cannot download {files}: the model hosts are unreachable ({offline[0][1]})",
                hint=self.how_to_get([s.name for s, _ in offline]),
            )
        return out

    def _pull_one(self, spec: ModelSpec, bars: _RichProgress) -> Path:
        import urllib.error

        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / spec.file
        part = final.with_name(final.name + ".part")
        locked = self.read_lock()["files"].get(spec.file)
        pin = self._pin(spec) or (locked or {}).get("sha256")
        failures: list[str] = []
        n_offline = 0
        urls = self._urls(spec, spec.file)
        hash_urls = self._urls(spec, spec.hash_file)
        for url, hash_url in zip(urls, hash_urls):
            try:
                want_crc = _parse_hash(
                    fetch_text(hash_url, timeout=self.timeout, retries=self.retries, backoff=self.backoff), hash_url
                )
            except _Permanent as exc:
                if not pin:
                    failures.append(f"{hash_url}: {exc}")
                    continue
                want_crc = None
            except _Transient as exc:
                failures.append(f"{hash_url}: {exc}")
                continue
            except urllib.error.URLError as exc:
                n_offline += 1
                failures.append(f"{url}: {getattr(exc, 'reason', exc)}")
                continue
            try:
                download_to(
                    url, part, retries=self.retries, backoff=self.backoff, timeout=self.timeout, progress=bars.start(spec.file)
                )
            except (_Permanent, _Transient) as exc:
                failures.append(f"{url}: {exc}")
                continue
            except urllib.error.URLError as exc:
                n_offline += 1
                failures.append(f"{url}: {getattr(exc, 'reason', exc)}")
                continue
            crc, sha = file_digests(part)
            problem = None
            if want_crc is not None and crc != want_crc:
                problem = f"CRC-32 {crc} does not match {want_crc} from {spec.hash_file}"
            elif pin and sha != pin:
                problem = f"SHA-256 {sha[:16]}... does not match the pinned {pin[:16]}..."
            if problem:
                part.unlink(missing_ok=True)
                raise ModelError(
                    f"downloaded {spec.file} from {url} is corrupt: {problem}; the file was deleted",
                    hint=f"try again later, or download it by hand into {self.root} and run `vcam models verify`",
                )
            try:
                self.check_tensors(spec.name, part)
            except ModelError:
                part.unlink(missing_ok=True)
                raise
            if want_crc is not None:
                (self.root / spec.hash_file).write_text(want_crc)
            os.replace(part, final)
            self._record(spec.file, sha, crc, final.stat().st_size, url)
            log.info("downloaded and verified %s (sha256 %s)", final, sha)
            return final
        if n_offline == len(urls):
            raise _Offline(failures[0].split(": ", 1)[-1] if failures else "no route")
        raise ModelError(f"cannot download {spec.file}: " + "; ".join(failures), hint=self.how_to_get([spec.name]))


class _Offline(Exception):
    pass
