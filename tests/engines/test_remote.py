"""The remote engine against a real server: the Triton that nvidia-pytriton bundles, on 127.0.0.1,
serving tiny stand-ins exported by `vcam serve export`'s code (tests/triton_server.py). The same
swapper through the server and through local onnxruntime; chunks above the server's max batch;
four client processes batched by the server's dynamic batcher; a mismatched model and plain gRPC
to another host refused with one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from vcam import config_file
from vcam.errors import ConfigError, ModelError
from vcam.runtime.roles import build as build_role
from vcam.runtime.roles import model_store
from vcam.stages import demo
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import FaceBank

ASSETS = Path(demo.__file__).parents[1] / "assets"


def _cfg(models: Path, faces: Path, remote: str | None = None, model: str = "", max_faces: int = 4, **engine):
    data = {
        "models": {"dir": str(models)},
        "faces": {"dir": str(faces)},
        "pipeline": {"backend": "onnxruntime", "device": "cpu", "max_faces": max_faces},
        "swap": {"swapper": "inswapper_128"},
    }
    if remote:
        data["engines"] = {"swapper": {"backend": "remote", "url": remote, "model": model, "timeout": "20s", **engine}}
    return config_file.build(data)


def _faces(cfg, swapper):
    det = RetinaFaceDetector()
    rec = build_role("recogniser", cfg, store=model_store(cfg, progress=False))
    bank = FaceBank(cfg.faces_dir)
    bank.add(ASSETS / "astronaut.jpg", "astronaut", detector=det, recogniser=rec)
    return bank.load("astronaut", recogniser=rec, swappers=[swapper])


def _rows(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` crops of the demo portrait, each a little shifted: (frame, (1, 2, 3) crop-from-frame)."""
    img = demo.portrait("grace_hopper")
    out = []
    for k in range(n):
        m = np.array([[0.5, 0.0, -40.0 - 3 * k], [0.0, 0.5, -30.0 - 2 * k]])
        out.append((img, m[None]))
    return out


def _swap(cfg, n: int):
    swapper = build_role("swapper", cfg, store=model_store(cfg, progress=False))
    face = _faces(cfg, swapper)
    crops, _ = swapper.swap_batch(_rows(n), face)
    return swapper, np.array(crops[:n])


@pytest.mark.slow
@pytest.mark.parametrize("served", ["inswapper_128", "inswapper_128_u8"])
def test_remote_swap_equals_local_onnxruntime_within_one_level(triton, tmp_path, served):
    server, models = triton
    assert server.kind == "python-backend"  # the default: tritonserver itself, Triton's own Python backend
    local_sw, local = _swap(_cfg(models, tmp_path / "f1"), 3)
    remote_sw, remote = _swap(_cfg(models, tmp_path / "f2", server.url, served), 3)
    assert remote_sw.engine.backend == "remote" and remote_sw.engine.failed == 0
    diff = np.abs(local.astype(int) - remote.astype(int))
    assert diff.max() <= 1, f"{served}: max difference {diff.max()} levels"
    assert remote_sw.guarded() == 0
    wire = "uint8" if served.endswith("_u8") else "float32"
    assert f"({wire} on the wire)" in remote_sw.engine.describe()


@pytest.mark.slow
def test_the_pytriton_server_kind_answers_the_same_swap(triton, tmp_path):
    """`vcam serve --server pytriton` (PyTriton's Triton, kept as an option) on the same exported
    repository: the same crops as the local onnxruntime swap."""
    from triton_server import start

    _, models = triton
    repo = _export_one(models, tmp_path / "repo")
    server = start(repo, log=tmp_path / "server.log", kind="pytriton")
    try:
        local_sw, local = _swap(_cfg(models, tmp_path / "f1"), 3)
        remote_sw, remote = _swap(_cfg(models, tmp_path / "f2", server.url), 3)
        assert remote_sw.engine.failed == 0 and remote_sw.guarded() == 0
        assert np.abs(local.astype(int) - remote.astype(int)).max() <= 1
        assert any(ln.startswith("READY") for ln in server.lines)  # PyTriton's worker said so
    finally:
        server.stop()


@pytest.mark.slow
def test_engine_vcam_swaps_in_vcams_own_engine_inside_the_server(triton, tmp_path):
    """`vcam serve --engine vcam`: each batch in vcam's PyTorch engine inside Triton's Python backend
    (FP32 on the CPU here), imported after the serving environment's numpy < 2: the same crops as the
    local onnxruntime swap."""
    pytest.importorskip("torch")
    from triton_server import free_ports

    from vcam.runtime.serve import TritonServer, runner_for

    _, models = triton
    repo = _export_one(models, tmp_path / "repo")
    runner = runner_for("vcam", repo, {"inswapper_128": str(models / "inswapper_128.onnx")})
    assert runner is not None and runner[1] == {"inswapper_128": str(models / "inswapper_128.onnx")}
    grpc, http, metrics = free_ports(3)
    server = TritonServer(repo, grpc_port=grpc, http_port=http, metrics_port=metrics, runner=runner, log=tmp_path / "log")
    try:
        server.wait_ready(300)
        assert any("model inswapper_128" in ln and "vcam torch" in ln for ln in server.lines), list(server.lines)[-5:]
        local_sw, local = _swap(_cfg(models, tmp_path / "f1"), 3)
        remote_sw, remote = _swap(_cfg(models, tmp_path / "f2", server.url), 3)
        assert remote_sw.engine.failed == 0 and remote_sw.guarded() == 0
        assert np.abs(local.astype(int) - remote.astype(int)).max() <= 1
    finally:
        server.stop()


def test_engine_choice_for_vcam_serve(tmp_path, monkeypatch):
    """onnxruntime: no runner; vcam: the originals, else the repository's own files; auto: vcam's
    engine only where torch sees a GPU and the originals are known."""
    from vcam.runtime import serve

    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"")
    assert serve.runner_for("onnxruntime", tmp_path, {"m": "/o.onnx"}) is None
    assert serve.runner_for("vcam", tmp_path, {}) == (serve.VCAM_RUNNER, {"m": str(tmp_path / "m" / "1" / "model.onnx")})
    assert serve.runner_for("vcam", tmp_path, {"m": "/o.onnx"}) == (serve.VCAM_RUNNER, {"m": "/o.onnx"})
    for gpu in (False, True):
        monkeypatch.setattr(serve, "torch_sees_a_gpu", lambda gpu=gpu: gpu)
        assert serve.runner_for("auto", tmp_path, {}) is None
        want = (serve.VCAM_RUNNER, {"m": "/o.onnx"}) if gpu else None
        assert serve.runner_for("auto", tmp_path, {"m": "/o.onnx"}) == want


RUNNER = textwrap.dedent(
    """
    import numpy as np
    def make(source, max_batch):
        def run(names, inputs):
            return [np.full_like(inputs["target"], float(len(source)))]
        return run, "a test runner"
    """
)


@pytest.mark.slow
def test_the_python_backend_runs_a_runner_from_pythonpath(triton, tmp_path, monkeypatch):
    """A model run in a callable (how the benchmark runs vcam's engine on the server): imported in
    the backend's stub from the folders on the caller's PYTHONPATH (the stub reads no PYTHONPATH)."""
    from triton_server import free_ports

    from vcam.engines.remote import RemoteEngine
    from vcam.runtime.serve import TritonServer

    _, models = triton
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "vcam_test_runner.py").write_text(RUNNER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")]))
    repo = _export_one(models, tmp_path / "repo")
    grpc, http, metrics = free_ports(3)
    runner = ("vcam_test_runner:make", {"inswapper_128": "12345"})
    server = TritonServer(repo, grpc_port=grpc, http_port=http, metrics_port=metrics, runner=runner, log=tmp_path / "log")
    try:
        server.wait_ready(180)
        eng = RemoteEngine(server.url, "inswapper_128", timeout=20)
        out = eng.run(eng.input_buffers(2))[0]
        eng.close()
        assert eng.last_failed == 0 and out.shape[0] == 2 and np.all(out == 5.0)  # len("12345")
        assert any("a test runner" in ln for ln in server.lines)
    finally:
        server.stop()


SERVE_AND_HANG = textwrap.dedent(
    """
    import sys, time
    from vcam.runtime.serve import TritonServer
    grpc, http, metrics = map(int, sys.argv[2:5])
    server = TritonServer(sys.argv[1], grpc_port=grpc, http_port=http, metrics_port=metrics, threads=1)
    server.wait_ready(180)
    print("ready", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.slow
def test_a_killed_owner_takes_its_tritonserver_with_it(triton, tmp_path):
    """The process that started the direct server SIGKILLed (no clean-up of its own): the launcher
    sees its parent gone and stops tritonserver; the next server's start removes its leftovers."""
    import time
    import urllib.request

    from triton_server import free_ports

    _, models = triton
    repo = _export_one(models, tmp_path / "repo")
    ports = free_ports(3)
    owner = subprocess.Popen(
        [sys.executable, "-c", SERVE_AND_HANG, str(repo), *map(str, ports)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout.readline().strip() == "ready"
        owner.kill()
        owner.wait(10)
        end, up = time.monotonic() + 60, True
        while up and time.monotonic() < end:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/v2/health/live", timeout=2).close()
                time.sleep(0.5)
            except OSError:
                up = False
        assert not up, "tritonserver outlived the process that started it by 60 s"
        from vcam.platform import folders
        from vcam.runtime import serve

        left = list((folders.cache_dir() / "served").glob(f"vcam-served-{owner.pid}-*"))
        assert len(left) == 1  # its served repository, which its stop would have removed
        serve._scratch()  # the next server's start removes what a killed one left
        assert not left[0].exists()
    finally:
        if owner.poll() is None:
            owner.kill()


def _export_one(models: Path, repo: Path) -> Path:
    from triton_server import export

    return export(models, repo, served=(("inswapper_128", "inswapper_128", False, False),))


@pytest.mark.slow
def test_a_batch_above_the_servers_max_batch_goes_in_chunks(triton, tmp_path):
    server, models = triton
    _, local = _swap(_cfg(models, tmp_path / "f1", max_faces=12), 11)
    sw, remote = _swap(_cfg(models, tmp_path / "f2", server.url, "inswapper_128", max_faces=12), 11)
    assert sw.engine.server_max_batch == 8 and sw.engine.max_batch == 12
    assert np.abs(local.astype(int) - remote.astype(int)).max() <= 1
    assert sw.engine.failed == 0


def test_latent_rows_already_sent_are_not_encoded_again(triton, tmp_path):
    server, models = triton
    sw = build_role("swapper", _cfg(models, tmp_path / "f", server.url, "inswapper_128_u8"), store=None)
    eng = sw.engine
    feeds = eng.input_buffers(2)
    feeds["source"][:] = np.random.default_rng(0).standard_normal((2, 512))
    eng.run(feeds)
    first = eng._cache["source"][1]
    eng.run(feeds)
    assert eng._cache["source"][1] is first  # same rows: the FP16 encoding was reused
    feeds["source"][1] += 1.0
    eng.run(feeds)
    assert eng._cache["source"][1] is not first and eng.failed == 0


CLIENT = textwrap.dedent(
    """
    import sys, threading, numpy as np
    from vcam.engines.remote import RemoteEngine
    import onnxruntime as ort
    url, go = sys.argv[1], sys.argv[2]
    eng = RemoteEngine(url, "inswapper_128", max_batch=1, timeout=30, label="client")
    feeds = eng.input_buffers(1)
    feeds["target"][:] = np.random.default_rng(int(sys.argv[3])).random(feeds["target"].shape)
    want = ort.InferenceSession(sys.argv[4]).run(None, {k: np.asarray(v) for k, v in feeds.items()})[0]
    import os, time
    while not os.path.exists(go):
        time.sleep(0.01)
    wrong = 0  # answers that are not this client's own (rows mixed up in a batch of several clients)
    for _ in range(25):
        wrong += int(np.abs(eng.run(feeds)[0] - want).max() > 1e-4)
    print(eng.failed, wrong)
    """
)


@pytest.mark.slow
def test_four_client_processes_are_batched_by_the_server(triton, tmp_path):
    server, models = triton
    from vcam.engines.remote import RemoteEngine

    probe = RemoteEngine(server.url, "inswapper_128", label="probe")
    before = probe.statistics()
    go = tmp_path / "go"
    model = str(models / "inswapper_128.onnx")
    procs = [
        subprocess.Popen([sys.executable, "-c", CLIENT, server.url, str(go), str(i), model], stdout=subprocess.PIPE, text=True)
        for i in range(4)
    ]
    import time

    time.sleep(3)  # all four connected and waiting
    go.touch()
    outs = [p.communicate(timeout=240)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and outs == ["0 0"] * 4, outs  # no failure, each its own answers
    after = probe.statistics()
    requests = after["requests"] - before["requests"]
    executions = after["executions"] - before["executions"]
    print(f"4 clients: {requests} requests in {executions} executions")
    assert requests == 100
    assert executions < requests, f"{executions} executions for {requests} requests: nothing was batched"
    probe.close()


def test_a_model_that_does_not_match_is_one_line_naming_both(triton):
    server, _ = triton
    from vcam.engines import TensorInfo
    from vcam.engines.remote import RemoteEngine
    from vcam.models import registry

    spec = registry.get("inswapper_128")
    with pytest.raises(ModelError) as err:
        RemoteEngine(server.url, "arcface_w600k_r50", expect=[TensorInfo(t.name, t.shape, "float32") for t in spec.inputs])
    msg = str(err.value)
    assert "\n" not in msg
    assert "arcface_w600k_r50" in msg and "input [3, 112, 112]" in msg and "target [3, 128, 128]" in msg, msg


def test_a_model_the_server_does_not_have_is_one_line(triton):
    server, _ = triton
    from vcam.engines.remote import RemoteEngine
    from vcam.errors import EngineUnavailable

    with pytest.raises(EngineUnavailable) as err:
        RemoteEngine(server.url, "no_such_model")
    assert "\n" not in str(err.value) and "no_such_model" in str(err.value)


@pytest.mark.parametrize(
    "url, token, needle",
    [
        ("grpc://10.1.2.3:8001", "", "plain gRPC to 10.1.2.3:8001 refused"),
        ("gpu-box:8001", "t", "plain gRPC to gpu-box:8001 refused"),
        ("grpcs://gpu-box:8001", "", "needs a token or a client certificate"),
        ("http://127.0.0.1:8001", "", "expected grpc://HOST:PORT"),
    ],
)
def test_plain_grpc_to_another_host_is_refused_with_one_line(url, token, needle, tmp_path):
    from vcam.engines.remote import parse_url

    with pytest.raises(ConfigError) as err:
        parse_url(url, token=token)
    assert needle in str(err.value) and "\n" not in str(err.value)
    # the same through the config, before any connection is tried
    cfg = _cfg(tmp_path, tmp_path, url, token=token)
    with pytest.raises(ConfigError) as err:
        build_role("swapper", cfg, store=None)
    assert needle in str(err.value)


def test_loopback_and_tls_with_a_token_are_accepted():
    from vcam.engines.remote import parse_url

    assert parse_url("grpc://127.0.0.1:8001").loopback
    assert parse_url("grpc://localhost").port == 8001
    assert parse_url("grpc://[::1]:9").address == "[::1]:9"
    ep = parse_url("grpcs://gpu-box:8443", token="secret")
    assert ep.tls and ep.address == "gpu-box:8443"


@pytest.mark.parametrize("on_fault", ["pass", "pixelate"])
def test_faces_without_an_answer_pass_through_or_pixelated_and_are_counted(triton, tmp_path, on_fault):
    """While the server is down no call is sent: the faces come back unswapped (the NaN guard's
    input) or in coarse blocks, and the guard counts them."""
    server, models = triton
    sw = build_role("swapper", _cfg(models, tmp_path / "f", server.url, "inswapper_128", on_fault=on_fault), store=None)
    face = _faces(_cfg(models, tmp_path / "f", server.url, "inswapper_128"), sw)
    sw.engine._mark_down("test")  # as after a failed call; the prober brings it back within a second
    crops, _ = sw.swap_batch(_rows(2), face)
    crops = np.array(crops[:2])
    assert sw.guarded() == 2 and sw.engine.last_failed == 2 and sw.engine.calls >= 1
    img, m = _rows(1)[0]
    import cv2

    plain = cv2.warpAffine(img, m[0], (128, 128), flags=cv2.INTER_LINEAR)
    if on_fault == "pass":
        assert np.abs(crops[0].astype(int) - plain.astype(int)).max() <= 2  # the target itself
    else:
        blocks = crops[0].reshape(8, 16, 8, 16, 3)
        assert (blocks == blocks[:, :1, :, :1]).all()  # 16 x 16 blocks of one colour
        assert np.abs(crops[0].astype(int) - plain.astype(int)).max() > 10
    import time

    end = time.monotonic() + 5
    while sw.engine.down and time.monotonic() < end:
        time.sleep(0.05)
    assert not sw.engine.down, "the prober did not find the server again"
    # On trial (calls out again, no frame waiting on them) until UP_AFTER good answers in a row.
    while sw.engine.in_episode and time.monotonic() < end + 2:
        sw.swap_batch(_rows(2), face)
        time.sleep(0.05)
    assert not sw.engine.in_episode, "the good answers did not bring the server back"
    guarded = sw.guarded()  # the faces of the calls on trial that got no answer in time counted too
    sw.swap_batch(_rows(2), face)
    assert sw.engine.last_failed == 0 and sw.guarded() == guarded >= 2


@pytest.mark.slow
def test_grpcs_to_a_tls_server_with_its_ca(triton, tmp_path):
    """TLS end to end: the bundled Triton with a certificate, the engine checking it against ``ca``;
    plain gRPC to the same server gets no answer (one line)."""
    import shutil

    from conftest import require
    from triton_server import free_ports

    from vcam.engines.remote import RemoteEngine
    from vcam.errors import EngineUnavailable
    from vcam.runtime.serve import TritonServer

    _, models = triton
    if not shutil.which("openssl"):
        require("openssl", "no openssl command to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    from triton_server import export

    repo = export(models, tmp_path / "repo", served=(("inswapper_128", "inswapper_128", False, False),))
    grpc, http, metrics = free_ports(3)
    server = TritonServer(repo, grpc_port=grpc, http_port=http, metrics_port=metrics, threads=1, tls=(str(cert), str(key), ""))
    try:
        server.wait_ready(180)
        eng = RemoteEngine(f"grpcs://localhost:{grpc}", "inswapper_128", ca=str(cert), timeout=20)
        feeds = eng.input_buffers(1)
        out = eng.run(feeds)[0]
        assert eng.last_failed == 0 and np.isfinite(out).all()
        assert eng.endpoint.tls and "remote inswapper_128 at localhost:" in eng.describe()
        eng.close()
        with pytest.raises(EngineUnavailable) as err:
            RemoteEngine(f"grpc://127.0.0.1:{grpc}", "inswapper_128", connect_timeout=3)
        assert "\n" not in str(err.value)
    finally:
        server.stop()


def test_vcam_check_says_whether_the_remote_swapper_is_up(triton, tmp_path):
    from triton_server import free_ports

    from vcam.runtime.check import check_remote

    server, models = triton
    up = check_remote(_cfg(models, tmp_path / "f", server.url))
    assert [i.level for i in up] == ["ok"] and "remote inswapper_128 at 127.0.0.1:" in up[0].detail
    dead = f"grpc://127.0.0.1:{free_ports(1)[0]}"
    down = check_remote(_cfg(models, tmp_path / "f", dead))
    assert down[0].level == "fail"
    assert down[0].detail.startswith(f"swapper: remote {dead[7:]} down since "), down[0].detail
    assert "unreachable at start: " in down[0].detail and "until then `vcam run` swaps locally" in down[0].fix
    wrong = check_remote(_cfg(models, tmp_path / "f", server.url, "arcface_w600k_r50"))
    assert wrong[0].level == "fail" and "takes inputs input [3, 112, 112]" in wrong[0].detail
    assert check_remote(_cfg(models, tmp_path / "f")) == []  # a local swapper: nothing to say


@pytest.fixture(scope="module")
def proxied(triton):
    """A fault-injecting gRPC proxy in front of the shared server (tests/triton_server.py)."""
    from triton_server import FaultProxy

    server, models = triton
    proxy = FaultProxy(f"127.0.0.1:{server.grpc_port}", delay=1.0)
    yield proxy, models
    proxy.close()


def _engine(url: str, timeout: float = 5.0):
    from vcam.engines import TensorInfo
    from vcam.engines.remote import RemoteEngine
    from vcam.models import registry

    spec = registry.get("inswapper_128")
    return RemoteEngine(
        url,
        "inswapper_128",
        expect=[TensorInfo(t.name, t.shape, np.float32) for t in spec.inputs],
        expect_outputs=[TensorInfo(t.name, t.shape, np.float32) for t in spec.outputs],
        timeout=timeout,
        max_batch=4,
    )


@pytest.mark.parametrize("fault", ["shape", "short", "dtype", "bytes", "extra", "missing", "nan", "no-output", "error", "slow"])
def test_each_malformed_answer_is_a_fault_of_its_faces_and_the_next_good_one_is_used(proxied, fault):
    proxy, _ = proxied
    eng = _engine(proxy.url, timeout=0.5 if fault == "slow" else 5.0)
    try:
        feeds = eng.input_buffers(3)
        feeds["target"][:] = np.linspace(-1, 1, feeds["target"][0].size, dtype=np.float32).reshape(feeds["target"].shape[1:])
        feeds["source"][:] = 0.04
        good = eng.run(feeds)[0].copy()
        assert not eng.last_bad.any() and np.isfinite(good).all()
        proxy.fault = fault
        try:
            out = eng.run(feeds)[0]
        finally:
            proxy.fault = ""
        want = [True, False, False] if fault == "nan" else [True, True, True]  # NaN in the first row only
        assert eng.last_bad.tolist() == want and eng.last_failed == sum(want), eng.last_fault
        assert np.isnan(out[eng.last_bad]).all() and np.array_equal(out[~eng.last_bad], good[~eng.last_bad])
        assert not eng.down  # one fault is no episode
        out = eng.run(feeds)[0]
        assert not eng.last_bad.any() and np.array_equal(out, good)
    finally:
        eng.close()


def test_a_run_of_faults_is_one_line_down_and_a_run_of_good_answers_one_line_back(proxied, caplog):
    import time

    from vcam.engines.remote import DOWN_AFTER, UP_AFTER

    proxy, _ = proxied
    eng = _engine(proxy.url)
    try:
        feeds = eng.input_buffers(1)
        feeds["target"][:] = 0.1
        feeds["source"][:] = 0.04
        caplog.set_level(logging.WARNING, logger="vcam.engines.remote")
        proxy.fault = "error"
        end = time.monotonic() + 3.0  # faults while the prober finds it ready again and again
        while time.monotonic() < end:
            eng.run(feeds)
            time.sleep(0.02)
        assert eng.failed >= DOWN_AFTER and eng.in_episode
        down = [r.getMessage() for r in caplog.records]
        assert len(down) == 1 and "down since" in down[0] and "injected fault" in down[0], down
        proxy.fault = ""
        end = time.monotonic() + 5.0
        while eng.in_episode and time.monotonic() < end:
            eng.run(feeds)
            time.sleep(0.02)
        lines = [r.getMessage() for r in caplog.records]
        assert not eng.in_episode and len(lines) == 2 and " back after " in lines[1], lines
        assert UP_AFTER >= 2
    finally:
        eng.close()


def test_on_fault_pass_warns_at_start_and_local_is_the_default(triton, tmp_path, caplog):
    from vcam.config import Config
    from vcam.stages.swap import ClassicSwapper

    assert Config().engines.swapper.on_fault == "local"
    server, models = triton
    sw = build_role("swapper", _cfg(models, tmp_path / "f", server.url, "inswapper_128"), store=None)
    assert sw.on_fault == "local" and isinstance(sw.fallback, ClassicSwapper) and sw.fallback.crop_size == sw.crop_size
    assert not any("on_fault = 'pass'" in r.getMessage() for r in caplog.records)
    sw = build_role("swapper", _cfg(models, tmp_path / "f", server.url, "inswapper_128", on_fault="pass"), store=None)
    assert sw.fallback is None
    assert any("on_fault = 'pass'" in r.getMessage() and "real face" in r.getMessage() for r in caplog.records)


def test_faces_without_an_answer_are_swapped_locally_by_the_classic_swap(triton, tmp_path):
    """The default: while the server is down its faces get the classic swap of the same crops (not
    the input, not counted by the NaN guard, counted as swapped locally)."""
    import cv2

    from vcam.stages.swap import ClassicSwapper

    server, models = triton
    sw = build_role("swapper", _cfg(models, tmp_path / "f", server.url, "inswapper_128"), store=None)
    face = _faces(_cfg(models, tmp_path / "f", server.url, "inswapper_128"), sw)
    assert "classic" in face.latents  # prepared for the fallback with the face, off the frame loop
    sw.engine._mark_down("test")
    crops, masks = sw.swap_batch(_rows(2), face)
    crops, masks = np.array(crops[:2]), np.array(masks)
    assert sw.guarded() == 0 and sw.swapped_locally == 2 and sw.engine.last_failed == 2
    classic = ClassicSwapper(128, dense=False)
    want, want_masks = classic.swap_batch(_rows(2), classic.prepare(face))
    assert np.array_equal(crops, np.asarray(want[:2])) and np.allclose(masks, np.asarray(want_masks[:2]))
    img, m = _rows(1)[0]
    plain = cv2.warpAffine(img, m[0], (128, 128), flags=cv2.INTER_LINEAR)
    assert np.abs(crops[0].astype(int) - plain.astype(int)).mean() > 10  # not the camera's face


def test_a_failing_local_swap_leaves_the_faces_blank_never_the_input(triton, tmp_path, caplog):
    import cv2

    server, models = triton
    sw = build_role("swapper", _cfg(models, tmp_path / "f", server.url, "inswapper_128"), store=None)
    face = _faces(_cfg(models, tmp_path / "f", server.url, "inswapper_128"), sw)

    def broken(parts, faces):
        raise RuntimeError("out of memory")

    sw.fallback.swap_batch = broken
    sw.engine._mark_down("test")
    for _ in range(3):
        crops, masks = sw.swap_batch(_rows(1), face)
    img, m = _rows(1)[0]
    plain = cv2.warpAffine(img, m[0], (128, 128), flags=cv2.INTER_LINEAR)
    assert np.abs(np.array(crops[0]).astype(int) - plain.astype(int)).mean() > 10 and np.array(masks).max() > 0.9
    assert sw.fallback_failed == 3 and sw.swapped_locally == 0
    assert sum("the local swap failed" in r.getMessage() for r in caplog.records) == 1
