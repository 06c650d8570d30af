"""Command line: every typer command of ``vcam``, thin wrappers over the library.

Library code raises :class:`vcam.errors.VcamError`; only this package prints and picks exit codes
(:func:`fail`). Each sub-module adds its commands to :data:`app`: ``run`` (run, check, devices,
config), ``faces``, ``models``, ``engines``, ``control`` (obs, ctl) and ``bench``.
"""

from __future__ import annotations

from vcam.cli import bench, control, engines, faces, models, run, serve  # each adds its commands to `app`
from vcam.cli.common import ConfigOpt, app, console, fail, load_config, main, out
from vcam.cli.run import format_status

__all__ = [
    "ConfigOpt",
    "app",
    "bench",
    "control",
    "console",
    "engines",
    "fail",
    "faces",
    "format_status",
    "load_config",
    "main",
    "models",
    "out",
    "run",
    "serve",
]
