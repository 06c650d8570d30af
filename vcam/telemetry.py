"""GPU telemetry through NVML: temperature, clocks, power, memory, utilisation and throttling.

NVML comes with the NVIDIA driver; its Python binding is the optional package ``nvidia-ml-py``
(``pip install 'fastswap-cam[nvml]'``), imported as ``pynvml``. Nothing here imports it at module
level: without it, or without an NVIDIA driver, :func:`open_telemetry` returns None and the daemon
runs as before.

- :class:`GpuSample`: one reading (a field NVML does not support on this GPU is None, never an error).
- :class:`Telemetry`: a daemon thread sampling every ``interval`` seconds, off the frame loop; the
  frame loop only reads :meth:`Telemetry.latest` (a lock and a pointer read).
- :func:`open_telemetry`: ``[telemetry] enabled`` = ``off`` / ``auto`` / ``on`` and the device -> a
  started sampler or None.
- :func:`throttle_warning` and :class:`ThrottleWarner`: one line, with what to do, when the GPU
  throttles for heat or power, once per episode.

Which GPU: the CUDA device the pipeline uses. CUDA numbers devices after ``CUDA_VISIBLE_DEVICES``
(and, by default, fastest first), NVML numbers all of them in PCI order, so the device is matched
by its PCI bus id through CuPy when CuPy is there (the GPU path always has it); otherwise through
``CUDA_VISIBLE_DEVICES`` (a GPU UUID there is exact, a number is an NVML index), otherwise the
same index in NVML (right on one-GPU machines, on identical GPUs and with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

INSTALL = "pip install 'fastswap-cam[nvml]'"
LOAD_ADVICE = "--fp16, fewer faces, [upscale] off"

# Clock event ("throttle") reason bits, as in nvml.h / pynvml (both the older
# nvmlClocksThrottleReason* and the newer nvmlClocksEventReason* names carry the same values). Only
# these count as throttling: idle, application-clock settings, sync boost and display clocks are
# the GPU's normal clock management.
THROTTLE_REASONS: tuple[tuple[str, str, int], ...] = (
    ("sw_power_cap", "SwPowerCap", 0x04),
    ("hw_slowdown", "HwSlowdown", 0x08),
    ("sw_thermal", "SwThermalSlowdown", 0x20),
    ("hw_thermal", "HwThermalSlowdown", 0x40),
    ("hw_power_brake", "HwPowerBrakeSlowdown", 0x80),
)
HEAT = frozenset({"sw_thermal", "hw_thermal"})
POWER = frozenset({"sw_power_cap"})
HARDWARE = frozenset({"hw_slowdown", "hw_power_brake"})
# Clocks forced down by heat or a hardware signal, whatever the load: what the Degrader should count
# as overload. sw_power_cap alone is not: a GPU under full load sits at its power cap, and the frame
# times already say whether that is too slow.
FORCED = HEAT | HARDWARE

_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading of one GPU. Every reading but ``index``, ``name`` and ``throttle`` is None
    where NVML does not support it on this GPU (or the read failed)."""

    index: int
    name: str
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    util_gpu_pct: int | None = None
    util_mem_pct: int | None = None
    throttle: tuple[str, ...] = ()  # throttling reasons now, e.g. ('sw_power_cap',); () when none

    @property
    def throttling(self) -> bool:
        """The GPU throttles now, for heat or power (any reason in ``throttle``)."""
        return bool(self.throttle)

    @property
    def forced_slowdown(self) -> bool:
        """Clocks forced down by heat (sw/hw_thermal) or a hardware signal (hw_slowdown,
        hw_power_brake): what the :class:`vcam.runtime.degrade.Degrader` should be told as ``throttled``."""
        return any(r in FORCED for r in self.throttle)

    def text(self) -> str:
        """Short: ``GPU 61°C 1980 MHz 312/700 W 14.2 GiB util 87%`` (+ `` THROTTLED: sw_power_cap``);
        readings NVML does not give are left out."""
        parts = ["GPU"]
        if self.temperature_c is not None:
            parts.append(f"{self.temperature_c}°C")
        if self.sm_clock_mhz is not None:
            parts.append(f"{self.sm_clock_mhz} MHz")
        if self.power_w is not None:
            limit = f"/{self.power_limit_w:.0f}" if self.power_limit_w is not None else ""
            parts.append(f"{self.power_w:.0f}{limit} W")
        if self.memory_used_mib is not None:
            parts.append(f"{self.memory_used_mib / 1024:.1f} GiB")
        if self.util_gpu_pct is not None:
            parts.append(f"util {self.util_gpu_pct}%")
        if len(parts) == 1:
            parts.append("(no readings)")
        if self.throttle:
            parts.append(f"THROTTLED: {', '.join(self.throttle)}")
        return " ".join(parts)

    def as_dict(self) -> dict:
        """JSON-safe (``throttle`` as a list); :meth:`from_dict` reads it back."""
        out = dataclasses.asdict(self)
        out["throttle"] = list(self.throttle)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> GpuSample:
        """A sample from :meth:`as_dict`'s output (keys missing or unknown are tolerated)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"index", "name", "throttle"}
        return cls(
            index=int(d.get("index") or 0),
            name=str(d.get("name") or ""),
            throttle=tuple(str(r) for r in d.get("throttle") or ()),
            **{k: d.get(k) for k in names},
        )


def gpu_text(d: dict | GpuSample | None) -> str:
    """:meth:`GpuSample.text` of a sample or its dict (as in :class:`vcam.state.Status`), '' for None."""
    if d is None:
        return ""
    return (d if isinstance(d, GpuSample) else GpuSample.from_dict(d)).text()


def decode_throttle(nvml: Any, mask: int) -> tuple[str, ...]:
    """The throttling reasons set in an NVML clock-event bit mask (idle and clock settings left out)."""
    out = []
    for name, suffix, default in THROTTLE_REASONS:
        bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
        if bit is None:
            bit = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", default)
        if mask & int(bit):
            out.append(name)
    return tuple(out)


def throttle_warning(sample: GpuSample | None) -> str | None:
    """One line saying why the GPU throttles and what to do, or None when it does not."""
    if sample is None or not sample.throttle:
        return None
    reasons = sample.throttle
    temp = f" at {sample.temperature_c}°C" if sample.temperature_c is not None else ""
    clocks = ""
    if sample.sm_clock_mhz is not None and sample.max_sm_clock_mhz:
        clocks = f", {sample.sm_clock_mhz} of {sample.max_sm_clock_mhz} MHz"
    gpu = f"GPU {sample.index}"
    if any(r in HEAT for r in reasons):
        return (
            f"{gpu} is throttling for heat ({', '.join(reasons)}{temp}{clocks}): "
            f"improve cooling or lower the load ({LOAD_ADVICE})"
        )
    if any(r in HARDWARE for r in reasons):
        return (
            f"{gpu} is slowed down by its hardware ({', '.join(reasons)}{temp}{clocks}): check cooling and the power supply "
            f"and cables, or lower the load ({LOAD_ADVICE})"
        )
    power = ""
    if sample.power_w is not None:
        power = f" at {sample.power_w:.0f}" + (f"/{sample.power_limit_w:.0f}" if sample.power_limit_w is not None else "") + " W"
    return (
        f"{gpu} is throttling for power ({', '.join(reasons)}{power}{clocks}): lower the load ({LOAD_ADVICE}) "
        "or raise the power limit where the card allows it (sudo nvidia-smi -pl WATTS)"
    )


class ThrottleWarner:
    """Says :func:`throttle_warning` once per throttling episode: the first throttled sample gives
    the line, later ones None; the episode ends once no sample has throttled for ``clear_after``
    seconds (power-cap throttling comes and goes from one sample to the next under load), and the
    next throttled sample starts a new one."""

    def __init__(self, clear_after: float = 30.0) -> None:
        self.clear_after = clear_after
        self.active = False
        self._last_seen = 0.0

    def update(self, sample: GpuSample | None, now: float) -> str | None:
        line = throttle_warning(sample)
        if line is not None:
            self._last_seen = now
            if not self.active:
                self.active = True
                return line
            return None
        if self.active and now - self._last_seen >= self.clear_after:
            self.active = False
            log.info("GPU %s no longer throttles", sample.index if sample is not None else "?")
        return None


def _field(nvml: Any, fn: str, *args: Any) -> Any:
    """``nvml.fn(*args)``, or None when NVML does not support it here (or the binding lacks it)."""
    try:
        return getattr(nvml, fn)(*args)
    except (nvml.NVMLError, AttributeError, TypeError, ValueError, OSError):
        return None


def read_sample(nvml: Any, handle: Any, index: int) -> GpuSample:
    """One reading of the GPU ``handle`` (NVML initialised); unsupported readings are None."""
    name = _field(nvml, "nvmlDeviceGetName", handle)
    if isinstance(name, bytes):  # older bindings return bytes
        name = name.decode(errors="replace")
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    mem_clock = getattr(nvml, "NVML_CLOCK_MEM", 2)
    power = _field(nvml, "nvmlDeviceGetPowerUsage", handle)  # mW
    limit = _field(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle)  # mW
    memory = _field(nvml, "nvmlDeviceGetMemoryInfo", handle)  # bytes
    util = _field(nvml, "nvmlDeviceGetUtilizationRates", handle)  # percent
    mask = _field(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:  # bindings before 12.535 (and the deprecated name, where the new one is missing)
        mask = _field(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return GpuSample(
        index=index,
        name=str(name or f"GPU {index}"),
        temperature_c=_int(_field(nvml, "nvmlDeviceGetTemperature", handle, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))),
        sm_clock_mhz=_int(_field(nvml, "nvmlDeviceGetClockInfo", handle, sm)),
        mem_clock_mhz=_int(_field(nvml, "nvmlDeviceGetClockInfo", handle, mem_clock)),
        max_sm_clock_mhz=_int(_field(nvml, "nvmlDeviceGetMaxClockInfo", handle, sm)),
        power_w=round(power / 1000.0, 1) if power is not None else None,
        power_limit_w=round(limit / 1000.0, 1) if limit is not None else None,
        memory_used_mib=round(memory.used / _MIB, 1) if memory is not None else None,
        memory_total_mib=round(memory.total / _MIB, 1) if memory is not None else None,
        util_gpu_pct=_int(getattr(util, "gpu", None)),
        util_mem_pct=_int(getattr(util, "memory", None)),
        throttle=decode_throttle(nvml, int(mask)) if mask is not None else (),
    )


def _int(v: Any) -> int | None:
    return int(v) if v is not None else None


class Telemetry:
    """Samples one GPU every ``interval`` seconds on a daemon thread. NVML is initialised by
    :func:`open_telemetry` (once); :meth:`stop` ends the thread and shuts NVML down (once).

    ``warn(line)``: called (from the sampling thread) with :func:`throttle_warning`'s line once per
    throttling episode (:class:`ThrottleWarner`); None: no warnings.
    """

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        *,
        index: int = 0,
        interval: float = 0.5,
        warn: Callable[[str], None] | None = None,
        clear_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml, self.handle, self.index = nvml, handle, index
        self.interval = max(0.01, float(interval))
        self.warn = warn
        self.warner = ThrottleWarner(clear_after)
        self._clock = clock
        self._cond = threading.Condition()
        self._latest: GpuSample | None = None
        self._count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shut = False
        self._failed = False

    # -- frame loop / status side --------------------------------------------------------------
    def latest(self) -> GpuSample | None:
        """The newest sample (None before the first one); never waits on NVML."""
        with self._cond:
            return self._latest

    @property
    def samples(self) -> int:
        """How many samples were taken so far."""
        with self._cond:
            return self._count

    def wait_for(self, count: int, timeout: float) -> GpuSample | None:
        """Wait until at least ``count`` samples were taken (or ``timeout`` seconds); the newest sample."""
        with self._cond:
            self._cond.wait_for(lambda: self._count >= count, timeout)
            return self._latest

    # -- sampling ----------------------------------------------------------------------------
    def sample_now(self) -> GpuSample | None:
        """Take one sample in the calling thread (the sampling thread calls this); None if NVML failed."""
        try:
            sample = read_sample(self.nvml, self.handle, self.index)
        except Exception:  # a broken binding or a lost GPU must never take the daemon down
            if not self._failed:
                self._failed = True
                log.debug("GPU telemetry: sampling failed", exc_info=True)
            return None
        with self._cond:
            self._latest = sample
            self._count += 1
            self._cond.notify_all()
        line = self.warner.update(sample, self._clock())
        if line is not None and self.warn is not None:
            self.warn(line)
        return sample

    def _run(self) -> None:
        while True:
            self.sample_now()
            if self._stop.wait(self.interval):
                return

    def start(self) -> Telemetry:
        if self._thread is None and not self._shut:
            self._thread = threading.Thread(target=self._run, name="vcam-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """End the sampling thread and shut NVML down; safe to call twice."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if not self._shut:
            self._shut = True
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                log.debug("nvmlShutdown failed", exc_info=True)

    def __enter__(self) -> Telemetry:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class TelemetryUnavailable(Exception):
    """Why NVML cannot be read here, and the fix."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message, self.fix = message, fix


def _cuda_pci_bus_id(gpu_index: int) -> str | None:
    """The PCI bus id of CUDA device ``gpu_index`` through CuPy (e.g. '0000:01:00.0'), or None when
    CuPy is not there or cannot say."""
    try:
        import cupy

        return str(cupy.cuda.Device(gpu_index).pci_bus_id)
    except Exception:  # no CuPy, no CUDA driver, no such device: fall back to the index
        return None


def _resolve_handle(nvml: Any, gpu_index: int) -> tuple[Any, int, str]:
    """(NVML handle, NVML index, how it was found) of CUDA device ``gpu_index`` (NVML initialised)."""
    bus = _cuda_pci_bus_id(gpu_index)
    handle, how = None, ""
    if bus:
        try:
            handle, how = nvml.nvmlDeviceGetHandleByPciBusId(bus.encode()), f"PCI bus id {bus}"
        except nvml.NVMLError:
            handle = None
    if handle is None:
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        entry = visible[gpu_index] if gpu_index < len(visible) else None
        if entry is not None and entry.startswith("GPU-"):
            handle, how = nvml.nvmlDeviceGetHandleByUUID(entry.encode()), f"UUID {entry}"
        else:
            # A number in CUDA_VISIBLE_DEVICES is a CUDA index; it is the NVML index when CUDA numbers
            # in PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID) or the GPUs are alike (on one GPU: index 0).
            nvml_index = int(entry) if entry is not None and entry.isdigit() else gpu_index
            handle, how = nvml.nvmlDeviceGetHandleByIndex(nvml_index), f"index {nvml_index}"
    index = _field(nvml, "nvmlDeviceGetIndex", handle)
    return handle, int(index) if index is not None else gpu_index, how


def _open_nvml(gpu_index: int) -> tuple[Any, Any, int, str]:
    """Import pynvml, initialise NVML and find the GPU: (pynvml, handle, NVML index, how found).
    Raises :class:`TelemetryUnavailable`; NVML is shut down again on failure."""
    try:
        import pynvml as nvml
    except ImportError as exc:
        raise TelemetryUnavailable(f"nvidia-ml-py is not installed ({exc})", INSTALL) from None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        raise TelemetryUnavailable(
            f"NVML did not start ({exc})", 'install the NVIDIA driver (NVML comes with it), or set [telemetry] enabled = "off"'
        ) from None
    try:
        handle, index, how = _resolve_handle(nvml, gpu_index)
    except Exception as exc:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
        raise TelemetryUnavailable(f"NVML cannot find CUDA device {gpu_index} ({exc})", "check CUDA_VISIBLE_DEVICES") from None
    return nvml, handle, index, how


def probe(gpu_index: int = 0) -> GpuSample:
    """One reading now (for `vcam check`), NVML initialised and shut down around it. Raises
    :class:`TelemetryUnavailable`."""
    nvml, handle, index, _ = _open_nvml(gpu_index)
    tel = Telemetry(nvml, handle, index=index)
    try:
        sample = tel.sample_now()
    finally:
        tel.stop()
    if sample is None:
        raise TelemetryUnavailable(f"NVML could not read GPU {index}", "check the NVIDIA driver with nvidia-smi")
    return sample


def open_telemetry(
    cfg_telemetry: Any,
    device: str,
    *,
    gpu_index: int = 0,
    warn: Callable[[str], None] | None = log.warning,
    start: bool = True,
) -> Telemetry | None:
    """The GPU sampler for a run, started, or None.

    ``cfg_telemetry``: :class:`vcam.config.TelemetryConfig` (``enabled`` off | auto | on,
    ``interval``). ``device``: where frames run ('cpu' -> None). ``gpu_index``: the CUDA device the
    pipeline uses. With ``auto``, a missing nvidia-ml-py or an NVML that does not start gives None
    and one debug line; with ``on``, one warning line naming the fix. ``warn``: receives the
    throttling line once per episode (see :class:`Telemetry`).
    """
    mode = getattr(cfg_telemetry, "enabled", "auto")
    if mode == "off" or device == "cpu":
        return None
    try:
        nvml, handle, index, how = _open_nvml(gpu_index)
    except TelemetryUnavailable as exc:
        if mode == "on":
            log.warning("GPU telemetry is on but unavailable: %s -> %s", exc.message, exc.fix)
        else:
            log.debug("GPU telemetry off: %s (%s)", exc.message, exc.fix)
        return None
    log.debug("GPU telemetry: CUDA device %d is NVML GPU %d (by %s)", gpu_index, index, how)
    tel = Telemetry(nvml, handle, index=index, interval=float(getattr(cfg_telemetry, "interval", 0.5)), warn=warn)
    return tel.start() if start else tel


__all__ = [
    "GpuSample",
    "Telemetry",
    "TelemetryUnavailable",
    "ThrottleWarner",
    "decode_throttle",
    "gpu_text",
    "open_telemetry",
    "probe",
    "read_sample",
    "throttle_warning",
]
