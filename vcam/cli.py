"""Command line: thin wrappers that build the config, call the library, and print errors.

Library code raises :class:`vcam.errors.VcamError`; only this module prints and picks exit codes.
Sub-command groups live beside the code they drive and are registered in ``_register_groups``.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional

import typer
from rich.console import Console

from .errors import VcamError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="FastSwap Cam: live face swap as a virtual camera.")
console = Console(stderr=True)


def _fail(err: VcamError) -> None:
    console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
    raise typer.Exit(err.exit_code)


def _register_groups() -> None:
    # Each group is a typer.Typer defined next to the code it drives.
    # --- sub-command groups (one line each) ---
    pass


_register_groups()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except VcamError as err:  # raised outside a command's own handler
        console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
