"""Benchmarks (not imported by the runtime modules): ``vcam bench`` (:mod:`.pipeline`, the pipeline
against a naive loop on synthetic frames), ``python -m benchmarks.demo`` (:mod:`.demo`, the real
daemon on the demo clip), ``python -m benchmarks.detect`` (:mod:`.detect`, small and new faces
and what finding them costs), ``python -m benchmarks.streams`` (:mod:`.streams`, several streams
in one daemon against one process each), ``python -m benchmarks.upscale`` (:mod:`.upscale`, the
frame enhancer), ``python -m benchmarks.predict`` (:mod:`.predict`, swapping with predicted faces:
time and accuracy), ``python -m benchmarks.startup`` (:mod:`.startup`, start-up time) and
``python -m benchmarks.control`` (:mod:`.control`, control clients against a running daemon) and
``python -m benchmarks.panel`` (:mod:`.panel`, what the control panel costs the frame loop)."""

from __future__ import annotations

import json
import platform
import time
from typing import Any


def write_report(path: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with the machine and the date, written to ``path`` as JSON; returned."""
    payload = {**payload, "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2)
    return payload
