"""``vcam --help`` and every subcommand's ``--help``, each in its own process (Windows side of
tools/windows-tests). Prints one line per failure and a count; exits 1 when any failed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import typer

from vcam.cli import app


def commands(cmd: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path under ``cmd`` (a click command; typer may bring its own click), ``()``
    (the top) included, hidden ones too."""
    yield path
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from commands(sub, (*path, name))


def help_of(path: tuple[str, ...]) -> str | None:
    """None when ``vcam PATH --help`` exits 0 with a usage line, else what went wrong."""
    args = [sys.executable, "-m", "vcam", *path, "--help"]
    try:
        p = subprocess.run(args, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=180)
    except subprocess.TimeoutExpired:
        return "no answer in 180 s"
    if p.returncode == 0 and "Usage:" in p.stdout:
        return None
    tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
    return f"exit {p.returncode}: " + " | ".join(tail)


def main() -> int:
    paths = list(commands(typer.main.get_command(app)))
    with ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(help_of, paths))
    bad = [(p, e) for p, e in zip(paths, errors) if e is not None]
    for path, error in bad:
        print(f"FAILED: vcam {' '.join(path)} --help: {error}")
    print(f"cli: {len(paths) - len(bad)} of {len(paths)} --help pages (vcam and every subcommand) work")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
