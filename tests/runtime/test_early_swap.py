"""The early swap (vcam.runtime.early_swap): early frames swapped on the CPU while the full
assembly loads, then the switch between two frames. Here both assemblies run on the CPU (the
daemon's ``early_swap=True``), the second one slowed by the daemon's ``load_delay``."""

import logging
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import test_daemon
from test_daemon import Capturing, demo_cfg

from vcam import config_file as vconfig
from vcam.config import Duration
from vcam.platform.cpu import usable_cores
from vcam.runtime.daemon import Daemon
from vcam.runtime.early_swap import cpu_config, cpu_threads, qualifies
from vcam.types import PixelFormat

#: The tiny inswapper and recogniser stand-ins (their folder's vcam.toml): test_daemon's fixture.
tiny_models = test_daemon.tiny_models


def _cfg(**pipeline):
    cfg = demo_cfg(pacing="realtime")
    return cfg.replace(pipeline=replace(cfg.pipeline, **pipeline)) if pipeline else cfg


def test_the_cpu_start_applies_to_a_gpu_run_whose_models_all_run_on_onnxruntime():
    gpu = _cfg(device="cuda", fp16=True, backend="auto")
    cpu = cpu_config(Daemon(gpu, control=False))
    assert cpu is not None and (cpu.pipeline.device, cpu.pipeline.backend, cpu.pipeline.fp16) == ("cpu", "onnxruntime", False)
    assert cpu.swap == gpu.swap and cpu.detect == gpu.detect and cpu.mask == gpu.mask  # the same swap, only elsewhere
    # a CPU run is on the CPU already (unless asked: tests), and the other early-frame modes keep theirs
    assert cpu_config(Daemon(_cfg(device="cpu"), control=False)) is None
    assert cpu_config(Daemon(_cfg(device="cpu"), control=False, early_swap=True)) is not None
    assert cpu_config(Daemon(gpu, control=False, early_swap=False)) is None
    for mode in ("pixelate", "camera", "off"):
        assert cpu_config(Daemon(_cfg(device="cuda", early_frames=mode), control=False)) is None
    # a swap network and the recogniser run on onnxruntime's CPU engine too (on half the cores)
    assert qualifies(gpu) and cpu_threads(gpu) == 0
    neural = gpu.replace(swap=replace(gpu.swap, swapper="inswapper_128"))
    unbudgeted = neural.replace(pipeline=replace(neural.pipeline, max_latency=Duration(0)))
    for cfg in (unbudgeted, gpu.replace(swap=replace(gpu.swap, map=["a=b"]))):
        assert qualifies(cfg) and cpu_config(Daemon(cfg, control=False)) is not None
    assert cpu_threads(neural) == max(1, usable_cores() // 2)  # the cores this process may use
    # anything that needs another model, or a role on a backend other than onnxruntime, keeps the early frames pixelated
    others = [
        gpu.replace(swap=replace(gpu.swap, enhancer="gfpgan_1.4")),
        gpu.replace(mask=replace(gpu.mask, types=["box", "occlusion"])),
        gpu.replace(pipeline=replace(gpu.pipeline, backend="torch")),
        vconfig.build(
            {"pipeline": {"device": "cuda"}, "swap": {"swapper": "inswapper_128"}, "engines": {"swapper": {"backend": "torch"}}}
        ),
    ]
    for other in others:
        assert not qualifies(other)
        assert cpu_config(Daemon(other, control=False)) is None


def test_a_swap_network_under_a_budget_the_cpu_cannot_keep_starts_the_gpu_load_at_once(caplog):
    """The inswapper on the CPU (about 0.3 s a face) under a 33 ms budget: no CPU assembly (its
    frames would all go out pixelated while it takes the GIL and cores from the GPU's load); with no
    budget or one of at least NETWORK_CPU_FACE_S it swaps early; the classic swap under any budget."""
    from vcam.runtime.early_swap import NETWORK_CPU_FACE_S, describe_start, keeps_budget

    gpu = _cfg(device="cuda", backend="auto")
    neural = gpu.replace(swap=replace(gpu.swap, swapper="inswapper_128"))

    def budget(cfg, seconds):
        return cfg.replace(pipeline=replace(cfg.pipeline, max_latency=Duration(seconds)))

    with caplog.at_level(logging.INFO, logger="vcam.runtime.early_swap"):
        assert cpu_config(Daemon(budget(neural, 0.033), control=False)) is None
    assert "pixelated" in caplog.text and "33 ms" in caplog.text
    assert "pixelated" in describe_start(budget(neural, 0.033), "cuda")
    for seconds in (0.0, NETWORK_CPU_FACE_S, 1.0):
        assert cpu_config(Daemon(budget(neural, seconds), control=False)) is not None, seconds
    for seconds in (0.0, 0.01, 0.033):
        assert cpu_config(Daemon(budget(gpu, seconds), control=False)) is not None, seconds
        assert keeps_budget(budget(gpu, seconds), [seconds])
    # tests and measurements still force it (early_swap=True)
    assert cpu_config(Daemon(budget(neural, 0.033), control=False, early_swap=True)) is not None


def test_check_says_what_the_first_frames_of_a_gpu_run_are():
    from vcam.runtime.early_swap import describe_start

    gpu = _cfg(device="cuda")
    assert "swap their first frames on the CPU" in describe_start(gpu, "cuda")
    assert describe_start(gpu, "cpu") == ""
    assert describe_start(_cfg(device="cuda", early_frames="pixelate"), "cuda") == ""
    enhanced = gpu.replace(swap=replace(gpu.swap, enhancer="gfpgan_1.4"))
    assert "pixelated frames while the GPU loads" in describe_start(enhanced, "cuda")
    assert "needs enhancer" in describe_start(enhanced, "cuda")


class Marks:
    """The frame loop's marks (the daemon's hook): each published frame's seq and the pipeline that made it."""

    def __init__(self):
        self.gathered: list[int] = []
        self.published: list[tuple[int, int]] = []

    def __call__(self, mark):
        if mark.phase == "gathered":
            self.gathered.append(mark.seq)
        elif mark.phase == "published":
            self.published.append((mark.seq, id(mark.stream.pipeline)))


@pytest.mark.slow
def test_frames_are_swapped_on_the_cpu_until_the_switch_between_two_frames(caplog):
    from vcam.stages.demo import DemoClip

    marks = Marks()
    out = Capturing(640, 360, fmt=PixelFormat.BGR)
    daemon = Daemon(_cfg(), output=out, control=False, early_swap=True, load_delay=1.5, hook=marks)
    with caplog.at_level(logging.INFO, logger="vcam.runtime.early_swap"):
        s = daemon.run(max_frames=60)
    # swapped through the CPU assembly first (counted as pipeline frames), then through the other one
    assert 2 <= s.cpu_frames < s.frames_out == 60 == s.frames_in, s  # a busy machine swaps a few fps on the CPU
    assert s.first_processed_s is not None and s.first_frame_s is not None
    assert f"{s.cpu_frames} swapped on the CPU while the GPU loaded" in s.line()
    lines = [r.getMessage() for r in caplog.records if "switched to" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"switched to cpu after {s.cpu_frames} frames swapped on the CPU"), lines
    # one output throughout: every frame in order, none lost between gathered and published, none twice
    assert len(out.frames_seen) == s.early_frames + s.frames_out
    assert all(f.shape == (360, 640, 3) for f in out.frames_seen)
    seqs = [seq for seq, _ in marks.published]
    gathered = marks.gathered[marks.gathered.index(seqs[0]) :]  # those before: the early frames' (pixelated)
    assert seqs == sorted(set(seqs)) and seqs == gathered, "a frame lost or published twice"
    pipes = [p for _, p in marks.published]
    assert pipes[: s.cpu_frames] == [pipes[0]] * s.cpu_frames
    assert pipes[s.cpu_frames :] == [pipes[-1]] * (60 - s.cpu_frames) and pipes[0] != pipes[-1], "not one switch"
    # swapped on both sides of the switch: the face differs from the camera's
    clip = DemoClip(width=640, height=360, fps=30)
    for i in (0, s.cpu_frames - 1, s.cpu_frames, 59):
        got, raw = out.frames_seen[s.early_frames + i], clip.frame(seqs[i])
        changed = (np.abs(got.astype(int) - raw).max(axis=2) > 10).mean()  # a face's worth of pixels
        assert got.shape == raw.shape and changed > 0.003, f"frame {i} not swapped ({changed:.4f} of it changed)"
    assert not daemon.load_in_flight


@pytest.mark.slow
def test_a_swap_network_swaps_on_the_cpu_while_the_full_load_runs_and_keeps_its_faces(tiny_models, caplog):
    """The inswapper on onnxruntime's CPU engine while the full assembly loads, then the switch:
    every frame swapped, in order, once; the faces the CPU assembly loaded (their latents) are
    the ones swapped after the switch, not loaded again."""
    from vcam.stages.demo import DemoClip

    cfg = _cfg()
    cfg = cfg.replace(models=replace(cfg.models, dir=str(tiny_models.parent)), swap=replace(cfg.swap, swapper="inswapper_128"))
    marks = Marks()
    out = Capturing(640, 360, fmt=PixelFormat.BGR)
    daemon = Daemon(cfg, output=out, control=False, early_swap=True, load_delay=1.0, hook=marks)
    with caplog.at_level(logging.INFO):
        s = daemon.run(max_frames=150)  # 5 s of a 30 fps camera
    assert 1 <= s.cpu_frames < s.frames_out == 150, s
    assert len([r for r in caplog.records if "switched to cpu after" in r.getMessage()]) == 1
    faces_s = [
        float(r.getMessage().split("faces ")[1].split(" s")[0])
        for r in caplog.records
        if r.getMessage().startswith("start-up: models")
    ]
    assert len(faces_s) == 2 and faces_s[1] < 0.01, faces_s  # the full load took the CPU assembly's faces
    seqs = [seq for seq, _ in marks.published]
    gathered = marks.gathered[marks.gathered.index(seqs[0]) :]
    assert seqs == sorted(set(seqs)) and seqs == gathered, "a frame lost or published twice"
    assert len({p for _, p in marks.published}) == 2
    clip = DemoClip(width=640, height=360, fps=30)
    for i in (0, s.cpu_frames - 1, s.cpu_frames, 149):
        got, raw = out.frames_seen[s.early_frames + i], clip.frame(seqs[i])
        changed = (np.abs(got.astype(int) - raw).max(axis=2) > 10).mean()
        assert changed > 0.003, f"frame {i} not swapped ({changed:.4f} of it changed)"


@pytest.mark.slow
def test_a_stop_while_the_gpu_loads_ends_on_the_cpu_frames_without_waiting():
    out = Capturing(640, 360)
    statuses = []
    cfg = _cfg()
    cfg = cfg.replace(status=replace(cfg.status, interval=Duration(0.1)))
    daemon = Daemon(cfg, output=out, control=False, early_swap=True, load_delay=5.0, on_status=lambda st, *_: statuses.append(st))
    daemon.start()
    deadline = time.monotonic() + 30.0
    # Three frames swapped on the CPU and a status line said so (a busy machine may swap three
    # before the first status tick).
    while (daemon.summary.frames_out < 3 or not statuses) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert daemon.summary.frames_out >= 3, "no frame swapped on the CPU"
    assert statuses, "no status line while swapping on the CPU"
    t0 = time.perf_counter()
    daemon.stop(timeout=3.0)
    assert time.perf_counter() - t0 < 1.5, "the stop waited for the models"
    s = daemon.summary
    assert not daemon._thread.is_alive() and s.error is None and s.cpu_frames == s.frames_out >= 3
    assert s.device == "cpu" and len(out.frames_seen) == s.early_frames + s.frames_out
    assert "swapping on the CPU while the GPU loads" in statuses[-1].engines, statuses[-1]
    # the full load goes on in the background, and the daemon says so (the CLI then ends with os._exit)
    assert daemon.load_in_flight
    daemon.loading.join(30)
    assert not daemon.load_in_flight


def _fail_build(monkeypatch, which: str):
    """``assemble.build`` fails for the ``cpu`` assembly of an early swap or the ``full`` one."""
    from vcam.errors import ModelError
    from vcam.runtime import assemble

    build = assemble.build

    def failing(cfg, **kw):
        if (cfg.pipeline.backend == "onnxruntime") == (which == "cpu"):
            raise ModelError(f"the {which} load is broken", hint="none")
        return build(cfg, **kw)

    monkeypatch.setattr(assemble, "build", failing)


@pytest.mark.slow
def test_a_full_load_that_fails_stops_the_cpu_frames_with_its_error(monkeypatch):
    from vcam.errors import ModelError

    _fail_build(monkeypatch, "full")
    out = Capturing(640, 360)
    daemon = Daemon(_cfg(), output=out, control=False, early_swap=True, load_delay=0.5)
    with pytest.raises(ModelError, match="full load is broken"):
        daemon.run(max_frames=1000)
    assert daemon.summary.frames_out >= 1 and not daemon.load_in_flight


@pytest.mark.slow
def test_without_the_cpu_assembly_the_early_frames_stay_pixelated(monkeypatch, caplog):
    _fail_build(monkeypatch, "cpu")
    out = Capturing(640, 360)
    daemon = Daemon(_cfg(), output=out, control=False, early_swap=True, load_delay=0.5)
    with caplog.at_level(logging.WARNING):
        s = daemon.run(max_frames=5)
    assert "no swap on the CPU while the models load (the cpu load is broken): the early frames are pixelated" in caplog.text
    assert s.early_frames >= 5 and s.frames_out == 5 and s.cpu_frames == 0, s


@pytest.mark.slow
def test_the_cpu_assembly_imports_neither_torch_nor_cupy():
    """What makes it fast on a GPU machine: its start needs none of the GPU libraries."""
    code = """
import sys
sys.path[:0] = ["tests", "tests/runtime"]
from dataclasses import replace
from test_daemon import demo_cfg
from vcam.runtime import early_swap, startup
from vcam import config_file as vconfig
from vcam.config import Duration
from vcam.runtime.daemon import Daemon
from vcam.stages import capture
from vcam.stages.outputs import NullOutput
cfg = demo_cfg(pacing="realtime")
d = Daemon(cfg.replace(pipeline=replace(cfg.pipeline, device="cuda")), control=False)
st = d.streams[0]
st.delivery = capture.plan_delivery(st.cfg.capture, "null", None)
st.source = capture.open_source(st.cfg.capture, delivery=st.delivery)
st.output = NullOutput(640, 360, 30.0)
loaded = startup.prepare(d, early_swap.cpu_config(d), hold=False)
print(loaded.assembly.device, sorted(m for m in ("torch", "cupy") if m in sys.modules))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "cpu []", r.stdout


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("swapper", ["classic", "inswapper_128"])
def test_a_gpu_run_starts_on_the_cpu_and_switches_to_cuda(device, swapper, tiny_models, caplog):
    """The real thing on a GPU: the default config (``early_frames = "swap"``), the CPU's frames first,
    then the CUDA assembly, every frame swapped and published once, through NV12 -> I420 as a camera;
    the model-free swap, and a swap network (onnxruntime's CPU engine, then PyTorch on CUDA)."""
    if device != "cuda":
        pytest.skip("the early swap starts GPU runs only (the CPU one is tested above with two CPU assemblies)")
    marks = Marks()
    out = Capturing(640, 360)
    cfg = _cfg(device="cuda")
    if swapper != "classic":
        cfg = cfg.replace(models=replace(cfg.models, dir=str(tiny_models.parent)), swap=replace(cfg.swap, swapper=swapper))
    daemon = Daemon(cfg, output=out, control=False, hook=marks)
    with caplog.at_level(logging.INFO, logger="vcam.runtime.early_swap"):
        daemon.start()
        deadline = time.monotonic() + 120
        while daemon.summary.switched_s is None and time.monotonic() < deadline and daemon._thread.is_alive():
            time.sleep(0.05)
        switched = daemon.summary.frames_out
        while daemon.summary.frames_out < switched + 30 and time.monotonic() < deadline and daemon._thread.is_alive():
            time.sleep(0.05)
        daemon.stop(timeout=30)
    s = daemon.summary
    assert s.error is None, s.error
    assert s.device == "cuda" and s.switched_s is not None and 0 < s.cpu_frames < s.frames_out, s.line()
    assert "switched to cuda after" in caplog.text
    seqs = [seq for seq, _ in marks.published]
    gathered = marks.gathered[marks.gathered.index(seqs[0]) :]
    assert seqs == sorted(set(seqs)) and seqs == gathered, "a frame lost or published twice"
    assert len(out.frames_seen) == s.early_frames + s.frames_out and s.dropped_latency == 0
    assert len({p for _, p in marks.published}) == 2


@pytest.mark.slow
def test_a_face_photo_without_a_face_stops_the_early_swap_with_one_error(tmp_path, caplog):
    """The CPU assembly's own faces fail as the full load's would: that error, not a fallback warning."""
    import cv2

    from vcam.errors import FaceError

    photo = tmp_path / "wall.png"
    yy, xx = np.mgrid[0:200, 0:200]
    cv2.imwrite(str(photo), np.dstack([xx, yy, xx // 2 + yy // 2]).astype(np.uint8))
    cfg = _cfg()
    cfg = cfg.replace(swap=replace(cfg.swap, source=str(photo)))
    daemon = Daemon(cfg, output=Capturing(640, 360), control=False, early_swap=True)
    with caplog.at_level(logging.WARNING), pytest.raises(FaceError, match="no face found"):
        daemon.run(max_frames=5)
    assert "no swap on the CPU" not in caplog.text and daemon.summary.frames_out == 0


@pytest.mark.slow
def test_the_full_assemblys_held_work_begins_at_its_first_frame_after_the_switch(monkeypatch):
    """The work the full load holds back for its first frame (the engines' background graph
    captures: on a GPU every size of the swapper's, issue 39) is let go when the first frame went
    out through it, after the switch: not before it, nor only at the gate's patience or the run's
    end (frames had gone out through the CPU assembly already)."""
    from vcam.engines import gate

    released: list[float] = []

    class Recording(gate.BackgroundGate):
        def hold(self):
            release = super().hold()

            def recorded():
                released.append(time.perf_counter())
                release()

            return recorded

    monkeypatch.setattr(gate, "BACKGROUND", Recording(patience=120))
    published: list[tuple[float, int]] = []

    def hook(mark):
        if mark.phase == "published":
            published.append((mark.t, id(mark.stream.pipeline)))

    out = Capturing(640, 360, fmt=PixelFormat.BGR)
    daemon = Daemon(_cfg(), output=out, control=False, early_swap=True, load_delay=1.5, hook=hook)
    s = daemon.run(max_frames=240)  # long past the load's 1.5 s, also on a busy machine
    assert 1 <= s.cpu_frames < s.frames_out, s
    full = published[-1][1]
    last_cpu = max(t for t, p in published if p != full)
    first_full = min(t for t, p in published if p == full)
    assert released, "the held work was never let go"
    assert last_cpu < released[0] <= first_full, (last_cpu, released[0], first_full)


@pytest.mark.slow
def test_nothing_keeps_the_cpu_assembly_after_the_switch(tiny_models):
    """After the switch the CPU assembly (here a swap network's onnxruntime sessions) is freed at
    once, without a garbage collection (the start-up froze what its load left): the faces' loaders
    moved to the full assembly (assemble.rebind_faces). Before, the bank watcher's loader kept it,
    and its sessions, for the whole run."""
    import threading
    import weakref

    from vcam.runtime import early_swap

    cfg = _cfg()
    cfg = cfg.replace(models=replace(cfg.models, dir=str(tiny_models.parent)), swap=replace(cfg.swap, swapper="inswapper_128"))
    kept: dict = {}
    switched = threading.Event()
    real = early_swap.EarlySwap.switch

    def switch(self):
        kept["cpu"] = weakref.ref(self.cpu.assembly)
        kept["swapper"] = weakref.ref(self.cpu.assembly.swapper)
        kept["full"] = self.full.assembly
        done = real(self)
        switched.set()
        return done

    seen: list[bool] = []

    def watch():
        if switched.wait(30):
            time.sleep(0.5)  # the run goes on, no collection asked for
            seen.append(kept["cpu"]() is None and kept["swapper"]() is None)

    daemon = Daemon(cfg, output=Capturing(640, 360), control=False, early_swap=True, load_delay=1.0)
    watcher = threading.Thread(target=watch)
    watcher.start()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(early_swap.EarlySwap, "switch", switch)
        s = daemon.run(duration=3.0)
    watcher.join()
    assert s.cpu_frames > 0 and s.switched_s is not None, s.line()
    assert seen == [True], "the CPU assembly was still alive half a second after the switch"


def test_rebinding_the_faces_moves_the_bank_and_target_loaders_to_the_new_models(monkeypatch, tmp_path):
    """assemble.rebind_faces: the bank watcher loads with the new assembly's recogniser and swapper,
    and with ``[swap] map`` each state's target loader uses its recogniser and photo detector."""
    from types import SimpleNamespace

    from vcam.runtime import assemble
    from vcam.stages import mapping
    from vcam.stages.faces import BankWatcher
    from vcam.state import RuntimeState

    calls: list[tuple] = []

    class Bank:
        def load(self, name, *, recogniser, swappers):
            calls.append(("bank", name, recogniser, tuple(swappers)))
            return name

        def stamp(self, name):
            return None

    monkeypatch.setattr(mapping, "load_target", lambda arg, **kw: calls.append(("target", arg, kw["detector"], kw["recogniser"])))
    old = SimpleNamespace(recogniser="old rec", swapper="old swap", photo_detector="old det")
    watcher = BankWatcher(Bank(), RuntimeState(), assemble.bank_loader(Bank(), old))
    new_cfg = SimpleNamespace(swap=SimpleNamespace(map=[{"target": "a", "source": "b"}]), faces_dir=str(tmp_path))
    new = SimpleNamespace(cfg=new_cfg, recogniser="new rec", swapper="new swap", photo_detector="new det")
    states = [RuntimeState(), RuntimeState()]
    assemble.rebind_faces(new, watcher, states)
    watcher.load("grace")
    for st in states:
        st._target_loader("photo.jpg")
    assert calls == [("bank", "grace", "new rec", ("new swap",))] + [("target", "photo.jpg", "new det", "new rec")] * 2
    calls.clear()
    assemble.rebind_faces(
        SimpleNamespace(cfg=SimpleNamespace(swap=SimpleNamespace(map=[])), recogniser="r", swapper="s"), None, states
    )
    states[0]._target_loader("photo.jpg")  # no map: the target loader stays as it was
    assert calls == [("target", "photo.jpg", "new det", "new rec")]
