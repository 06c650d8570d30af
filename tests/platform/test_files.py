"""Private files: 0600 from creation, no symlink followed, the owner checked; private folders."""

from __future__ import annotations

import os
import stat

import pytest

from vcam.platform import files

POSIX = os.name == "posix"
needs_modes = pytest.mark.skipif(not POSIX, reason="mode bits and uids: not on Windows (the profile's ACL guards files there)")


@needs_modes
def test_a_private_file_is_0600_from_creation_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        fd = files.open_private(tmp_path / "a", os.O_WRONLY)
    finally:
        os.umask(old)
    os.close(fd)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o600


@needs_modes
def test_a_symlink_is_never_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("theirs")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError, match=r"Too many levels of symbolic links|symbolic link"):
        files.open_private(tmp_path / "link", os.O_WRONLY)
    assert target.read_text() == "theirs"


def test_write_private_replaces_an_open_file_whole_and_private(tmp_path):
    path = tmp_path / "panel"
    path.write_text("old")
    if POSIX:
        path.chmod(0o644)
    files.write_private(path, b'{"token": "t"}\n')
    assert path.read_bytes() == b'{"token": "t"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["panel"]  # no temporary file left
    if POSIX:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


@needs_modes
def test_restrict_narrows_a_file_that_existed(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    path.chmod(0o666)
    fd = os.open(path, os.O_RDONLY)
    try:
        files.restrict(fd)
    finally:
        os.close(fd)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_my_own_files_are_mine(tmp_path):
    assert files.mine(os.stat(tmp_path))
    assert files.my_uid() == (os.getuid() if hasattr(os, "getuid") else None)


@needs_modes
def test_another_users_file_is_not_mine(tmp_path):
    st = os.stat(tmp_path)
    other = os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid + 1, *tuple(st)[5:10]))
    assert not files.mine(other)


@needs_modes
def test_private_folders_and_the_others(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    files.check_private_folder(mine)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(files.NotPrivate, match=r"not private \(owner uid \d+, mode 0777\)"):
        files.check_private_folder(shared)
    shared.chmod(0o1777)  # sticky, as /tmp: nobody can swap another's file
    files.check_private_folder(shared)
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(NotADirectoryError, match=r"is not a folder"):
        files.check_private_folder(tmp_path / "link")
    with pytest.raises(FileNotFoundError):
        files.check_private_folder(tmp_path / "missing")
