"""The commands issue 38 found dying with ``ModuleNotFoundError: No module named 'filelock'`` in a
fresh venv without torch, run as ``python -m vcam`` with only fastswap-cam's declared requirements
importable (tests/fresh_env.py: torch, and everything else this machine has besides, hidden).
``tools/fresh-venv`` runs the same commands in a real new venv."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fresh_env import ROOT, sitecustomize_dir, vcam
from model_server import ModelServer

from vcam.models import registry, standin
from vcam.models.download import crc32_text

ASSETS = ROOT / "vcam" / "assets"
RECOGNISER = "arcface_w600k_r50"


@pytest.fixture(scope="module")
def declared_only(tmp_path_factory) -> Path:
    """The sitecustomize folder for commands that need no extra."""
    return sitecustomize_dir(tmp_path_factory.mktemp("declared"))


@pytest.fixture(scope="module")
def recogniser_bytes(tmp_path_factory) -> bytes:
    return standin.write(RECOGNISER, tmp_path_factory.mktemp("si"), tiny=True).read_bytes()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, recogniser_bytes):
    """A model mirror on 127.0.0.1 (tests/model_server.py) serving the stand-in recogniser."""
    server = ModelServer(tmp_path_factory.mktemp("www"))
    server.publish(RECOGNISER, recogniser_bytes)
    yield server
    server.close()


@pytest.fixture
def user(tmp_path, monkeypatch, recogniser_bytes):
    """A config naming a models folder holding the (stand-in) recogniser and an empty face bank."""
    models = tmp_path / "models"
    models.mkdir()
    (models / registry.get(RECOGNISER).file).write_bytes(recogniser_bytes)
    (models / registry.get(RECOGNISER).hash_file).write_text(crc32_text(recogniser_bytes))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[models]\ndir = {str(models)!r}\n[faces]\ndir = {str(tmp_path / 'faces')!r}\n[panel]\nport = 0\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfg))
    return tmp_path


def ok(r) -> str:
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ModuleNotFoundError" not in r.stdout + r.stderr
    return r.stdout + r.stderr


def test_the_check_hides_what_is_not_declared(declared_only):
    """The harness itself: torch (installed here) is missing as in a fresh venv, filelock is there
    because pyproject.toml declares it."""
    import subprocess

    from fresh_env import env_with, python_argv

    code = "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('filelock') is not None)"
    argv = python_argv(declared_only, "-c", code)
    r = subprocess.run(argv, capture_output=True, text=True, env=env_with(declared_only), timeout=60)
    assert r.stdout.split() == ["None", "True"], r.stderr


def test_an_undeclared_filelock_fails_as_issue_38_found(tmp_path, mirror):
    """With filelock left out of the declared requirements (as before), `vcam models pull` dies as
    it did in a fresh venv: the check sees what a fresh venv sees."""
    pyproject = tmp_path / "pyproject.toml"
    text = (ROOT / "pyproject.toml").read_text()
    pyproject.write_text(re.sub(r'^\s*"filelock[^"]*",.*\n', "", text, flags=re.M))
    folder = sitecustomize_dir(tmp_path / "site", pyproject=pyproject)
    r = vcam(folder, "models", "pull", RECOGNISER, "--mirror", mirror.template, "--no-progress")
    assert r.returncode != 0
    assert "No module named 'filelock'" in r.stdout + r.stderr


def test_models_pull_from_a_local_mirror(declared_only, tmp_path, monkeypatch, mirror, recogniser_bytes):
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[models]\ndir = {str(tmp_path / 'm')!r}\n")
    monkeypatch.setenv("VCAM_CONFIG", str(cfg))
    out = ok(vcam(declared_only, "models", "pull", RECOGNISER, "--mirror", mirror.template, "--no-progress"))
    assert f"ok {tmp_path / 'm' / registry.get(RECOGNISER).file}" in out
    assert (tmp_path / "m" / registry.get(RECOGNISER).file).read_bytes() == recogniser_bytes


def test_faces_add_with_a_recogniser(declared_only, user):
    out = ok(vcam(declared_only, "faces", "add", str(ASSETS / "astronaut.jpg"), "--name", "astronaut"))
    assert "added face 'astronaut'" in out
    # the recogniser ran: the embedding is cached with the face
    assert list((user / "faces" / "astronaut" / "embeddings").glob(f"{RECOGNISER}-*.npy"))


def test_run_with_a_map(declared_only, user):
    for photo, name in (("astronaut.jpg", "astronaut"), ("grace_hopper.jpg", "hopper")):
        ok(vcam(declared_only, "faces", "add", str(ASSETS / photo), "--name", name))
    out = ok(vcam(declared_only, "run", "--input", "demo", "--output", "null", "--frames", "3", "--device", "cpu",
                  "--map", "hopper=astronaut"))  # fmt: skip
    assert re.search(r"stopped: [1-3] frames published of 3 .* face astronaut", out)
    assert f"recogniser {RECOGNISER}: onnxruntime" in out


def test_serve_export_names_its_extra_and_works_with_it(declared_only, user, tmp_path_factory):
    """`vcam serve export` writes Triton's config through tritonclient: the `remote` extra. Without
    it, one line naming the install; with it (and nothing else), a repository."""
    repo = user / "repo"
    r = vcam(declared_only, "serve", "export", str(repo), "--model", RECOGNISER, "--cpu")
    assert r.returncode == 6, r.stdout + r.stderr
    assert "writing a Triton model repository needs tritonclient" in r.stderr and "fastswap-cam[remote]" in r.stderr
    assert "Traceback" not in r.stderr and not repo.exists()
    try:
        import tritonclient.grpc  # noqa: F401
    except ImportError as exc:
        from conftest import require

        require("triton", f"tritonclient is not installed ({exc})")
    with_remote = sitecustomize_dir(tmp_path_factory.mktemp("remote"), extras=["remote"])
    out = ok(vcam(with_remote, "serve", "export", str(repo), "--model", RECOGNISER, "--cpu"))
    assert (repo / RECOGNISER / "config.pbtxt").is_file() and (repo / RECOGNISER / "1" / "model.onnx").is_file()
    assert "docker run" in out


def test_engines_build_without_torch_names_the_install_not_an_option_it_lacks(declared_only, tmp_path):
    r = vcam(declared_only, "engines", "build", "--device", "cpu", "--model", str(tmp_path / "inswapper_128.onnx"))
    assert r.returncode == 6, r.stdout + r.stderr
    assert "error: compiling engines needs PyTorch: torch not installed" in r.stderr
    assert "--index-url https://download.pytorch.org/whl/cpu" in r.stderr
    assert "use --backend" not in r.stderr  # `vcam engines build` has no --backend
