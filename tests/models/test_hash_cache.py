"""The model files' digests remembered in the user's cache dir (vcam.models.hash_cache): a start
that the lock file cannot spare the reading (no lock entry: a folder it cannot write, a stale
entry) reads each model file once; a changed modification time reads it again; a damaged cache
file is ignored and written again whole; a model file is never touched."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from vcam.models import download
from vcam.models.download import ModelStore, crc32_text
from vcam.models.hash_cache import HashCache


@pytest.fixture()
def placed(tmp_path) -> tuple[Path, bytes]:
    """A hand-placed model file with its .hash (verified by its CRC and tensors, then locked)."""
    from vcam.models import standin

    models = tmp_path / "models"
    models.mkdir()
    path = standin.write("crossface_simswap", models / "crossface_simswap.onnx", seed=1)
    data = path.read_bytes()
    (models / "crossface_simswap.hash").write_text(crc32_text(data))
    return path, data


@pytest.fixture()
def reads(monkeypatch) -> list[Path]:
    seen: list[Path] = []
    real = download.file_digests
    monkeypatch.setattr(download, "file_digests", lambda p: seen.append(p) or real(p))
    return seen


def _fresh_store(path: Path, cache: Path) -> ModelStore:
    """A store that finds no lock entry (as for a models folder it cannot write): only the cache spares the read."""
    (path.parent / download.LOCK_NAME).unlink(missing_ok=True)
    return ModelStore(path.parent, progress=False, hash_cache=cache)


def test_a_second_start_without_a_lock_entry_reads_nothing(placed, reads, tmp_path):
    path, data = placed
    cache = tmp_path / "cache" / "model-hashes.json"
    want = hashlib.sha256(data).hexdigest()
    assert _fresh_store(path, cache).verify("crossface_simswap") == want and reads == [path]
    assert _fresh_store(path, cache).verify("crossface_simswap") == want and reads == [path]  # a hit
    assert _fresh_store(path, cache).verify("crossface_simswap", full=True) == want and len(reads) == 2  # full reads
    assert path.read_bytes() == data


def test_a_changed_modification_time_reads_the_file_again(placed, reads, tmp_path):
    path, data = placed
    cache = tmp_path / "model-hashes.json"
    _fresh_store(path, cache).verify("crossface_simswap")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 3_000_000_000))
    assert _fresh_store(path, cache).verify("crossface_simswap") == hashlib.sha256(data).hexdigest()
    assert len(reads) == 2
    entries = json.loads(cache.read_text())["files"]
    assert len(entries) == 1 and str(path.stat().st_mtime_ns) in next(iter(entries))  # the old entry replaced
    _fresh_store(path, cache).verify("crossface_simswap")
    assert len(reads) == 2


def test_other_bytes_under_a_remembered_size_and_time_are_still_refused_by_the_lock(placed, tmp_path):
    """The cache answers for (path, size, mtime) only: a file rewritten gets a new mtime, is read, and
    the lock file's SHA-256 refuses it as before."""
    path, data = placed
    cache = tmp_path / "model-hashes.json"
    store = ModelStore(path.parent, progress=False, hash_cache=cache)
    store.verify("crossface_simswap")
    from vcam.models import standin

    other = standin.write("crossface_simswap", path.parent / "other.onnx", seed=2).read_bytes()
    path.write_bytes(other[: len(data)].ljust(len(data), b"\0"))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    with pytest.raises(download.ModelError, match="changed since it was verified"):
        store.verify("crossface_simswap")


@pytest.mark.parametrize(
    "damage",
    [b"\x00\xffnot json", b'{"version": 1, "files": []}', b'{"version": 99, "files": {}}', b'{"version": 1, "files": {"x": 3}}'],
)
def test_a_damaged_cache_file_is_ignored_and_written_again(placed, reads, tmp_path, damage):
    path, data = placed
    cache = tmp_path / "model-hashes.json"
    cache.write_bytes(damage)
    want = hashlib.sha256(data).hexdigest()
    assert _fresh_store(path, cache).verify("crossface_simswap") == want and len(reads) == 1
    written = json.loads(cache.read_text())
    assert written["version"] == 1 and [v[1] for v in written["files"].values()] == [want]
    assert not list(tmp_path.glob("model-hashes.json.*.tmp"))  # written through a temporary file, renamed
    assert _fresh_store(path, cache).verify("crossface_simswap") == want and len(reads) == 1


def test_a_cache_that_cannot_be_written_only_costs_the_read(placed, reads, tmp_path):
    path, data = placed
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache dir would be")
    cache = blocked / "model-hashes.json"
    for _ in range(2):
        assert _fresh_store(path, cache).verify("crossface_simswap") == hashlib.sha256(data).hexdigest()
    assert len(reads) == 2 and blocked.read_text() == "a file where the cache dir would be"


def test_the_cache_keeps_its_newest_entries(tmp_path, monkeypatch):
    from vcam.models import hash_cache

    monkeypatch.setattr(hash_cache, "MAX_ENTRIES", 3)
    c = HashCache(tmp_path / "h.json")
    for i in range(5):
        c.put(tmp_path / f"m{i}.onnx", 10, i, "00000000", f"{i:064x}")
    assert c.get(tmp_path / "m0.onnx", 10, 0) is None
    assert c.get(tmp_path / "m4.onnx", 10, 4) == ("00000000", f"{4:064x}")
    assert c.get(tmp_path / "m4.onnx", 11, 4) is None  # another size: a miss
    assert len(json.loads((tmp_path / "h.json").read_text())["files"]) == 3


def test_the_daemons_store_keeps_its_cache_in_the_user_cache_dir():
    from vcam.config import Config
    from vcam.platform import folders
    from vcam.runtime.roles import model_store

    store = model_store(Config())
    assert store.hash_cache is not None and store.hash_cache.path == folders.cache_dir() / "model-hashes.json"


def test_a_lock_file_that_cannot_be_written_costs_no_run_and_no_second_read(placed, reads, tmp_path):
    """A models folder whose lock file cannot be written (its lock's lock is in the way here; a
    folder the user cannot write elsewhere): each start verifies the file, the run goes on, and the
    cache spares the second start the reading."""
    path, data = placed
    (path.parent / (download.LOCK_NAME + ".lk")).mkdir()  # the flock's file cannot be opened
    cache = tmp_path / "model-hashes.json"
    want = hashlib.sha256(data).hexdigest()
    for _ in range(2):
        assert ModelStore(path.parent, progress=False, hash_cache=cache).verify("crossface_simswap") == want
    assert not (path.parent / download.LOCK_NAME).exists() and reads == [path]
