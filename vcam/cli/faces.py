"""``vcam faces list|add|remove``: the face bank."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from vcam.cli.common import app, load_config
from vcam.cli.common import fail as _fail
from vcam.stages.faces import FaceBank

log = logging.getLogger(__name__)

faces_app = typer.Typer(rich_markup_mode="rich", no_args_is_help=True, help="The face bank: source faces to swap in.")
app.add_typer(faces_app, name="faces", help="The face bank: list, add and remove source faces.")


def _config(ctx: typer.Context):
    """The config as `vcam run` builds it: $VCAM_CONFIG or the user config file over the defaults."""
    return load_config()


@faces_app.command("list")
def faces_list(ctx: typer.Context) -> None:
    """List the faces in the bank."""
    from rich.console import Console
    from rich.table import Table

    from vcam.errors import VcamError

    try:
        cfg = _config(ctx)
        bank = FaceBank(cfg.faces_dir)
        entries, damaged = bank.scan()
    except VcamError as err:
        _fail(err)
    console = Console(soft_wrap=True, highlight=False, markup=False)
    if not entries and not damaged:
        console.print(f"no faces in {bank.root}; add one with `vcam faces add PHOTO`")
        return
    table = Table("name", "added", "embeddings", "folder")
    for e in entries:
        table.add_row(e.name, e.added, ", ".join(e.embeddings) or "-", str(e.folder))
    for name in damaged:
        table.add_row(name, "DAMAGED", "-", str(bank.root / name))
    console.print(table)
    for exc in damaged.values():  # each damaged face with its fix, on its own line
        Console(stderr=True, soft_wrap=True, highlight=False, markup=False).print(f"warning: {exc}")


@faces_app.command("add")
def faces_add(
    ctx: typer.Context,
    photo: Path = typer.Argument(..., help="Photo with the face to add."),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Name in the bank (default: the file name)."),
    pick: Optional[int] = typer.Option(
        None, "--pick", "-k", min=1, help="Which face when the photo holds several (1 = leftmost)."
    ),
) -> None:
    """Add the face in PHOTO to the bank."""
    from rich.console import Console

    from vcam.errors import ModelError, VcamError

    try:
        cfg = _config(ctx)
        from vcam.runtime.roles import stage_params
        from vcam.stages.detect import RetinaFaceDetector
        from vcam.stages.detections import DetectParams

        detector = RetinaFaceDetector(stage_params(DetectParams, cfg.detect), cfg.track.roi_size, backend="onnxruntime")
        recogniser = None
        try:  # the embedding is cached now when the recogniser is already on disk
            from vcam.runtime.roles import build as build_role
            from vcam.runtime.roles import model_store
            from vcam.stages.recognize import DEFAULT_RECOGNISER

            store = model_store(cfg, progress=False)
            if store.path(DEFAULT_RECOGNISER).is_file():
                recogniser = build_role("recogniser", cfg, store=store, download=False, backend="onnxruntime")
        except ModelError as err:
            log.warning("face added without an embedding: %s", err)
        entry = FaceBank(cfg.faces_dir).add(photo, name, pick, detector=detector, recogniser=recogniser)
    except VcamError as err:
        _fail(err)
    Console(soft_wrap=True, highlight=False, markup=False).print(f"added face '{entry.name}' ({entry.folder})")


@faces_app.command("remove")
def faces_remove(ctx: typer.Context, name: str = typer.Argument(..., help="Face name.")) -> None:
    """Remove a face from the bank (its folder and cached embeddings; for a folder that is a symlink,
    only the link)."""
    from rich.console import Console

    from vcam.errors import VcamError

    try:
        link_target = FaceBank(_config(ctx).faces_dir).remove(name)
    except VcamError as err:
        _fail(err)
    note = f" (only the link: {link_target} was left alone)" if link_target is not None else ""
    Console(soft_wrap=True, highlight=False, markup=False).print(f"removed face '{name}'{note}")
