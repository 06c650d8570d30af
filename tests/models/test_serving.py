"""`vcam serve export`: a Triton model repository whose config.pbtxt parses as Triton's ModelConfig
(the proto tritonclient ships), whose ONNX takes a dynamic batch, uint8 pixels (the cast in the
graph) or FP16 edges and gives the original model's answer; the KServe manifest and docker line;
the serving environment made once; `vcam serve` refusing to serve faces off the machine without TLS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import TRITON_SERVER, at_terminal, require, vcam_cli, windows_lacks

from vcam.errors import EngineUnavailable
from vcam.models import registry, serving, standin

pytest.importorskip("onnxruntime")


def _proto():
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc
    except ImportError as exc:
        require("triton", f"tritonclient not installed ({exc})")
    return text_format, mc


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return standin.write("inswapper_128", tmp_path_factory.mktemp("src"), tiny=True)


@pytest.mark.parametrize("fp16, u8, gpu", [(False, False, False), (True, True, True), (True, False, True)])
def test_config_pbtxt_is_a_valid_model_config(src, tmp_path, fp16, u8, gpu):
    text_format, mc = _proto()
    e = serving.export_repository(tmp_path, "inswapper_128", src, fp16=fp16, uint8_input=u8, max_batch=8, gpu=gpu)
    cfg = text_format.Parse(e.config.read_text(), mc.ModelConfig())  # raises on anything Triton would not read
    assert cfg.name == "inswapper_128" and cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 8
    types = {t.name: mc.DataType.Name(t.data_type) for t in [*cfg.input, *cfg.output]}
    assert types == {
        "target": "TYPE_UINT8" if u8 else ("TYPE_FP16" if fp16 else "TYPE_FP32"),
        "source": "TYPE_FP16" if fp16 else "TYPE_FP32",
        "output": "TYPE_FP16" if fp16 else "TYPE_FP32",
    }
    assert [list(t.dims) for t in cfg.input] == [[3, 128, 128], [512]]  # no batch dim: max_batch_size carries it
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100
    kind = cfg.instance_group[0].kind
    assert kind == (mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU)
    accel = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    assert [a.name for a in accel] == (["tensorrt"] if fp16 and gpu else [])
    if accel:
        assert accel[0].parameters["precision_mode"] == "FP16"
    assert "kind: InferenceService" in e.manifest.read_text() and "triton:" in e.manifest.read_text()


def test_exported_onnx_gives_the_models_answer_for_a_dynamic_batch(src, tmp_path):
    import onnxruntime as ort

    spec = registry.get("inswapper_128")
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (5, 3, 128, 128), dtype=np.uint8)
    x = (pixels / 255.0).astype(np.float32)  # the stages' float input for these pixels (mean 0, std 1)
    lat = rng.standard_normal((5, 512)).astype(np.float32)
    ref = ort.InferenceSession(str(src)).run(None, {"target": x, "source": lat})[0]
    plain = serving.export_repository(tmp_path / "a", spec.name, src, gpu=False)
    u8 = serving.export_repository(tmp_path / "b", spec.name, src, fp16=True, uint8_input=True, gpu=False)
    for n in (1, 5):  # any batch
        out = ort.InferenceSession(str(plain.model)).run(None, {"target": x[:n], "source": lat[:n]})[0]
        np.testing.assert_array_equal(out, ref[:n])
    got = ort.InferenceSession(str(u8.model)).run(None, {"target": pixels, "source": lat.astype(np.float16)})[0]
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float32) - ref).max() * 255 <= 1.0  # within one level of the FP32 model


def test_uint8_input_needs_an_image_input(tmp_path):
    p = standin.write("arcface_w600k_r50", tmp_path, tiny=True)
    e = serving.export_repository(tmp_path / "r", "arcface_w600k_r50", p, uint8_input=True, gpu=False)
    assert "TYPE_UINT8" in e.config.read_text()
    with pytest.raises(Exception, match="no image input"):
        serving.export_repository(tmp_path / "r", "crossface_simswap", p, uint8_input=True)


def test_vcam_serve_export_prints_the_docker_line(tmp_path):
    _proto()
    from triton_server import place_standins

    models = place_standins(tmp_path / "models", names=("inswapper_128",))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[models]\ndir = '{models}'\n")
    res = vcam_cli(
        "serve", "export", str(tmp_path / "repo"), "--model", "inswapper_128", "--fp16", "--uint8-input", "--config", str(cfg)
    )
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "repo" / "inswapper_128" / "1" / "model.onnx").is_file()
    assert "docker run --rm --gpus all" in res.stdout and "wrote" in res.stdout
    assert (
        f"-v {(tmp_path / 'repo').resolve()}:/models {serving.TRITON_IMAGE} tritonserver --model-repository=/models"
        in serving.docker_line(tmp_path / "repo")
    )


@windows_lacks(TRITON_SERVER)  # the model file is linked; the server it is for runs on Linux only
def test_a_python_backend_repository_keeps_the_tensors_and_the_batcher(src, tmp_path):
    """What `vcam serve --server python-backend` serves: each exported model with the same tensors,
    max batch and dynamic batcher, in Triton's own Python backend (model.py, the ONNX file linked);
    instances on the CPU kind; a runner only for the models it is given; made again each time."""
    text_format, mc = _proto()
    serving.export_repository(tmp_path / "exp", "inswapper_128", src, fp16=True, max_batch=8, gpu=True)
    serving.export_repository(tmp_path / "exp", "inswapper_128", src, served_as="other", max_batch=4, gpu=False)
    (tmp_path / "out" / "stale").mkdir(parents=True)
    out = serving.python_backend_repository(
        tmp_path / "exp",
        tmp_path / "out",
        threads=2,
        instances=3,
        runner="pkg.mod:make",
        sources={"other": "/x.onnx"},
        runner_path="/a:/b",
    )
    assert sorted(p.name for p in out.iterdir()) == ["inswapper_128", "other"]
    for name, batch in (("inswapper_128", 8), ("other", 4)):
        was = text_format.Parse((tmp_path / "exp" / name / "config.pbtxt").read_text(), mc.ModelConfig())
        cfg = text_format.Parse((out / name / "config.pbtxt").read_text(), mc.ModelConfig())
        assert cfg.backend == "python" and not cfg.platform and cfg.max_batch_size == batch
        assert list(cfg.input) == list(was.input) and list(cfg.output) == list(was.output)
        assert cfg.dynamic_batching == was.dynamic_batching
        assert [(g.kind, g.count) for g in cfg.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 3)]
        assert not cfg.optimization.execution_accelerators.gpu_execution_accelerator  # TensorRT is the ONNX backend's
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        runs = {"runner": "pkg.mod:make", "source": "/x.onnx", "runner_path": "/a:/b"} if name == "other" else {}
        assert params == {"threads": "2", **runs}
        assert (out / name / "1" / "model.py").read_bytes() == serving.PYTHON_MODEL.read_bytes()
        onnx_file = out / name / "1" / "model.onnx"
        assert onnx_file.resolve() == (tmp_path / "exp" / name / "1" / "model.onnx").resolve()


def test_a_folder_without_models_is_one_line_for_the_python_backend(tmp_path):
    _proto()
    from vcam.errors import ModelError

    with pytest.raises(ModelError, match="no model in .* \\(NAME/config.pbtxt\\)") as err:
        serving.python_backend_repository(tmp_path, tmp_path / "out")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--server", "tensorrt"), "--server 'tensorrt' is not a server kind"),
        (("--engine", "tf"), "--engine 'tf' is not an engine"),
    ],
)
def test_vcam_serve_refuses_an_unknown_server_kind_or_engine(args, needle):
    res = vcam_cli("serve", *args)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "choose one of" in lines[0], res.stderr


def test_vcam_serve_refuses_another_host_without_tls():
    res = vcam_cli("serve", "--host", "0.0.0.0")
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "needs --tls-cert and --tls-key" in lines[0], res.stderr


@windows_lacks(TRITON_SERVER)
def test_the_serving_environment_is_made_once(monkeypatch):
    from vcam.runtime import serve

    if not (serve.env_dir() / "vcam-serve.txt").is_file():
        require("triton", f"no serving environment at {serve.env_dir()} (run `vcam serve setup`)")
    first = serve.ensure_env()
    stamp = (serve.env_dir() / "vcam-serve.txt").stat().st_mtime_ns
    assert serve.ensure_env() == first and (serve.env_dir() / "vcam-serve.txt").stat().st_mtime_ns == stamp
    assert any(
        (first[1] and os.path.isfile(os.path.join(first[1], f)) for f in os.listdir(first[1]) if f.startswith("libpython"))
    )


@windows_lacks(TRITON_SERVER)
def test_the_serving_environment_sees_a_base_virtual_environments_packages(tmp_path):
    """VCAM_SERVE_SYSTEM_SITE=1 with an interpreter that is itself a virtual environment (torch
    installed in one): the serving environment sees that environment's packages, after its own."""
    from vcam.runtime import serve

    base, env = tmp_path / "base", tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    base_py = str(base / "bin" / "python")
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    base_site = subprocess.run([base_py, "-c", purelib], capture_output=True, text=True, check=True).stdout.strip()
    (Path(base_site) / "only_in_base.py").write_text("WHERE = 'base'\n")
    subprocess.run([base_py, "-m", "venv", "--without-pip", "--system-site-packages", str(env)], check=True)
    env_py = env / "bin" / "python"
    env_site = subprocess.run([str(env_py), "-c", purelib], capture_output=True, text=True, check=True).stdout.strip()
    probe = "import only_in_base; print(only_in_base.WHERE)"
    assert subprocess.run([str(env_py), "-c", probe], capture_output=True, text=True).returncode != 0  # before
    serve._see_base_venv(base_py, env_py)
    assert subprocess.run([str(env_py), "-c", probe], capture_output=True, text=True).stdout.strip() == "base"
    (Path(env_site) / "only_in_base.py").write_text("WHERE = 'own'\n")  # the environment's own comes first
    assert subprocess.run([str(env_py), "-c", probe], capture_output=True, text=True).stdout.strip() == "own"


def test_no_python_with_a_shared_libpython_is_one_line(monkeypatch, tmp_path):
    from vcam.runtime import serve

    monkeypatch.setenv("VCAM_SERVE_ENV", str(tmp_path / "env"))
    monkeypatch.setattr(serve, "_shared_lib", lambda py: None)
    with pytest.raises(EngineUnavailable) as err:
        serve.ensure_env()
    assert "no Python with a shared libpython" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "env").exists()


@pytest.mark.slow
@windows_lacks(TRITON_SERVER)
def test_vcam_serve_runs_triton_with_health_and_metrics(tmp_path):
    """The real `vcam serve` command: the model's ready endpoint, Prometheus metrics, stopped by Ctrl-C."""
    _proto()
    from triton_server import export, free_ports, place_standins

    from vcam.runtime import serve

    if not (serve.env_dir() / "vcam-serve.txt").is_file():
        require("triton", f"no serving environment at {serve.env_dir()} (run `vcam serve setup`)")
    models = place_standins(tmp_path / "models", names=("inswapper_128",))
    repo = export(models, tmp_path / "repo", served=(("inswapper_128", "inswapper_128", False, False),))
    grpc, http, metrics = free_ports(3)
    args = ["serve", "--repo", str(repo), "--port", str(grpc), "--http-port", str(http), "--metrics-port", str(metrics)]
    proc = subprocess.Popen(
        at_terminal([sys.executable, "-m", "vcam", *args]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        # `vcam serve` says "serving" once every endpoint answers: the user's cue, so the test's.
        said = f"serving {repo} on"
        end = time.monotonic() + 180
        while time.monotonic() < end and proc.poll() is None and not any(said in ln for ln in lines):
            time.sleep(0.1)
        assert any(said in ln for ln in lines), proc.stderr.read() if proc.poll() is not None else "not serving"
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/inswapper_128/ready", timeout=5) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
            assert 'nv_inference_count{model="inswapper_128"' in r.read().decode()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        reader.join(10)
        err = proc.stderr.read()
    out = "".join(lines)
    assert f"serving {repo} on grpc://127.0.0.1:{grpc}" in out, out + err
