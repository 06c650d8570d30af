"""The early swap: swapped from the first frame on a GPU run, the CPU swapping while the GPU loads.

One name for the feature everywhere: ``[pipeline] early_frames = "swap"`` (config), this module and
:class:`EarlySwap` (code), ``Daemon(early_swap=...)`` (tests, measurements), "early swap" (docs).

A GPU start spends seconds importing CuPy and PyTorch and building the models before its first
swapped frame; the CPU needs neither: the model-free swap runs on NumPy ops and onnxruntime's
detector (about half a second to build), a swap network on onnxruntime's CPU engine (the
inswapper: about 2 s to open on a 16-core host, then a third of a second a face). With
``[pipeline] early_frames = "swap"`` (the default) a live run whose models can all run on
onnxruntime (:func:`qualifies`) therefore loads twice: a CPU assembly (:func:`cpu_config`), which the
frame loop uses at once, the frames counted as swapped (``frames_in``/``frames_out``, the first
frame "through the pipeline"); and the full assembly, which the frame loop takes over between two
frames (:meth:`EarlySwap.switch`): the outputs stay open (same format and size), no frame in flight
(the CPU collects each round at once; under a latency budget its frames race the budget:
:class:`Race`), the faces stay (host data: the classic swap's prepared
source, a swap network's latent, the same for any device), each stream gets its new pipeline and
capture stage, the degrader and the GPU telemetry start then. Until the CPU assembly is there the
early frames are pixelated.

The two loads run one after the other in one thread (``vcam-load``); the faces are loaded once, by
the CPU assembly (by the full one where that could not be built). A swap network's CPU frames use
half the cores (:func:`cpu_threads`), the full load the rest. The loads side by side (the
onnxruntime sessions open without the GIL) were measured on three H200 hosts (7b4ef29,
``benchmarks/startup.py --early-sequential``): a first swapped frame 0.2-0.4 s sooner, but the
switch to the GPU as late or up to 3 s later (the full load slowed from 3.3 s to 6.0 s on one
host), so they run in turn.

A swap network swaps early only under a budget the CPU can keep (:func:`keeps_budget`: none, or
at least :data:`NETWORK_CPU_FACE_S`): on the H200 at eefa218 the inswapper's CPU assembly under a
33 ms budget swapped no frame in 7 s and delayed the GPU's first frame from 4 s to 8-20 s.

A CPU assembly that cannot be built (one warning line) leaves the early frames pixelated until the
full one is loaded; a full load that fails stops the run with its error, as without the early swap.
A run that ends while the full load runs leaves it running (``Daemon.loading``: the command ends
the process with ``os._exit``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vcam.config import Config
from vcam.errors import ConfigError, FaceError
from vcam.platform import process
from vcam.platform.cpu import usable_cores
from vcam.runtime.rounds import Passed

if TYPE_CHECKING:
    from vcam.runtime.rounds import Rounds, Stream
    from vcam.runtime.startup import Daemon, Loaded, Started
    from vcam.types import Frame

log = logging.getLogger(__name__)

#: The roles a run may use and still start on the CPU: the detector, the swap (built in, or a swap
#: network), the recogniser that makes a swap network's source latents.
CPU_ROLES = frozenset({"detector", "swapper", "recogniser"})


def qualifies(cfg: Config) -> bool:
    """Whether ``cfg``'s swap can run on the CPU without PyTorch or CuPy: no model but the
    detector, the swapper and the recogniser (no enhancer, model masks, landmarker or frame
    enhancer), every model on onnxruntime (``[pipeline] backend`` auto or onnxruntime, no role on
    another backend, onnxruntime installed)."""
    from vcam.runtime.roles import model_names, role_backend

    roles = set(model_names(cfg))
    if roles - CPU_ROLES or cfg.pipeline.backend not in ("auto", "onnxruntime"):
        return False
    if any(role_backend(cfg, role) not in ("auto", "onnxruntime") for role in roles):
        return False
    return importlib.util.find_spec("onnxruntime") is not None


#: Overrides :func:`cpu_threads` (measurements: ``benchmarks/startup.py --early-threads``).
THREADS_ENV = "VCAM_EARLY_THREADS"


def cpu_threads(cfg: Config) -> int:
    """The CPU threads of one model call of the CPU assembly: for a swap network, whose CPU frames
    run for seconds while the full load does, half the cores (the GPU's imports, module builds and
    captures keep the rest); else one per core (0). ``$VCAM_EARLY_THREADS`` overrides it (0: one per core)."""
    from vcam.stages.swap import BUILT_IN

    own = os.environ.get(THREADS_ENV, "").strip()
    if own.isdigit():
        return int(own)
    return max(1, usable_cores() // 2) if cfg.swap.swapper not in BUILT_IN else 0


#: Seconds a swap network takes a face on onnxruntime's CPU engine at best (the inswapper on half
#: of a 16-core H200 host: about 0.3 s, eefa218). A latency budget below it is never met by the CPU.
NETWORK_CPU_FACE_S = 0.3


def keeps_budget(cfg: Config, budgets: list[float]) -> bool:
    """Whether ``cfg``'s swap on the CPU can go out within every stream's latency budget (seconds,
    0: none): the classic swap always (a few milliseconds a face); a swap network only without a
    budget or with one of at least :data:`NETWORK_CPU_FACE_S`. Where it cannot, its CPU assembly
    would only take the GIL and the cores from the GPU's load for frames that all go out pixelated."""
    from vcam.stages.swap import BUILT_IN

    if cfg.swap.swapper in BUILT_IN:
        return True
    return all(b == 0 or b >= NETWORK_CPU_FACE_S for b in budgets)


def cpu_config(d: Daemon) -> Config | None:
    """The config of the CPU assembly that swaps while the full one loads, or None where the
    early swap does not apply: ``[pipeline] early_frames`` not ``"swap"``, a stream that does not
    :func:`qualify <qualifies>`, a swap network under a latency budget it cannot keep on the CPU
    (:func:`keeps_budget`: the early frames are pixelated, the GPU's load starts at once), or a run
    on the CPU anyway (``--device cpu``, or ``auto`` without CuPy installed). ``d.early_swap``:
    True hands over whatever the device and the budget (tests, measurements: two CPU assemblies),
    False never."""
    cfg = d.cfg
    if cfg.pipeline.early_frames != "swap" or d.early_swap is False:
        return None
    if not all(qualifies(c) for c in (cfg, *(st.cfg for st in d.streams))):
        return None
    budgets = [st.budget for st in d.streams] if d.streams else [float(cfg.pipeline.max_latency)]
    if d.early_swap is not True and not keeps_budget(cfg, budgets):
        log.info(
            "the early frames are pixelated: %s on the CPU takes about %.1f s a face, over the %.0f ms latency budget",
            cfg.swap.swapper, NETWORK_CPU_FACE_S, 1000 * min(b for b in budgets if b > 0),
        )  # fmt: skip
        return None
    gpu = cfg.pipeline.device == "cuda" or (cfg.pipeline.device == "auto" and importlib.util.find_spec("cupy") is not None)
    if not gpu and d.early_swap is not True:
        return None
    # The search stays in the frame: a few seconds of CPU frames need no second detector session.
    return cfg.replace(
        pipeline=replace(cfg.pipeline, device="cpu", backend="onnxruntime", fp16=False), track=replace(cfg.track, search="frame")
    )


def describe_start(cfg: Config, device: str) -> str:
    """What a live run's first frames are on ``device`` (``vcam check``), '' where that is plain
    (the CPU, or ``early_frames`` other than ``"swap"``)."""
    if device != "cuda" or cfg.pipeline.early_frames != "swap":
        return ""
    if qualifies(cfg) and not keeps_budget(cfg, [float(cfg.pipeline.max_latency)]):
        return (
            f"live runs publish pixelated frames while the GPU loads ({cfg.swap.swapper} on the CPU takes about "
            f"{NETWORK_CPU_FACE_S:.1f} s a face, over the {float(cfg.pipeline.max_latency) * 1000:.0f} ms latency budget)"
        )
    if qualifies(cfg):
        return "live runs swap their first frames on the CPU (NumPy, onnxruntime) while the GPU loads, then switch to it"
    from vcam.runtime.roles import model_names

    needs = sorted(set(model_names(cfg)) - CPU_ROLES) or [f"backend {cfg.pipeline.backend}"]
    return (
        f"live runs publish pixelated frames while the GPU loads (the swap on the CPU meanwhile takes runs "
        f"whose models all run on onnxruntime; this one needs {', '.join(needs)})"
    )


class EarlySwap:
    """The two loads of an early swap (see the module docstring) and their outcome, kept in the
    start-up's :class:`~vcam.runtime.startup.Started` (``up.early``; it writes no daemon attribute).

    :attr:`thread` (not started) builds :attr:`cpu`, then :attr:`full` (``Daemon.load_delay`` seconds
    later: tests, measurements); :meth:`first_ready` says when the early frames can stop,
    :meth:`adopt_first` puts the CPU assembly in use, :meth:`ready` and :meth:`switch` the full one.
    """

    def __init__(self, d: Daemon, up: Started, cpu_cfg: Config) -> None:
        self.d = d
        self.up = up
        self.cpu_cfg = cpu_cfg
        self.cpu: Loaded | None = None
        self.full: Loaded | None = None
        self.failure: BaseException | None = None
        self._cpu_done = threading.Event()  # the CPU assembly is built, or could not be
        self._done = threading.Event()  # the full load ended (loaded, failed or stopped)
        self.thread = threading.Thread(target=self._run, name="vcam-load", daemon=True)

    # -- the load thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        """The CPU assembly, then the full one."""
        from vcam.runtime import startup

        d = self.d
        try:
            self._run_cpu()
            if d.load_delay:
                time.sleep(d.load_delay)
            if d.should_exit or self.failure is not None:
                return
            cfg = d.cfg
            if cfg.pipeline.device == "auto":
                from vcam.runtime.assemble import device_for_load

                device, why = device_for_load(cfg)
                if device == "cpu" and self.cpu is not None:  # no GPU after all: the CPU assembly stays
                    log.info("running on the CPU: %s", why)
                    return
            self.full = startup.prepare(d, cfg, faces=self.cpu is None)
            if self.full is not None:
                startup.rehearse(d, self.full)  # the switch's first round pays no first uses
        except BaseException as exc:
            self.failure = self.failure or exc
        finally:
            self._done.set()
            d.wake.set()

    def _run_cpu(self) -> None:
        """The CPU assembly. A bad setting or a face photo without a face ends the early swap with
        that error (the full load would say the same); any other failure leaves the early frames
        pixelated, with one line."""
        from vcam.runtime import startup

        d = self.d
        try:
            self.cpu = startup.prepare(d, self.cpu_cfg, hold=False, threads=cpu_threads(d.cfg), short_lived=True)
        except (ConfigError, FaceError) as exc:
            self.failure = exc
        except Exception as exc:
            why = getattr(exc, "message", None) or exc
            log.warning("no swap on the CPU while the models load (%s): the early frames are pixelated", why)
        finally:
            self._cpu_done.set()
            d.wake.set()

    # -- the frame loop's side ----------------------------------------------------------------------
    def first_ready(self) -> bool:
        """Something to swap with: the CPU assembly, or (without it) the end of the full load."""
        return (self._cpu_done.is_set() and self.cpu is not None) or self._done.is_set()

    def adopt_first(self) -> bool:
        """Put in use what :meth:`first_ready` found: the CPU assembly while the full one loads (or
        the full one, loaded meanwhile; its error raised). False when there is none (stopped)."""
        from vcam.runtime import startup

        d, up = self.d, self.up
        if self._done.is_set() and (self.failure is not None or self.cpu is None or self.full is not None):
            up.early = None
            up.models_final()
            if self.failure is not None:
                raise self.failure
            loaded = self.full or self.cpu
            if loaded is None:  # stopped while loading
                return False
            startup.adopt(d, up, loaded)
            return True
        assert self.cpu is not None
        startup.adopt(d, up, self.cpu)
        log.info("swapping on the CPU while the models load (%.2f s after the start)", process.age())
        return True

    def ready(self) -> bool:
        """The full load ended: :meth:`switch` now, between two frames."""
        return self._done.is_set()

    def switch(self) -> bool:
        """Between two rounds (none in flight): the full assembly in use for every stream, the
        degrader and GPU telemetry started; its failure raised. False when there was nothing to
        switch to (no GPU after all: the CPU assembly stays)."""
        from vcam.runtime import assemble, startup

        d, up = self.d, self.up
        up.early = None
        up.models_final()
        if self.failure is not None:
            raise self.failure
        n = sum(st.summary.frames_out for st in d.streams)
        for st in d.streams:
            st.summary.cpu_frames = st.summary.frames_out
        if self.full is None:
            return False
        startup.adopt(d, up, self.full)
        cpu, self.cpu = self.cpu, None  # its engines go (a swap network's CPU session holds its weights)
        if cpu is not None:  # and nothing keeps them: the faces load with the full models from now on
            assemble.rebind_faces(self.full.assembly, cpu.watcher, [st.state for st in d.streams])
        for st in d.streams:
            assert st.cap is not None
            st.cap.stage, st.cap.target = st.stage, st.target
        startup.start_telemetry(d, up)
        age = process.age()
        for st in d.streams:
            st.summary.switched_s = age
        log.info(
            "switched to %s after %d frames swapped on the CPU (%.2f s after the start)",
            self.full.assembly.device, n, age,
        )  # fmt: skip
        return True

    def left_running(self) -> None:
        """The run ends on the CPU assembly: what was swapped there is counted; a full load still
        running is left to finish on its own (``up.loading``)."""
        for st in self.d.streams:
            st.summary.cpu_frames = st.summary.frames_out
        if self.thread.is_alive():
            self.up.loading = self.thread


#: Seconds between two tries of a stream's CPU swap once its swaps took longer than its budget.
RETRY_EVERY = 1.0


class Race:
    """The CPU assembly's frames under a latency budget (a stream's ``max_latency`` > 0): a frame is
    swapped in a worker thread (``vcam-early-swap``) while the frame loop waits for it at most until
    its budget, less what an early frame's conversion takes; swapped in time it goes out swapped
    (``frames_out``), else as an early frame (pixelated, ``early_frames``). While the worker is busy
    every other frame goes out as an early frame at once. So the camera moves at its own rate and
    no frame is older than the budget, however slow the CPU swap (a swap network: a third of a
    second a face); a stream whose last swaps all took longer than its budget is tried again once
    every :data:`RETRY_EVERY` seconds (a swap that is never in time only takes cores from the load)."""

    def __init__(self, rounds: Rounds) -> None:
        self.rounds = rounds
        self._job: tuple[Stream, Frame] | None = None
        self._result: tuple[Any, Any] | BaseException | None = None
        self._go = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._took: dict[str, deque[float]] = {}
        self._tried: dict[str, float] = {}
        self._convert = 0.01  # seconds: the slowest early frame conversion seen lately
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="vcam-early-swap", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A swap runs: the pipelines must not change under it (the switch waits for this)."""
        return not self._idle.is_set()

    def close(self) -> None:
        self._closed = True
        self._go.set()

    def run(self, ready: list[tuple[Stream, Frame]]) -> None:
        """One gathered round: one frame to the worker (when idle and worth it), the others out as
        early frames; then that frame out, swapped if in time, else as an early frame."""
        failure = self._result
        if isinstance(failure, BaseException):  # a swap that failed after its frame went out pixelated
            raise failure
        raced: tuple[Stream, Frame] | None = None
        for st, frame in ready:
            if raced is None and not self.busy and self._worth(st):
                raced = (st, frame)
                self._start(st, frame)
            else:
                self._early(st, frame)
        if raced is not None:
            self._settle(*raced)

    def _worth(self, st: Stream) -> bool:
        took = self._took.get(st.name)
        if not took or min(took) + self._convert <= st.budget:
            return True
        return time.perf_counter() - self._tried.get(st.name, 0.0) >= RETRY_EVERY

    def _start(self, st: Stream, frame: Frame) -> None:
        self._tried[st.name] = time.perf_counter()
        self._job, self._result = (st, frame), None
        self._idle.clear()
        self._go.set()

    def _settle(self, st: Stream, frame: Frame) -> None:
        deadline = frame.t_capture + st.budget - self._convert
        if self._idle.wait(max(0.0, deadline - time.perf_counter())):
            result = self._result
            if isinstance(result, BaseException):
                raise result
            assert result is not None
            data, stats = result
            if time.perf_counter() - frame.t_capture <= st.budget and self.rounds.publish(st, data, stats):
                return
        self._early(st, frame)

    def _early(self, st: Stream, frame: Frame) -> None:
        t0 = time.perf_counter()
        self.rounds.publish_early(st, frame)
        self._convert = max(0.9 * self._convert, time.perf_counter() - t0)

    def _work(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self._closed:
                return
            assert self._job is not None
            st, frame = self._job
            t0 = time.perf_counter()
            try:
                rnd = self.rounds.submit([(st, frame)])
                (_, slot), pipe = rnd.slots[0], st.pipeline
                assert pipe is not None and not isinstance(slot, Passed)
                self._result = pipe.collect(slot)
                pipe.launch_detection()
            except BaseException as exc:
                self._result = exc
            self._took.setdefault(st.name, deque(maxlen=3)).append(time.perf_counter() - t0)
            self._idle.set()


__all__ = ["CPU_ROLES", "NETWORK_CPU_FACE_S", "EarlySwap", "Race", "cpu_config", "describe_start", "keeps_budget", "qualifies"]
