"""A camera's frame never waits for a detection (issue 28): the daemon's pipelines are not
``patient``. A frame whose predecessor's detection is still running is swapped with the tracks as
they are, and that detection is applied once the frame is published (``launch_detection``) or
while the daemon waits (``settle``); a patient pipeline (file conversion, ``process``) waits as
before. On every device (the ``ops`` fixture: NumPy always, CUDA where present)."""

import time

import numpy as np
import pytest

from vcam.config import Config
from vcam.pipeline.pipeline import Pipeline
from vcam.stages.demo import DemoClip, portrait
from vcam.stages.detect import RetinaFaceDetector
from vcam.stages.faces import face_from_image
from vcam.stages.swap import ClassicSwapper
from vcam.stages.track import Tracker
from vcam.state import RuntimeState
from vcam.types import Frame, PixelFormat


@pytest.fixture(scope="module")
def detector(ops):
    return RetinaFaceDetector(Config().detect, roi_size=Config().track.roi_size, ops=ops, device=ops.device)


@pytest.fixture(scope="module")
def snap():
    face = face_from_image(
        portrait("astronaut"), "astronaut", swappers=[ClassicSwapper()], detector=RetinaFaceDetector(Config().detect)
    )
    st = RuntimeState()
    st.add_face(face, activate=True)
    return st.snapshot()


class _Late:
    """A tracker step whose detection has not arrived until the test says so."""

    def __init__(self, inner):
        self.inner, self.arrived = inner, False

    def ready(self):
        return self.arrived and self.inner.ready()


class LateDetections:
    """The real tracker, whose deferred detections stay 'running' (not ready) until released: what
    a detection still on the GPU looks like to the pipeline. Records in which phase of the loop the
    pipeline applied (and so waited for) one that had not arrived."""

    def __init__(self, inner):
        self.inner, self.phase, self.waited, self.steps = inner, "", [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def launch(self, frame, seq, t=None, *, deferred=False):
        step = _Late(self.inner.launch(frame, seq, t, deferred=deferred))
        self.steps.append(step)
        return step

    def complete(self, step):
        if not step.arrived:
            self.waited.append(self.phase)
        return self.inner.complete(step.inner)


def _pipeline(detector, patient):
    cfg = Config()
    tracker = LateDetections(Tracker(detector, cfg.track, max_faces=cfg.pipeline.max_faces))
    swapper = ClassicSwapper(ops=detector.ops)
    return Pipeline(ops=detector.ops, tracker=tracker, swapper=swapper, max_faces=8, predict=True, patient=patient)


def _frames(n):
    clip = DemoClip(width=640, height=360, fps=30.0, seconds=n / 30.0)
    for i in range(n):
        img = clip.frame(i)
        yield Frame(img, 640, 360, PixelFormat.BGR, 0.0, i)


def test_a_camera_frame_never_waits_for_the_detection_before_it(detector, snap):
    """Every detection still running when the next frame starts: the patient pipeline waits for it
    before that frame's swap; the daemon's never does: on CUDA it applies it after the frame was
    published (the loop's ``launch_detection``), on the CPU (which runs the next detection before
    the paste-back) after the swap. Every frame is still predicted and swapped, every detection
    applied in order."""
    runs = {}
    for patient in (True, False):
        pipe = _pipeline(detector, patient)
        tracker = pipe.tracker
        swapped = 0
        for f in _frames(16):
            tracker.phase = "before the swap"
            work = pipe.begin(f, snap)
            tracker.phase = "after the swap"
            crops, mask = pipe.swapper.swap_batch([(work.img, work.mats)], work.sources) if work.n else (None, None)
            out, stats = pipe.collect(pipe.finish(work, crops, mask, detect_now=False))
            swapped += stats.swapped
            tracker.phase = "after publish"
            pipe.launch_detection()
        runs[patient] = (set(tracker.waited), pipe.predicted, swapped, len(tracker.steps), tracker.frames)
    assert runs[True][0] == {"before the swap"}
    waited, predicted, swapped, launched, applied = runs[False]
    assert waited == ({"after publish"} if detector.ops.concurrent else {"after the swap"}), waited
    assert predicted == runs[True][1] >= 14 and swapped >= 15
    assert applied == launched  # the first frame's own detection, and every deferred one but the last


def test_with_the_detections_in_time_both_swap_alike(detector, snap):
    """Where each detection arrives before the next frame (the daemon settles it while it waits),
    the daemon's pipeline swaps exactly as the patient one."""
    outs = {}
    for patient in (True, False):
        pipe = _pipeline(detector, patient)
        got = []
        for f in _frames(12):
            got.append(pipe.collect(pipe.submit(f, snap, detect_now=False))[0].copy())
            pipe.launch_detection()
            for step in pipe.tracker.steps:
                step.arrived = True
            deadline = time.monotonic() + 5.0
            while not pipe.settle():
                assert time.monotonic() < deadline, "the detection never arrived"
                time.sleep(0.0005)
        outs[patient] = (got, pipe.predicted)
    assert outs[True][1] == outs[False][1] >= 10
    for i, (a, b) in enumerate(zip(outs[True][0], outs[False][0])):
        assert np.array_equal(a, b), f"frame {i} differs"


@pytest.mark.slow
def test_hostpath_bench_runs_and_reports(tmp_path, ops):
    """`python -m benchmarks.hostpath` on the CPU, small: the daemon's path waits for fewer
    detections and spends less CPU before the swap at p99 than the patient one; JSON written."""
    if ops.device != "cpu":
        pytest.skip("a CPU benchmark")
    import json

    from benchmarks import hostpath

    out = tmp_path / "h.json"
    hostpath.main(
        ["--faces", "2", "--size", "640x360", "--frames", "24", "--miss-every", "8", "--rounds", "1", "--json", str(out)]
    )
    med = json.loads(out.read_text())["median"]
    assert med["daemon"]["frames_waited"] < med["patient"]["frames_waited"]
    assert med["daemon"]["begin_cpu_p99_ms"] < med["patient"]["begin_cpu_p99_ms"]
    assert med["daemon"]["faces_swapped"] >= med["patient"]["faces_swapped"] - 2
