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

#: Distributions that provide the same modules as a declared one (the device image has OpenCV's
#: headless build: ``import cv2`` works, ``opencv-python`` is not installed by that name).
SAME_MODULES = {
    "opencv-python": ("opencv-python-headless", "opencv-contrib-python", "opencv-contrib-python-headless"),
}


def _installed(name: str) -> bool:
    for dist in (name, *SAME_MODULES.get(name, ())):
        try:
            metadata.version(dist)
            return True
        except metadata.PackageNotFoundError:
            continue
    return False


def missing(pyproject: Path) -> list[str]:
    """The declared dependencies (``[project] dependencies``) not installed here (nor a distribution
    of the same modules, :data:`SAME_MODULES`), by their names."""
    reqs = [Requirement(r) for r in tomllib.loads(pyproject.read_text())["project"]["dependencies"]]
    return [r.name for r in reqs if (r.marker is None or r.marker.evaluate()) and not _installed(r.name)]


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
