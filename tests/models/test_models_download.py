"""Model downloads against a real HTTP server on 127.0.0.1 serving stand-in files and .hash files."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

import pytest
from model_server import ModelServer as _Server
from typer.testing import CliRunner

from vcam.errors import ModelError
from vcam.models import registry, standin
from vcam.models.download import ModelStore, crc32_text

BASE = "models-3.0.0"


@pytest.fixture()
def server(tmp_path):
    s = _Server(tmp_path / "www")
    yield s
    s.close()


@pytest.fixture(scope="module")
def tiny_swapper_bytes(tmp_path_factory) -> bytes:
    p = standin.write("inswapper_128", tmp_path_factory.mktemp("si") / "inswapper_128.onnx", tiny=True)
    return p.read_bytes()


@pytest.fixture(scope="module")
def converter_bytes(tmp_path_factory) -> tuple[bytes, bytes]:
    d = tmp_path_factory.mktemp("conv")
    a = standin.write("crossface_simswap", d / "a.onnx", seed=1).read_bytes()
    b = standin.write("crossface_simswap", d / "b.onnx", seed=2).read_bytes()
    return a, b


def _store(tmp_path: Path, server: _Server, **kw) -> ModelStore:
    kw.setdefault("mirrors", [server.template])
    return ModelStore(tmp_path / "models", official=False, progress=False, retries=2, backoff=0.01, timeout=5, **kw)


def test_full_download_verifies_and_locks(tmp_path, server, converter_bytes):
    data = converter_bytes[0]
    server.publish("crossface_simswap", data)
    store = _store(tmp_path, server)
    [path] = store.pull(["crossface_simswap"])
    assert path == tmp_path / "models" / "crossface_simswap.onnx"
    assert path.read_bytes() == data
    assert not path.with_name(path.name + ".part").exists()
    assert (path.parent / "crossface_simswap.hash").read_text() == crc32_text(data)
    lock = json.loads((tmp_path / "models" / "models.lock.json").read_text())
    entry = lock["files"]["crossface_simswap.onnx"]
    assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert entry["source"].startswith("http://127.0.0.1:")
    assert store.state("crossface_simswap").state == "verified"
    # a second pull verifies the file on disk and does not download it again
    n = len(server.log)
    store.pull(["crossface_simswap"])
    assert len(server.log) == n


def test_download_cut_halfway_resumes_from_the_byte_reached(tmp_path, server, tiny_swapper_bytes):
    data = tiny_swapper_bytes
    path = server.publish("inswapper_128", data)
    server.faults[path] = "cut"
    store = _store(tmp_path, server)
    [out] = store.pull("inswapper_128")
    assert out.read_bytes() == data
    gets = [r for p, r in server.log if p == path]
    assert gets[0] is None
    half = server.cut_at[path]
    assert 0 < half < len(data)
    assert gets[1] == f"bytes={half}-", gets


def test_an_interrupted_part_file_resumes_in_a_later_run(tmp_path, server, tiny_swapper_bytes):
    data = tiny_swapper_bytes
    path = server.publish("inswapper_128", data)
    models = tmp_path / "models"
    models.mkdir()
    (models / "inswapper_128.onnx.part").write_bytes(data[:12345])
    store = _store(tmp_path, server)
    assert store.state("inswapper_128").state == "partial"
    [out] = store.pull("inswapper_128")
    assert out.read_bytes() == data
    assert [r for p, r in server.log if p == path] == ["bytes=12345-"]


def test_server_ignoring_range_restarts_cleanly(tmp_path, server, converter_bytes):
    data = converter_bytes[0]
    path = server.publish("crossface_simswap", data)
    server.faults[path] = "ignore-range"
    models = tmp_path / "models"
    models.mkdir()
    (models / "crossface_simswap.onnx.part").write_bytes(b"garbage that is not the file")
    [out] = _store(tmp_path, server).pull("crossface_simswap")
    assert out.read_bytes() == data


def test_corrupted_download_is_refused_and_removed(tmp_path, server, converter_bytes):
    data = bytearray(converter_bytes[0])
    good_crc = crc32_text(bytes(data))
    data[len(data) // 2] ^= 0xFF  # one flipped byte on the server
    server.publish("crossface_simswap", bytes(data), crc=good_crc)
    store = _store(tmp_path, server)
    with pytest.raises(ModelError, match=r"crossface_simswap\.onnx .* is corrupt: CRC-32 [0-9a-f]{8} does not match " + good_crc):
        store.pull("crossface_simswap")
    models = tmp_path / "models"
    assert not (models / "crossface_simswap.onnx").exists()
    assert not (models / "crossface_simswap.onnx.part").exists()
    assert "crossface_simswap.onnx" not in store.read_lock()["files"]


def test_http_404_is_a_clear_error(tmp_path, server):
    store = _store(tmp_path, server)
    with pytest.raises(ModelError, match=r"cannot download crossface_simswap\.onnx: .*HTTP 404"):
        store.pull("crossface_simswap")
    assert not (tmp_path / "models" / "crossface_simswap.onnx").exists()


def test_http_500_is_retried_then_a_clear_error(tmp_path, server, converter_bytes):
    path = server.publish("crossface_simswap", converter_bytes[0])
    server.faults[path] = "500"
    store = _store(tmp_path, server)
    with pytest.raises(ModelError, match=r"cannot download crossface_simswap\.onnx: .*HTTP 500"):
        store.pull("crossface_simswap")
    assert len([p for p, _ in server.log if p == path]) == store.retries + 1
    assert not (tmp_path / "models" / "crossface_simswap.onnx").exists()


def test_a_falling_back_mirror_is_used_after_a_404(tmp_path, server, converter_bytes):
    data = converter_bytes[0]
    server.publish("crossface_simswap", data)
    dead = f"http://127.0.0.1:{server.port}/nowhere/{{base}}/{{file}}"
    [out] = _store(tmp_path, server, mirrors=[dead, server.template]).pull("crossface_simswap")
    assert out.read_bytes() == data


def test_offline_names_missing_files_and_where_to_put_them(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = ModelStore(
        tmp_path / "models",
        mirrors=[f"http://127.0.0.1:{port}/{{base}}/{{file}}"],
        official=False,
        progress=False,
        retries=1,
        backoff=0.01,
    )
    with pytest.raises(ModelError) as info:
        store.pull(["crossface_simswap", "arcface_w600k_r50"])
    msg = str(info.value)
    assert "cannot download crossface_simswap.onnx, arcface_w600k_r50.onnx: the model hosts are unreachable" in msg
    assert f"put them in {tmp_path / 'models'}" in msg
    assert "https://github.com/facefusion/facefusion-assets/releases/download/models-3.0.0/arcface_w600k_r50.onnx" in msg


def test_missing_without_consent_says_how_to_get_it(tmp_path):
    store = ModelStore(tmp_path / "models", progress=False)
    with pytest.raises(
        ModelError,
        match=r"missing model files: inswapper_128\.onnx, arcface_w600k_r50\.onnx "
        r".*vcam models pull inswapper_128 arcface_w600k_r50",
    ):
        store.ensure(registry.requirements("inswapper_128"))


def test_lock_file_catches_a_file_swapped_after_download(tmp_path, server, converter_bytes):
    good, other = converter_bytes
    server.publish("crossface_simswap", good)
    store = _store(tmp_path, server)
    [path] = store.pull("crossface_simswap")
    assert store.verify("crossface_simswap") == hashlib.sha256(good).hexdigest()
    path.write_bytes(other)  # a valid model, but not the one verified
    (path.parent / "crossface_simswap.hash").write_text(crc32_text(other))  # even with a matching .hash
    with pytest.raises(ModelError, match=r"changed since it was verified .*moved to crossface_simswap\.onnx\.rejected"):
        store.ensure(["crossface_simswap"])
    assert not path.exists()
    assert (path.parent / "crossface_simswap.onnx.rejected").read_bytes() == other


def test_a_verified_file_is_trusted_until_it_changes(tmp_path, server, converter_bytes, monkeypatch):
    """SHA-256 once: a later start trusts the lock while size and mtime are unchanged; touching the
    file costs one re-hash (same bytes: trusted again), other bytes are refused; `full` always reads."""
    from vcam.models import download

    good, other = converter_bytes
    server.publish("crossface_simswap", good)
    store = _store(tmp_path, server)
    [path] = store.pull("crossface_simswap")
    reads = []
    real = download.file_digests
    monkeypatch.setattr(download, "file_digests", lambda p: reads.append(p) or real(p))
    want = hashlib.sha256(good).hexdigest()
    assert store.verify("crossface_simswap") == want and reads == []
    assert store.verify("crossface_simswap", full=True) == want and len(reads) == 1
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touched, same bytes
    assert store.verify("crossface_simswap") == want and len(reads) == 2
    assert store.verify("crossface_simswap") == want and len(reads) == 2  # trusted again
    pinned = _store(tmp_path, server, pins={"crossface_simswap.onnx": "cd" * 32})  # a new pin: read again
    with pytest.raises(ModelError, match="does not match the pinned SHA-256"):
        pinned.verify("crossface_simswap")
    assert len(reads) == 3
    path = store.pull("crossface_simswap")[0]
    path.write_bytes(other[: len(good)].ljust(len(good), b"\0"))  # other bytes, same size, new mtime
    with pytest.raises(ModelError, match="changed since it was verified"):
        store.verify("crossface_simswap")


def test_user_pin_wins_over_the_lock(tmp_path, server, converter_bytes):
    good = converter_bytes[0]
    server.publish("crossface_simswap", good)
    _store(tmp_path, server).pull("crossface_simswap")
    pinned = _store(tmp_path, server, pins={"crossface_simswap.onnx": "ab" * 32})
    with pytest.raises(ModelError, match=r"does not match the pinned SHA-256 \(expected abababababababab"):
        pinned.verify("crossface_simswap")
    right = _store(tmp_path, server, pins={"crossface_simswap": hashlib.sha256(good).hexdigest()})
    right.pull("crossface_simswap")  # downloaded again, matches the pin


def test_file_placed_by_hand_is_verified_then_locked(tmp_path, converter_bytes, tiny_swapper_bytes):
    models = tmp_path / "models"
    models.mkdir()
    (models / "crossface_simswap.onnx").write_bytes(converter_bytes[0])
    (models / "crossface_simswap.hash").write_text(crc32_text(converter_bytes[0]))
    store = ModelStore(models, progress=False)
    assert store.state("crossface_simswap").state == "present"
    assert store.ensure(["crossface_simswap"]) == {"crossface_simswap": models / "crossface_simswap.onnx"}
    assert store.read_lock()["files"]["crossface_simswap.onnx"]["source"] == "manual"
    # a wrong file under a swapper's name is refused by its tensors
    (models / "inswapper_128.onnx").write_bytes(converter_bytes[1])
    with pytest.raises(
        ModelError, match=r"inswapper_128\.onnx has inputs \{'input': 2\}.*should have inputs \{'target': 4, 'source': 2\}"
    ):
        store.verify("inswapper_128")
    # a hand-placed file whose .hash disagrees is moved aside
    (models / "inswapper_128.onnx").write_bytes(tiny_swapper_bytes)
    (models / "inswapper_128.hash").write_text("00000000")
    with pytest.raises(ModelError, match=r"fails its CRC-32 check"):
        store.verify("inswapper_128")
    assert not (models / "inswapper_128.onnx").exists()


def test_cli_pull_verify_path(tmp_path, server, converter_bytes, monkeypatch):
    from vcam.cli.models import app

    server.publish("crossface_simswap", converter_bytes[0])
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[models]\ndir = '{tmp_path / 'm'}'\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfg))
    runner = CliRunner()
    r = runner.invoke(app, ["path"])
    assert r.exit_code == 0 and r.output.strip() == str(tmp_path / "m")
    r = runner.invoke(app, ["verify"])
    assert r.exit_code == 0 and "no model files in" in r.output
    r = runner.invoke(app, ["pull", "crossface_simswap", "--mirror", server.template, "--no-progress"])
    assert r.exit_code == 0, r.output
    assert f"ok {tmp_path / 'm' / 'crossface_simswap.onnx'}" in r.output
    r = runner.invoke(app, ["verify"])
    assert r.exit_code == 0 and f"ok crossface_simswap sha256 {hashlib.sha256(converter_bytes[0]).hexdigest()}" in r.output
    r = runner.invoke(app, ["list", "--kind", "converter"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "verified" in r.output
    r = runner.invoke(app, ["pull", "no_such_model"])
    assert r.exit_code == 6 and "unknown model 'no_such_model'" in r.output


def test_a_download_with_more_outputs_than_declared_is_kept(tmp_path, server):
    """hyperswap's files carry `output` and `mask`: a download with at least the declared outputs is
    verified and kept (it was deleted when the registry listed one output); fewer outputs are refused."""
    data = standin.write("hyperswap_1a_256", tmp_path / "h.onnx", tiny=True).read_bytes()
    server.publish("hyperswap_1a_256", data)
    store = _store(tmp_path, server)
    [path] = store.pull(["hyperswap_1a_256"])
    assert path.read_bytes() == data
    assert store.verify("hyperswap_1a_256")
    bad = standin.write("simswap_256", tmp_path / "s.onnx", tiny=True)  # one output, other inputs
    with pytest.raises(ModelError, match=r"should have inputs .* and at least 2 outputs"):
        store.check_tensors("hyperswap_1a_256", bad)


def test_two_stores_of_one_folder_record_side_by_side_without_losing_an_entry(tmp_path):
    """An early swap verifies the models in two loads at once (two stores of one folder): every
    record goes through (no shared temporary file) and none is lost (one writer at a time)."""
    import threading

    stores = [ModelStore(tmp_path), ModelStore(tmp_path)]
    errors: list[BaseException] = []

    def record(store: ModelStore, k: int) -> None:
        try:
            for i in range(40):
                store._record(f"m{k}_{i}.onnx", "0" * 64, "00000000", i, "manual")
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(s, k)) for k, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    files = json.loads((tmp_path / "models.lock.json").read_text())["files"]
    assert len(files) == 80
    assert not list(tmp_path.glob("*.tmp"))
