"""``vcam engines build|list``: the compiled swap networks in the engine cache."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from vcam.cli.common import app as root
from vcam.cli.common import fail, load_config
from vcam.errors import VcamError

app = typer.Typer(no_args_is_help=True, help="Compiled engines: build them once, list the cache.")
root.add_typer(app, name="engines", help="Compiled engines: build (once per GPU and torch), list.")
out = Console(soft_wrap=True, highlight=False)
err = Console(file=sys.stderr, highlight=False)  # bound now: a build sends sys.stderr to its log


def _batches(text: str) -> list[int] | None:
    if not text:
        return None
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise typer.BadParameter(f"{text!r}: a comma list of batch sizes, e.g. 1,8") from None
    if not sizes or sizes[0] < 1:
        raise typer.BadParameter("batch sizes are 1 or more")
    return sizes


@app.command("build")
def build(
    model: str = typer.Option(
        "", "--model", "--swapper", help="A swapper model name or ONNX file (default: the config's swapper, else inswapper_128)."
    ),
    device: str = typer.Option("cuda", "--device", help="cuda, or cpu (Inductor's C++ kernels)."),
    fp16: Optional[bool] = typer.Option(None, "--fp16/--fp32", help="Precision (default: fp16 on CUDA, fp32 on the CPU)."),
    batch: str = typer.Option("", "--batch", help="Comma list of batch sizes (default: every size up to [pipeline] max_faces)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="config.toml to use."),
) -> None:
    """Compile the swap network for this GPU, torch and precision, once per batch size."""
    from vcam.engines.compiled import prebuild

    sizes = _batches(batch)
    cfg = load_config(config)
    try:
        path = Path(model).expanduser()
        if path.suffix != ".onnx":
            from vcam.models import registry
            from vcam.runtime.roles import model_store

            name = model or (cfg.swap.swapper if cfg.swap.swapper in registry.MODELS else "inswapper_128")
            path = model_store(cfg).ensure([name])[name]
        precision = (device == "cuda") if fp16 is None else fp16
        started = time.perf_counter()

        def progress(b: int, i: int, n: int) -> None:
            err.print(f"compiling {path.stem} for batch {b} ({i + 1} of {n}; about two minutes each on a GPU) ...")

        with err.status(f"{path.stem}: compiled engines for {device} ..."):
            how, done = prebuild(
                path, device=device, fp16=precision, max_batch=cfg.pipeline.max_faces, batches=sizes, progress=progress
            )
    except VcamError as exc:
        fail(exc)
    table = Table("batch", "state", "seconds")
    for b, state, seconds in done:
        table.add_row(str(b), state, f"{seconds:.0f}" if state == "built" else "-")
    out.print(table)
    out.print(f"{path.name}: {how}; {time.perf_counter() - started:.0f} s (compiler reports: *.art.log beside the engines)")


@app.command("list")
def list_engines(
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Engine cache (default: the one `vcam run` uses)."),
) -> None:
    """The compiled engines in the cache, and whether this machine can use them."""
    from vcam.engines.artifacts import entries, here
    from vcam.engines.cache import resolve_cache_dir

    current = here()
    table = Table()
    for col in ("file", "batch", "precision", "gpu", "libraries", "MB", "state"):
        table.add_column(col, overflow="fold")
    found = entries(cache_dir)
    for e in found:
        if e.key is None:
            table.add_row(e.path.name, "-", "-", "-", "-", f"{e.size / 1e6:.1f}", f"[red]{e.problem}[/]")
            continue
        batch = str(next(iter(dict(e.key.profile).values()))[0][0])
        state = "usable here" if (e.key.gpu, e.key.library.split(",")[0]) in current else "[yellow]other GPU or torch[/]"
        table.add_row(e.path.name, batch, e.key.precision, e.key.gpu, e.key.library, f"{e.size / 1e6:.1f}", state)
    if found:
        out.print(table)
    out.print(f"{len(found)} compiled engines in {resolve_cache_dir(cache_dir) / 'compiled'}")
