"""Benchmarks (not imported by the runtime modules): ``vcam bench`` (:mod:`.pipeline`, the pipeline
against a naive loop on synthetic frames) and ``python -m vcam.bench.demo`` (:mod:`.demo`, the real
daemon on the demo clip) and ``python -m vcam.bench.detect`` (:mod:`.detect`, small and new faces
and what finding them costs)."""

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
