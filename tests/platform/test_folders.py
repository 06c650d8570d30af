"""The user's folders: platformdirs' answers on POSIX, ``%LOCALAPPDATA%`` read at each call on Windows."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs
import pytest

from vcam.config import Config
from vcam.platform import folders


@pytest.mark.skipif(os.name == "nt", reason="XDG folders: not on Windows (its own test is below)")
def test_posix_folders_are_platformdirs_and_follow_the_environment_at_each_call(tmp_path, monkeypatch):
    assert folders.cache_dir() == Path(platformdirs.user_cache_dir("vcam"))
    assert folders.config_dir() == Path(platformdirs.user_config_dir("vcam"))
    assert folders.data_dir() == Path(platformdirs.user_data_dir("vcam"))
    assert folders.state_dir() == Path(platformdirs.user_state_dir("vcam"))
    if sys.platform.startswith("linux"):  # macOS keeps ~/Library whatever XDG says
        for var, fn in (("XDG_CACHE_HOME", folders.cache_dir), ("XDG_CONFIG_HOME", folders.config_dir),
                        ("XDG_DATA_HOME", folders.data_dir), ("XDG_STATE_HOME", folders.state_dir)):  # fmt: skip
            monkeypatch.setenv(var, str(tmp_path / var))
            assert fn() == tmp_path / var / "vcam"


def test_windows_folders_are_read_from_localappdata_at_each_call(tmp_path, monkeypatch):
    first, second = tmp_path / "one", tmp_path / "two"
    monkeypatch.setenv("LOCALAPPDATA", str(first))
    assert folders.cache_dir(windows=True) == first / "vcam" / "Cache"
    assert folders.config_dir(windows=True) == first / "vcam"
    assert folders.data_dir(windows=True) == first / "vcam"
    monkeypatch.setenv("LOCALAPPDATA", str(second))  # never cached: a test's own folder is seen at once
    assert folders.cache_dir(windows=True) == second / "vcam" / "Cache"
    assert folders.state_dir(windows=True) == second / "vcam"


def test_windows_folders_fall_back_to_platformdirs_without_the_variable(monkeypatch):
    monkeypatch.delenv("LOCALAPPDATA", raising=False)
    assert folders.cache_dir(windows=True) == Path(platformdirs.user_cache_dir("vcam", appauthor=False))
    monkeypatch.setenv("LOCALAPPDATA", "relative\\path")  # not absolute: never trusted
    assert folders.data_dir(windows=True) == Path(platformdirs.user_data_dir("vcam", appauthor=False))


def test_the_control_socket_sits_in_the_runtime_folder_else_the_state_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert Config().socket_path == tmp_path / "run" / "vcam.sock"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")  # not absolute: ignored, as before
    assert Config().socket_path == folders.state_dir() / "run" / "vcam.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path / "local"))
    assert folders.runtime_dir(windows=True) == tmp_path / "local" / "vcam" / "run"
