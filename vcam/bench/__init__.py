"""Benchmarks (not imported by the runtime modules): ``vcam bench`` (:mod:`.pipeline`, the pipeline
against a naive loop on synthetic frames) and ``python -m vcam.bench.demo`` (:mod:`.demo`, the real
daemon on the demo clip)."""
