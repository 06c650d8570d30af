"""The roles table and the stage parameters it fills from the config."""

from __future__ import annotations

import dataclasses

import pytest

from vcam.config import Config
from vcam.runtime.roles import stage_params
from vcam.stages.detections import DetectParams
from vcam.stages.track import TrackParams


@pytest.mark.parametrize(("kind", "section"), [(DetectParams, "detect"), (TrackParams, "track")])
def test_a_stage_keeps_the_defaults_its_config_section_documents(kind, section):
    # Both declare the defaults: the stage for callers without a config, the section for config.toml.
    documented = getattr(Config(), section)
    stage = kind()
    for f in dataclasses.fields(kind):
        assert getattr(stage, f.name) == getattr(documented, f.name), f"{kind.__name__}.{f.name}"


def test_stage_params_copy_every_field_from_the_section():
    cfg = Config()
    cfg = cfg.replace(
        detect=dataclasses.replace(cfg.detect, score=0.71, small_face=55), track=dataclasses.replace(cfg.track, rolling=9)
    )
    assert stage_params(DetectParams, cfg.detect) == DetectParams(score=0.71, small_face=55)
    assert stage_params(TrackParams, cfg.track) == TrackParams(rolling=9)


def test_the_search_runs_beside_the_frame_on_a_cpu_with_two_cores(monkeypatch):
    """``[track] search``: auto puts the rolling search in a worker with its own one-thread detector
    on a CPU with two cores or more, one of them idle at start; never on a GPU, nor with the search off or asked in the frame."""
    import os

    from vcam.platform import cpu, process
    from vcam.runtime.assemble import search_worker

    cfg = Config()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # raising=False: Windows has neither
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(process, "age", lambda: 0.5)
    monkeypatch.setattr(cpu, "sample", lambda: cpu.Sample(at=0.0, busy=0.0, own=0.0, cores=2))
    monkeypatch.setattr(cpu, "others_busy", lambda since, now: 0.3)  # other programs left a core and more idle
    worker = search_worker(cfg, "cpu")
    assert worker is not None and worker.max_lag == 2
    assert worker.detector.engine.session.get_session_options().intra_op_num_threads == 1
    assert search_worker(cfg, "cuda") is None
    assert search_worker(cfg.replace(track=dataclasses.replace(cfg.track, search="frame")), "cpu") is None
    assert search_worker(cfg.replace(track=dataclasses.replace(cfg.track, rolling=0)), "cpu") is None
    monkeypatch.setattr(cpu, "others_busy", lambda since, now: 1.7)  # other programs hold both cores
    assert search_worker(cfg, "cpu") is None
    monkeypatch.setattr(cpu, "others_busy", lambda since, now: 0.3)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert search_worker(cfg, "cpu") is None
    assert search_worker(cfg.replace(track=dataclasses.replace(cfg.track, search="worker")), "cpu") is not None


def test_the_search_judges_other_programs_by_the_cpu_since_the_start_not_by_a_lagging_load(monkeypatch):
    """Right after a heavy program ends the 1-minute load average still says "busy" while every core
    is idle: ``auto`` goes by what other programs did since vcam started (the system's CPU times less
    this process's own), and by the load average only where those cannot say (no such times, or a
    start over a minute ago)."""
    import os

    from vcam.platform import cpu, process
    from vcam.runtime.assemble import BUSY_WINDOW_MAX_S, search_worker

    cfg = Config()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 2.0, 1.0), raising=False)  # the heavy program just ended
    monkeypatch.setattr(process, "age", lambda: 0.8)
    monkeypatch.setattr(process, "cpu_at_start", lambda: cpu.Sample(at=10.0, busy=100.0, own=0.5, cores=2))
    monkeypatch.setattr(cpu, "sample", lambda: cpu.Sample(at=10.8, busy=100.9, own=1.2, cores=2))  # 0.2 s of others
    assert search_worker(cfg, "cpu") is not None
    monkeypatch.setattr(cpu, "sample", lambda: cpu.Sample(at=10.8, busy=102.2, own=1.2, cores=2))  # 1.9 cores of others
    assert search_worker(cfg, "cpu") is None
    monkeypatch.setattr(cpu, "sample", lambda: None)  # unreadable: the load average decides
    assert search_worker(cfg, "cpu") is None
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.5, 0.5), raising=False)
    assert search_worker(cfg, "cpu") is not None
    monkeypatch.setattr(cpu, "sample", lambda: cpu.Sample(at=10.8, busy=102.2, own=1.2, cores=2))
    monkeypatch.setattr(process, "age", lambda: BUSY_WINDOW_MAX_S + 1)  # a stale start: the load average again
    assert search_worker(cfg, "cpu") is not None


@pytest.mark.parametrize("cores, threads", [(2, 1), (1, 1), (8, None)])
def test_a_cpu_pipeline_on_two_cores_calls_opencv_on_its_own_thread(monkeypatch, cores, threads):
    """OpenCV's pool costs a 2-core machine more than it gives (the 720p demo: +7 % frames with the
    pool off beside the search worker): a CPU assembly there sets OpenCV to one thread; a larger
    machine keeps OpenCV's own choice."""
    import os

    import cv2

    from vcam.runtime import assemble

    before = cv2.getNumThreads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    try:
        cv2.setNumThreads(3)
        assemble.build(Config().replace(pipeline=dataclasses.replace(Config().pipeline, device="cpu")))
        assert cv2.getNumThreads() == (threads or 3)
    finally:
        cv2.setNumThreads(before)


def test_a_model_on_another_device_than_the_pipeline_is_one_error_that_names_it():
    """The assembly refuses a model whose engine runs elsewhere than the pipeline (an ONNX model
    falling back to onnxruntime's CPU build beside a CUDA pipeline), naming the role, the model and
    the fix; models without an engine (the classic swap) and absent ones pass."""
    from types import SimpleNamespace

    from vcam.errors import DeviceError
    from vcam.runtime.assemble import _check_devices

    on = {d: SimpleNamespace(engine=SimpleNamespace(device=d)) for d in ("cpu", "cuda")}
    names = {"detector": "retinaface_mnet025", "swapper": "inswapper_128"}
    _check_devices([("detector", on["cuda"]), ("swapper", object()), ("enhancer", None)], names, "cuda")
    with pytest.raises(DeviceError) as info:
        _check_devices([("detector", on["cuda"]), ("swapper", on["cpu"])], names, "cuda")
    assert str(info.value) == (
        "the swapper inswapper_128 runs on cpu, the pipeline on cuda "
        "(install onnxruntime-gpu or PyTorch with CUDA, or use --device cpu)"
    )
