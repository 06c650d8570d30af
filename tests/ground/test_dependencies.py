"""Every module vcam/ imports is a declared dependency, and every declared one is used: deptry with
pyproject.toml's [tool.deptry] (tools/check runs the same). Shown to fail on a copy of the project
with an undeclared import, a dependency that is there only through another package, and an unused one."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[2]


def deptry(root: Path) -> subprocess.CompletedProcess:
    try:
        import deptry  # noqa: F401
    except ImportError as exc:
        require("deptry", f"deptry is not installed ({exc}); pip install -e '.[test]'")
    # deptry reports on stderr; one stream to read.
    return subprocess.run(
        [sys.executable, "-m", "deptry", "--no-ansi", "."], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=120,
    )  # fmt: skip


def _copy(src: str, dst: str) -> None:
    """Bytes only: Windows' CopyFile2 (shutil's copy there) is missing under Wine 8."""
    Path(dst).write_bytes(Path(src).read_bytes())


@pytest.fixture
def project(tmp_path):
    """A copy of the project's pyproject.toml and vcam/ (what deptry reads)."""
    _copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "vcam", tmp_path / "vcam", ignore=shutil.ignore_patterns("__pycache__"), copy_function=_copy)
    return tmp_path


def test_the_tree_declares_every_dependency():
    r = deptry(ROOT)
    assert r.returncode == 0, r.stdout
    assert "No dependency issues found" in r.stdout


def test_an_undeclared_import_fails(project):
    # A function-level import, as vcam's optional ones are written.
    (project / "vcam" / "extra.py").write_text("def f():\n    import surely_not_a_vcam_dependency\n")
    r = deptry(project)
    assert r.returncode != 0
    assert re.search(r"vcam[/\\]extra\.py:2:\d+: DEP001 'surely_not_a_vcam_dependency' imported but missing", r.stdout)


def test_a_dependency_that_only_comes_along_fails(project):
    """What issue 38 found: filelock imported, undeclared, installed only because torch brings it."""
    text = (project / "pyproject.toml").read_text()
    line = re.search(r'^\s*"filelock[^"]*",.*\n', text, re.M)
    assert line, "filelock is declared in pyproject.toml"
    (project / "pyproject.toml").write_text(text.replace(line.group(0), ""))
    r = deptry(project)
    assert r.returncode != 0
    assert re.search(r"DEP003 'filelock' imported but it is a transitive dependency", r.stdout)


def test_an_unused_dependency_fails(project):
    text = (project / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(text.replace("dependencies = [\n", 'dependencies = [\n    "pyyaml>=6",\n', 1))
    r = deptry(project)
    assert r.returncode != 0
    assert "DEP002 'pyyaml' defined as a dependency but not used in the codebase" in r.stdout


def test_a_device_call_stops_first_where_a_declared_dependency_is_missing(tmp_path, capsys):
    """``benchmarks.device_deps`` (gpu_check.sh's first step): every declared dependency installed
    here passes; one that is not is named, with the command that fetches its wheel, and fails."""
    from benchmarks import device_deps

    assert device_deps.main(["--pyproject", str(ROOT / "pyproject.toml")]) == 0
    text = (ROOT / "pyproject.toml").read_text().replace('"numpy>=1.24",', '"numpy>=1.24", "vcam-no-such-wheel>=1",', 1)
    (tmp_path / "pyproject.toml").write_text(text)
    assert device_deps.missing(tmp_path / "pyproject.toml") == ["vcam-no-such-wheel"]
    assert device_deps.main(["--pyproject", str(tmp_path / "pyproject.toml")]) == 1
    assert "device-wheels vcam-no-such-wheel" in capsys.readouterr().out


def test_the_device_check_takes_opencv_s_headless_build_for_opencv_python(monkeypatch):
    """The device image has ``opencv-python-headless`` (the same ``cv2``): the declared
    ``opencv-python`` is not missing there."""
    from importlib import metadata

    from benchmarks import device_deps

    real = metadata.version

    def headless_only(name):
        if name == "opencv-python":
            raise metadata.PackageNotFoundError(name)
        return "4.10.0" if name == "opencv-python-headless" else real(name)

    monkeypatch.setattr(device_deps.metadata, "version", headless_only)
    assert device_deps.missing(ROOT / "pyproject.toml") == []
    monkeypatch.setattr(device_deps, "SAME_MODULES", {})
    assert device_deps.missing(ROOT / "pyproject.toml") == ["opencv-python"]
