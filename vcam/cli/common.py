"""What every command module shares: the typer app, the consoles, :func:`fail` (the one place that
prints a library error and picks the exit code) and :func:`load_config`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from vcam.errors import VcamError

# Help texts (and command docstrings) are rich markup in every Typer of the CLI: a literal "[" is
# written "\\[" (tests/e2e/test_help.py renders every --help and finds each bracket).
app = typer.Typer(
    rich_markup_mode="rich", add_completion=False, no_args_is_help=True, help="FastSwap Cam: live face swap as a virtual camera."
)
console = Console(stderr=True)
out = Console()

ConfigOpt = typer.Option(None, "--config", "-c", help="config.toml to use (default: $VCAM_CONFIG or the user config dir).")


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what loads and when (INFO lines on stderr)."),
) -> None:
    if verbose:
        logging.getLogger("vcam").setLevel(logging.INFO)


def fail(err: VcamError) -> NoReturn:
    """Print ``err`` as one line on stderr and exit with its code."""
    console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
    raise typer.Exit(err.exit_code)


def load_config(config: Optional[Path] = None, overrides: dict | None = None, labels: dict | None = None) -> Any:
    """The one Config: defaults, the file (``--config``, ``$VCAM_CONFIG`` or the user's), overrides."""
    from vcam import config_file as config_mod

    try:
        return config_mod.load(config, overrides, labels)
    except VcamError as err:
        fail(err)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("obsws_python").setLevel(logging.WARNING)
    try:
        app()
    except VcamError as err:  # raised outside a command's own handler
        console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # Ctrl-C before a command installed its own handling
        sys.exit(130)
