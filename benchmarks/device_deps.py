"""Which of the project's declared dependencies this Python lacks, before a device call spends its
minutes: ``gpu_check.sh`` runs it first and stops at once, naming the wheels to carry, where one is
missing (2026-12-06: a call whose .whl/ lacked starlette ran 400 s of tests and end-to-end runs that
all failed on ``import starlette``).

    python -m benchmarks.device_deps [--pyproject pyproject.toml]

Exit 0 when every dependency whose marker applies is installed, 1 with one line naming the missing
ones and the command that fetches their wheels (``../shared/tools/device-wheels NAME ...``)."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from packaging.requirements import Requirement


def missing(pyproject: Path) -> list[str]:
    """The declared dependencies (``[project] dependencies``) not installed here, by their names."""
    reqs = [Requirement(r) for r in tomllib.loads(pyproject.read_text())["project"]["dependencies"]]
    out = []
    for r in reqs:
        if r.marker is not None and not r.marker.evaluate():
            continue
        try:
            metadata.version(r.name)
        except metadata.PackageNotFoundError:
            out.append(r.name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pyproject", type=Path, default=Path(__file__).resolve().parents[1] / "pyproject.toml")
    args = ap.parse_args(argv)
    names = missing(args.pyproject)
    if names:
        print(
            f"declared dependencies missing here: {', '.join(names)}; carry their wheels in .whl/ "
            f"(../shared/tools/device-wheels {' '.join(names)})"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
