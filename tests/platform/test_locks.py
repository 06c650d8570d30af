"""Exclusive locks between processes, released when the holder ends however it ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from vcam.platform import files, locks


def _open(path) -> int:
    return files.open_private(path, os.O_RDWR)


def test_one_holder_at_a_time_and_the_file_stays_readable(tmp_path):
    path = tmp_path / "x.lock"
    first, second = _open(path), _open(path)
    try:
        assert locks.try_lock(first)
        os.write(first, b"1234\n")
        assert not locks.try_lock(second)
        assert os.read(second, 32) == b"1234\n"  # the refused one can name the holder
        os.close(first)
        first = -1
        assert locks.try_lock(second)
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)


def test_a_killed_holder_releases_the_lock(tmp_path):
    path = tmp_path / "x.lock"
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom vcam.platform import locks\n"
        "with locks.hold(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        fd = _open(path)
        try:
            assert not locks.try_lock(fd)
            holder.kill()
            holder.wait(10)
            assert locks.try_lock(fd)
        finally:
            os.close(fd)
    finally:
        if holder.poll() is None:
            holder.kill()


def test_hold_waits_for_the_holder(tmp_path):
    path = tmp_path / "install.lock"
    order: list[str] = []

    def second():
        with locks.hold(path):
            order.append("second")

    with locks.hold(path):
        t = threading.Thread(target=second)
        t.start()
        t.join(0.3)
        assert t.is_alive(), "the second holder did not wait"
        order.append("first")
    t.join(10)
    assert order == ["first", "second"]
