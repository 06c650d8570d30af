"""The Windows test run against the same selection on Linux (Linux side of tools/windows-tests).

``python compare.py WINDOWS.xml LINUX.xml [SELECTED]``: two pytest junit files; SELECTED, when given,
is ``pytest --collect-only -q`` output that limits LINUX.xml to those tests (CI reuses the junit of
its full Linux run). Passes (exit 0) when nothing fails on Windows, at least 95 % of the tests that
pass on Linux pass on Windows, and each of the others skips with a reason naming the Windows facility
it lacks (the reason says "Windows" or "Wine"); any other difference is a defect.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter

TARGET = 0.95
FACILITY = re.compile(r"\bwindows\b|\bwine\b", re.IGNORECASE)
# The selection is the tests that need no OBS, Xvfb, Chromium, GPU or local Triton server: one that
# skips on Windows for want of one of those (conftest's require(), "NAME unavailable: ...", or
# conftest.TRITON_SERVER: nvidia-pytriton's server has Linux wheels only, so a Windows user's
# `on remote` engine reaches a server on another machine, as a Windows user's OBS runs apart from
# this run) is left out on both sides.
LEFT_OUT = re.compile(r"^(obs|xvfb|chromium|gpu|cuda|cupy|tensorrt) unavailable:|^the Triton server of `vcam serve`")


def results(path: str) -> dict[str, tuple[str, str]]:
    """test id -> (passed | skipped | failed, message)."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).iter("testcase"):
        key = f"{case.get('classname')}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, message = "failed", (child.get("message") or "").strip()
                break
            if child.tag == "skipped":
                status, message = "skipped", (child.get("message") or "").strip()
        if out.get(key, ("passed", ""))[0] != "failed":  # a test's teardown error is a second entry
            out[key] = (status, message)
    return out


def selected(path: str) -> set[str]:
    """Node ids (``tests/a/test_b.py::Cls::test_c[x]``) as junit ids (``tests.a.test_b.Cls::test_c[x]``)."""
    ids = set()
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if "::" not in line or line.startswith(("=", "<")):
            continue
        file, *rest = line.split("::")
        classname = ".".join([file.removesuffix(".py").replace("/", "."), *rest[:-1]])
        ids.add(f"{classname}::{rest[-1]}")
    return ids


def count(res: dict[str, tuple[str, str]]) -> str:
    c = Counter(status for status, _ in res.values())
    return f"{c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed (of {len(res)})"


def short(message: str) -> str:
    line = message.splitlines()[0] if message else ""
    return line if len(line) <= 200 else line[:197] + "..."


def main() -> int:
    win, linux = results(sys.argv[1]), results(sys.argv[2])
    if len(sys.argv) > 3:
        keep = selected(sys.argv[3])
        linux = {k: v for k, v in linux.items() if k in keep}
    left_out = {k for k, (status, message) in win.items() if status == "skipped" and LEFT_OUT.match(message)}
    win = {k: v for k, v in win.items() if k not in left_out}
    linux = {k: v for k, v in linux.items() if k not in left_out}
    linux_pass = {k for k, (status, _) in linux.items() if status == "passed"}
    win_pass = {k for k in linux_pass if win.get(k, ("missing", ""))[0] == "passed"}
    failed = sorted(k for k, (status, _) in win.items() if status == "failed")
    facility: Counter[str] = Counter()
    defects = []
    for k in sorted(linux_pass - win_pass):
        status, message = win.get(k, ("missing", "not collected on Windows"))
        if status == "skipped" and FACILITY.search(message):
            facility[short(message)] += 1
        elif status != "failed":
            defects.append(f"{k}: {status} on Windows: {short(message)}")
    if left_out:
        print(f"left out on both sides (need OBS, Xvfb, Chromium, a GPU or a local Triton server): {len(left_out)}")
    print(f"Linux:   {count(linux)}")
    print(f"Windows: {count(win)}")
    for k in failed:
        print(f"FAILED on Windows: {k}: {short(win[k][1])}")
    missing = [line for line in defects if ": missing on Windows" in line]
    defects = [line for line in defects if line not in missing]
    for line in missing[:10]:  # a module that failed to import (listed above) takes all its tests along
        print(f"NOT RUN on Windows: {line.split(': missing')[0]}")
    if len(missing) > 10:
        print(f"NOT RUN on Windows: {len(missing) - 10} more tests that pass on Linux")
    for line in defects:
        print(f"DEFECT (passes on Linux, no Windows facility named): {line}")
    for reason, n in facility.most_common():
        print(f"skipped on Windows ({n}): {reason}")
    ratio = len(win_pass) / len(linux_pass) if linux_pass else 0.0
    ok = not failed and not defects and not missing and ratio >= TARGET
    print(
        f"tests: {len(win_pass)} of the {len(linux_pass)} passing on Linux pass on Windows ({100 * ratio:.1f} %,"
        f" target {100 * TARGET:.0f} %), {sum(facility.values())} skip naming a Windows facility,"
        f" {len(failed)} fail, {len(defects) + len(missing)} other differences: {'ok' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
