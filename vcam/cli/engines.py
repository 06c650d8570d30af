"""``vcam engines build|list``: the compiled swap networks in the engine cache."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from vcam.cli.common import app as root
from vcam.cli.common import fail, load_config
from vcam.errors import VcamError

app = typer.Typer(rich_markup_mode="rich", no_args_is_help=True, help="Compiled engines: build them once, list the cache.")
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
    batch: str = typer.Option(
        "",
        "--batch",
        help="Comma list of the batch sizes that must be covered (default: every size up to the config's max_faces). "
        "One engine with a dynamic batch covers them all; these are the sizes built one by one with --static, "
        "or where the dynamic build fails.",
    ),
    static: bool = typer.Option(
        False, "--static", help="One engine per batch size instead of one for all (for comparison; slower to build)."
    ),
    jobs: int = typer.Option(
        0, "--jobs", min=0, help="With --static: build jobs side by side (0: one per 4 host cores on CUDA, 1 on the CPU)."
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="config.toml to use."),
) -> None:
    r"""Compile the swap network for this GPU, torch and precision: one engine for every batch size
    a daemon uses, 1 to \[pipeline] max_faces (`vcam run` also does this in the background on first
    use); a progress bar."""
    from vcam.engines.build_job import prebuild

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
        with _Bars(path.stem) as bars:
            how, done = prebuild(
                path,
                device=device,
                fp16=precision,
                max_batch=cfg.pipeline.max_faces,
                batches=sizes,
                jobs=jobs or None,
                progress=bars.update,
                dynamic=not static,
            )
    except VcamError as exc:
        fail(exc)
    table = Table("batch", "state", "seconds")
    for label, state, seconds in done:
        table.add_row(label, state, f"{seconds:.0f}" if state == "built" else "-")
    out.print(table)
    out.print(f"{path.name}: {how}; {time.perf_counter() - started:.0f} s (compiler reports: *.art.log beside the engines)")


class _Bars:
    """One rich progress bar per entry being built (the one for every batch size, ``1-8``, or one
    per size; time against the expected build time; full when built), and a line for all of them
    with the time left."""

    def __init__(self, name: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.name = name
        self.bars = Progress(
            TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[note]}"), console=err
        )
        self.tasks: dict[str, Any] = {}
        self.total: Any = None

    def __enter__(self) -> _Bars:
        self.bars.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bars.__exit__(*exc)

    def update(self, state: Any) -> None:
        now = time.time()
        per = sum(state.durations) / len(state.durations) if state.durations else state.guess_s
        if self.total is None:
            self.total = self.bars.add_task(f"{self.name}: all", total=len(state.sizes), note="")
        self.bars.update(self.total, total=len(state.sizes))  # the dynamic entry may give way to one per size
        for b in state.sizes:
            if b not in self.tasks:
                what = f"batch {b} (one engine)" if "-" in b else f"batch {b}"
                self.tasks[b] = self.bars.add_task(f"  {what}", total=100, note="queued", start=False)
            task = self.tasks[b]
            if b in state.failed:
                self.bars.update(task, note=f"[red]failed[/] {state.failed[b][:60]}")
                self.bars.stop_task(task)
            elif b in state.done:
                self.bars.update(task, completed=100, note="done")
                self.bars.stop_task(task)
            elif b in state.current:
                self.bars.start_task(task)
                self.bars.update(task, completed=min(95.0, 100 * (now - state.current[b]) / max(per, 1.0)), note="compiling")
            elif b in state.waiting:
                self.bars.update(task, note="another process compiles it")
        for b in set(self.tasks) - set(state.sizes):  # the dynamic entry, after it failed
            self.bars.update(self.tasks[b], note=f"[yellow]failed, one per size instead[/] {state.fallback[:60]}")
            self.bars.stop_task(self.tasks[b])
        left = state.text(now)
        self.bars.update(self.total, completed=len(state.done), note=left.split(", ", 1)[1] if ", " in left else "")


@app.command("list")
def list_engines(
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Engine cache (default: the one `vcam run` uses)."),
) -> None:
    """The compiled engines in the cache, and whether this machine can use them."""
    from vcam.engines.artifacts import entries, here, key_batch
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
        batch = key_batch(e.key)
        if e.superseded:
            state = "[yellow]superseded (an older build; the next build removes it)[/]"
        elif (e.key.gpu, e.key.library.split(",")[0]) in current:
            state = "usable here"
        else:
            state = "[yellow]other GPU or torch[/]"
        table.add_row(e.path.name, batch, e.key.precision, e.key.gpu, e.key.library, f"{e.size / 1e6:.1f}", state)
    if found:
        out.print(table)
    out.print(f"{len(found)} compiled engines in {resolve_cache_dir(cache_dir) / 'compiled'}")
