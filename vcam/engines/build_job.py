"""One build job of :mod:`vcam.engines.autobuild`, run as ``python -m vcam.engines.build_job SPEC``
(SPEC: JSON, see :class:`~vcam.engines.autobuild.BackgroundBuild`): the engine's module made from
its ONNX file as the engine makes it, then :meth:`CompiledLoader.build
<vcam.engines.compiled.CompiledLoader.build>` for the job's sizes, one after the other, with a
progress file the parent reads."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vcam.engines.autobuild import progress_path
from vcam.engines.compiled import torch_engine


class _Progress:
    """A job's progress file, rewritten (atomically) after each step."""

    def __init__(self, path: Path, sizes: list[int], guess_s: float) -> None:
        self.path = path
        self.state: dict[str, Any] = {
            "pid": os.getpid(),
            "sizes": sizes,
            "done": [],
            "failed": {},
            "current": {},
            "waiting": [],
            "durations": [],
            "guess_s": guess_s,
        }
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.state))
        os.replace(tmp, self.path)

    def __call__(self, event: str, b: int, detail: Any = None) -> None:
        s = self.state
        if event == "start":
            s["current"] = {str(b): time.time()}
            s["waiting"] = [x for x in s["waiting"] if x != b]
        elif event == "wait":
            s["waiting"].append(b)
        else:
            s["current"].pop(str(b), None)
            s["waiting"] = [x for x in s["waiting"] if x != b]
            if event == "failed":
                s["failed"][str(b)] = str(detail)
            else:
                s["done"].append(b)
                if event == "built" and detail:
                    s["durations"].append(float(detail))
        self.write()


def job(spec: dict[str, Any]) -> int:
    """One build job (the child process): returns its exit status (0: no size failed)."""
    if spec.get("nice") and hasattr(os, "nice"):
        os.nice(int(spec["nice"]))
    if spec.get("compile_threads"):
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(spec["compile_threads"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s: %(message)s")
    engine = torch_engine(
        spec["model"],
        device=spec["device"],
        fp16=bool(spec["fp16"]),
        max_batch=int(spec["max_batch"]),
        channels_last=spec.get("channels_last"),
        cache_dir=spec.get("cache_dir"),
        compile="load",
        warmup=False,
    )
    try:
        loader = engine.loader
        assert loader is not None
        items = {k: tuple(v) for k, v in spec["items"].items()}
        sizes = [int(b) for b in spec["sizes"]]
        path = progress_path(spec.get("cache_dir"), engine.architecture or engine.name, engine.precision, os.getpid())
        progress = _Progress(path, sizes, float(spec.get("guess_s", 90.0)))
        done = loader.build(
            sizes,
            items,
            progress,
            keep_going=True,
            wait_locked=bool(spec.get("wait_locked")),
            retry_failed=bool(spec.get("retry_failed")),
        )
    finally:
        engine.close()
    return 1 if any(state == "failed" for _, state, _ in done) else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m vcam.engines.build_job SPEC_JSON", file=sys.stderr)
        return 2
    return job(json.loads(args[0]))


if __name__ == "__main__":
    sys.exit(main())
