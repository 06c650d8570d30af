"""``vcam bench``: the pipeline against the naive loop (see :mod:`vcam.runtime.bench`)."""

from __future__ import annotations

import typer

from vcam.cli.common import app, fail, out
from vcam.errors import VcamError


@app.command("bench")
def bench(
    device: str = typer.Option("cuda", "--device", help="cuda (CUDA ops, torch engines) or cpu (NumPy ops, classic swap)."),
    faces: str = typer.Option("1,4,8", "--faces", help="Comma list of face counts."),
    size: str = typer.Option("720p,1080p,4k", "--size", help="Comma list of 720p, 1080p, 4k."),
    frames: int = typer.Option(200, "--frames", help="Timed frames per configuration."),
    json_out: str = typer.Option("", "--json", help="Write the results as JSON to this path."),
    naive: bool = typer.Option(True, "--naive/--no-naive", help="Also time the naive loop."),
    compile: str = typer.Option(
        "auto",
        "--compile",
        help="Compiled swapper: auto or load (the sizes built so far; a bench never builds in the background) | build | off.",
    ),
    model: str = typer.Option("", "--model", help="An inswapper ONNX file (default: the full-size stand-in, built once)."),
    predict: bool = typer.Option(
        True,
        "--predict/--no-predict",
        help="CUDA: swap with the tracks while each frame's detection runs, as `vcam run` does (\\[track] predict).",
    ),
) -> None:
    """Time the pipeline on synthetic frames against the naive loop; prints a table, writes JSON."""
    from vcam.runtime.bench import run, table

    try:
        res = run(
            device=device,
            faces=[int(x) for x in faces.split(",") if x],
            sizes=[s.strip() for s in size.split(",") if s.strip()],
            frames=frames,
            json_path=json_out or None,
            naive=naive,
            console=out,
            compile=compile,
            model=model or None,
            predict=predict,
        )
    except VcamError as err:
        fail(err)
    out.print(table(res))
