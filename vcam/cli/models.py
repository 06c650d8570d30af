"""``vcam models list|pull|verify|path|stand-in``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vcam.cli.common import app as root
from vcam.cli.common import fail as _fail
from vcam.cli.common import load_config
from vcam.errors import VcamError
from vcam.models import registry

app = typer.Typer(rich_markup_mode="rich", no_args_is_help=True, help="Face models: list, download, verify, stand-ins.")
root.add_typer(app, name="models", help="Model files: list, pull, verify, stand-ins.")
out = Console(soft_wrap=True, highlight=False)


def _store(ctx: typer.Context, mirror: list[str] | None = None, progress: bool = True):
    from vcam.runtime.roles import model_store

    return model_store(load_config(), mirrors=list(mirror or []), progress=progress)


_MIRROR = typer.Option(
    None, "--mirror", help="Extra URL template tried first, with {base} and {file} (e.g. http://host/{base}/{file})."
)


@app.command("list")
def list_models(
    ctx: typer.Context, kind: Optional[str] = typer.Option(None, "--kind", help="Only this kind: " + ", ".join(registry.KINDS))
) -> None:
    """Supported models, whether they are on disk, and their licences."""
    try:
        store = _store(ctx)
        table = Table("name", "kind", "state", "about", "licence")
        for spec in registry.MODELS.values():
            if kind and spec.kind != kind:
                continue
            st = store.state(spec.name)
            state = {
                "verified": "[green]verified[/]",
                "present": "[yellow]present, not verified[/]",
                "partial": f"[yellow]partial ({st.detail})[/]",
                "missing": "missing",
                "embedded": "built in",
            }[st.state]
            lic = f"[bold red]{spec.licence}[/]" if "NON-COMMERCIAL" in spec.licence.upper() else spec.licence
            table.add_row(spec.name, spec.kind, state, f"{spec.approx_mb:g} MB", lic)
    except VcamError as err:
        _fail(err)
    out.print(table)
    out.print(f"models dir: {store.root}")


@app.command("pull")
def pull(
    ctx: typer.Context,
    names: List[str] = typer.Argument(..., help="Model names (see `vcam models list`)."),
    force: bool = typer.Option(False, "--force", help="Download again even if the file is present."),
    mirror: Optional[List[str]] = _MIRROR,
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
) -> None:
    """Download, verify and lock models (and what they need: recogniser, converter)."""
    try:
        wanted: list[str] = []
        for n in names:
            wanted += [m for m in registry.requirements(n) if m not in wanted]
        for n in wanted:
            spec = registry.get(n)
            if "NON-COMMERCIAL" in spec.licence.upper():
                Console(stderr=True).print(f"[bold yellow]note:[/] {spec.name}: {spec.licence}")
        store = _store(ctx, mirror, progress=not no_progress)
        paths = store.pull(wanted, force=force)
    except VcamError as err:
        _fail(err)
    for p in paths:
        out.print(f"ok {p}")
    for n in wanted:
        if registry.get(n).kind == "swapper" and store.path(n) in paths:
            _prepare_native(n, store.path(n))


def _prepare_native(name: str, path: Path) -> None:
    """The swap network's build for PyTorch written now (:func:`vcam.engines.native.saved.prepare`)
    on a machine with an NVIDIA driver and PyTorch: the first GPU run then reads no ONNX. A failure
    costs only that run's build: one note."""
    import importlib.util

    from vcam.platform import native

    if not native.nvidia_driver() or importlib.util.find_spec("torch") is None:
        return
    from vcam.engines.native import saved

    try:
        done = saved.prepare(path)
    except Exception as exc:
        Console(stderr=True).print(
            f"[bold yellow]note:[/] {name}: its GPU build was not written ({type(exc).__name__}: {exc}); "
            "the first GPU run builds it"
        )
        return
    if done is not None:
        out.print(f"ok {done[0]} (its GPU build{'' if done[1] else ', already there'})")


@app.command("verify")
def verify(
    ctx: typer.Context, names: Optional[List[str]] = typer.Argument(None, help="Models to check (default: every file present).")
) -> None:
    """Re-check files on disk against their pins, lock entries and .hash files."""
    try:
        store = _store(ctx, progress=False)
        todo = names or [s.name for s in registry.MODELS.values() if s.file and store.path(s.name).is_file()]
    except VcamError as err:
        _fail(err)
    if not todo:
        out.print(f"no model files in {store.root}")
        return
    failed: VcamError | None = None
    for n in todo:
        try:
            sha = store.verify(n, full=True)
            out.print(f"ok {n} sha256 {sha}")
        except VcamError as err:
            Console(stderr=True).print(f"[bold red]failed:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            failed = err
    if failed is not None:
        raise typer.Exit(failed.exit_code)


@app.command("path")
def path(ctx: typer.Context, name: Optional[str] = typer.Argument(None, help="A model (default: print the models dir).")) -> None:
    """Where model files live (or where NAME's file goes)."""
    try:
        store = _store(ctx, progress=False)
        out.print(str(store.path(name) if name else store.root), highlight=False, soft_wrap=True)
    except VcamError as err:
        _fail(err)


@app.command("stand-in")
def stand_in(
    name: str = typer.Argument(..., help="Model name."),
    out_path: Path = typer.Option(..., "--out", help="File (or folder) to write."),
    tiny: bool = typer.Option(False, "--tiny", help="Same tensors, much smaller channels (for tests)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for the weights."),
) -> None:
    """Write an ONNX stand-in with NAME's real tensors and random weights (not a trained model)."""
    from vcam.models.standin import write

    try:
        p = write(name, out_path, tiny=tiny, seed=seed)
    except VcamError as err:
        _fail(err)
    out.print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB): random weights, for tests and benchmarks only")
