"""GPU telemetry (vcam.telemetry) and graceful degradation (vcam.runtime.degrade), on the CPU.

NVML is replaced at the import boundary by a fake ``pynvml`` module whose readings the tests set;
one test reads the real NVML and skips without nvidia-ml-py or an NVIDIA GPU.
"""

from __future__ import annotations

import json
import logging
import sys
import types

import pytest
from conftest import require

from vcam import telemetry
from vcam.config import DegradeConfig, TelemetryConfig
from vcam.runtime.degrade import Change, Degrader
from vcam.state import RuntimeState, Status
from vcam.status import LiveStats, RunSummary, status_suffix
from vcam.telemetry import GpuSample, Telemetry, ThrottleWarner, open_telemetry, throttle_warning

# --- a fake pynvml ------------------------------------------------------------------------------


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(**over):
    """A module standing in for pynvml: the functions vcam calls, its error class and constants
    (values as in nvidia-ml-py). ``over`` sets readings; ``unsupported`` names functions that raise
    NVML_ERROR_NOT_SUPPORTED; ``init_error`` makes nvmlInit fail."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_ERROR_NOT_SUPPORTED = 3
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_GRAPHICS, m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM = 0, 1, 2
    m.nvmlClocksThrottleReasonGpuIdle = 0x01
    m.nvmlClocksThrottleReasonApplicationsClocksSetting = 0x02
    m.nvmlClocksThrottleReasonSwPowerCap = 0x04
    m.nvmlClocksThrottleReasonHwSlowdown = 0x08
    m.nvmlClocksThrottleReasonSyncBoost = 0x10
    m.nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
    m.nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
    m.nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
    m.nvmlClocksThrottleReasonDisplayClockSetting = 0x100
    m.values = {
        "name": "NVIDIA H200",
        "temp": 61,
        "sm": 1980,
        "mem": 2619,
        "max_sm": 1980,
        "power_mw": 312_000,
        "limit_mw": 700_000,
        "used": int(14.2 * 1024**3),
        "total": 141 * 1024**3,
        "util": (87, 40),
        "reasons": 0,
    }
    m.values.update(over.pop("values", {}))
    m.unsupported = set(over.pop("unsupported", ()))
    m.calls = []
    init_error = over.pop("init_error", None)
    assert not over, over

    def api(fn):
        def wrapper(*args):
            m.calls.append(fn.__name__)
            if fn.__name__ in m.unsupported:
                raise FakeNVMLError(m.NVML_ERROR_NOT_SUPPORTED)
            return fn(*args)

        setattr(m, fn.__name__, wrapper)
        return wrapper

    @api
    def nvmlInit():
        if init_error is not None:
            raise FakeNVMLError(init_error)

    @api
    def nvmlShutdown():
        pass

    @api
    def nvmlDeviceGetHandleByIndex(i):
        return ("handle", i)

    @api
    def nvmlDeviceGetHandleByPciBusId(bus):
        assert isinstance(bus, bytes)
        return ("handle", bus.decode())

    @api
    def nvmlDeviceGetHandleByUUID(uuid):
        return ("handle", uuid.decode())

    @api
    def nvmlDeviceGetIndex(handle):
        return handle[1] if isinstance(handle[1], int) else 3

    @api
    def nvmlDeviceGetName(handle):
        return m.values["name"]

    @api
    def nvmlDeviceGetTemperature(handle, sensor):
        assert sensor == m.NVML_TEMPERATURE_GPU
        return m.values["temp"]

    @api
    def nvmlDeviceGetClockInfo(handle, kind):
        return {m.NVML_CLOCK_SM: m.values["sm"], m.NVML_CLOCK_MEM: m.values["mem"]}[kind]

    @api
    def nvmlDeviceGetMaxClockInfo(handle, kind):
        assert kind == m.NVML_CLOCK_SM
        return m.values["max_sm"]

    @api
    def nvmlDeviceGetPowerUsage(handle):
        return m.values["power_mw"]

    @api
    def nvmlDeviceGetEnforcedPowerLimit(handle):
        return m.values["limit_mw"]

    @api
    def nvmlDeviceGetMemoryInfo(handle):
        return types.SimpleNamespace(used=m.values["used"], total=m.values["total"], free=0)

    @api
    def nvmlDeviceGetUtilizationRates(handle):
        gpu, mem = m.values["util"]
        return types.SimpleNamespace(gpu=gpu, memory=mem)

    @api
    def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
        return m.values["reasons"]

    return m


@pytest.fixture
def nvml(monkeypatch):
    fake = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(telemetry, "_cuda_pci_bus_id", lambda i: None)  # CuPy may see a real GPU here
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def sample(**kw) -> GpuSample:
    base = dict(index=0, name="NVIDIA H200", temperature_c=61, sm_clock_mhz=1980, max_sm_clock_mhz=1980, power_w=312.0)
    base.update(kw)
    return GpuSample(**base)


# --- the sampler --------------------------------------------------------------------------------


def test_sample_reads_the_fake_numbers(nvml):
    s = telemetry.read_sample(nvml, ("handle", 0), 0)
    assert s == GpuSample(
        index=0,
        name="NVIDIA H200",
        temperature_c=61,
        sm_clock_mhz=1980,
        mem_clock_mhz=2619,
        max_sm_clock_mhz=1980,
        power_w=312.0,
        power_limit_w=700.0,
        memory_used_mib=round(14.2 * 1024, 1),
        memory_total_mib=141 * 1024.0,
        util_gpu_pct=87,
        util_mem_pct=40,
        throttle=(),
    )
    assert s.text() == "GPU 61°C 1980 MHz 312/700 W 14.2 GiB util 87%"
    assert not s.throttling and throttle_warning(s) is None


def test_unsupported_readings_become_none(nvml):
    nvml.unsupported |= {
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    }
    nvml.values["name"] = b"Tesla T4"  # older bindings return bytes
    s = telemetry.read_sample(nvml, ("handle", 0), 0)
    assert s.power_w is None and s.power_limit_w is None and s.temperature_c is None and s.throttle == ()
    assert s.name == "Tesla T4" and s.sm_clock_mhz == 1980 and s.util_gpu_pct == 87
    assert s.text() == "GPU 1980 MHz 14.2 GiB util 87%"
    nvml.unsupported |= {n for n in dir(nvml) if n.startswith("nvmlDeviceGet")}
    s = telemetry.read_sample(nvml, ("handle", 0), 2)
    assert s.index == 2 and s.name == "GPU 2" and s.text() == "GPU (no readings)"


def test_throttle_reasons_decoded_without_idle_or_clock_settings(nvml):
    # idle, application clocks, sync boost and display clocks are not throttling
    nvml.values["reasons"] = 0x01 | 0x02 | 0x10 | 0x100
    assert telemetry.read_sample(nvml, ("handle", 0), 0).throttle == ()
    nvml.values["reasons"] = 0x04 | 0x40 | 0x01
    s = telemetry.read_sample(nvml, ("handle", 0), 0)
    assert s.throttle == ("sw_power_cap", "hw_thermal") and s.throttling and s.forced_slowdown
    assert s.text().endswith(" THROTTLED: sw_power_cap, hw_thermal")
    assert telemetry.decode_throttle(nvml, 0x08 | 0x20 | 0x80) == ("hw_slowdown", "sw_thermal", "hw_power_brake")
    # the newer nvmlClocksEventReason* names and function are preferred where they exist
    nvml.nvmlClocksEventReasonSwPowerCap = 0x04
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x04
    s = telemetry.read_sample(nvml, ("handle", 0), 0)
    assert s.throttle == ("sw_power_cap",) and s.throttling and not s.forced_slowdown


def test_throttle_warning_says_why_and_what_to_do():
    heat = throttle_warning(sample(temperature_c=91, sm_clock_mhz=1410, throttle=("hw_thermal",)))
    assert heat == (
        "GPU 0 is throttling for heat (hw_thermal at 91°C, 1410 of 1980 MHz): improve cooling or lower the load "
        "(--fp16, fewer faces, [upscale] off)"
    )
    power = throttle_warning(sample(power_limit_w=350.0, power_w=349.0, throttle=("sw_power_cap",)))
    assert power.startswith("GPU 0 is throttling for power (sw_power_cap at 349/350 W") and "nvidia-smi -pl" in power
    hw = throttle_warning(sample(throttle=("hw_slowdown",)))
    assert "slowed down by its hardware" in hw and "power supply" in hw
    assert throttle_warning(sample()) is None and throttle_warning(None) is None


def test_warning_once_per_episode():
    w = ThrottleWarner(clear_after=5.0)
    hot, cool = sample(throttle=("sw_thermal",)), sample()
    assert w.update(hot, 0.0) is not None
    assert w.update(hot, 1.0) is None and w.update(cool, 2.0) is None  # the same episode
    assert w.update(hot, 3.0) is None  # back within 5 s: still the same episode
    assert w.update(cool, 4.0) is None and w.update(cool, 8.5) is None and not w.active  # cleared
    assert w.update(hot, 9.0) is not None  # a new episode
    assert w.update(hot, 10.0) is None


def test_sampler_thread_samples_and_warns_once(nvml):
    nvml.values["reasons"] = 0x20
    lines = []
    tel = Telemetry(nvml, ("handle", 0), index=0, interval=0.01, warn=lines.append)
    assert tel.latest() is None
    with tel:
        got = tel.wait_for(3, timeout=10)
        assert got is not None and tel.samples >= 3
    assert got.temperature_c == 61 and got.throttle == ("sw_thermal",)
    assert len(lines) == 1 and lines[0].startswith("GPU 0 is throttling for heat (sw_thermal at 61°C")
    assert nvml.calls.count("nvmlShutdown") == 1
    tel.stop()  # twice is fine
    assert nvml.calls.count("nvmlShutdown") == 1


def test_sampler_survives_a_broken_binding(nvml):
    def boom(handle):
        raise RuntimeError("the binding broke")

    nvml.nvmlDeviceGetName = boom
    tel = Telemetry(nvml, ("handle", 0), interval=0.01)
    assert tel.sample_now() is None and tel.latest() is None
    tel.stop()


# --- open_telemetry -----------------------------------------------------------------------------


def test_open_telemetry_off_or_cpu_is_none(nvml):
    assert open_telemetry(TelemetryConfig(enabled="off"), "cuda") is None
    assert open_telemetry(TelemetryConfig(enabled="on"), "cpu") is None
    assert nvml.calls == []  # NVML never touched


def test_open_telemetry_auto_starts_a_sampler(nvml):
    tel = open_telemetry(TelemetryConfig(enabled="auto", interval=0.1), "cuda")
    try:
        assert tel is not None and tel.interval == pytest.approx(0.1)
        assert tel.wait_for(1, timeout=10).name == "NVIDIA H200"
    finally:
        tel.stop()
    assert nvml.calls.count("nvmlInit") == 1 and nvml.calls.count("nvmlShutdown") == 1


def test_open_telemetry_without_pynvml(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with caplog.at_level(logging.DEBUG, logger="vcam.telemetry"):
        assert open_telemetry(TelemetryConfig(enabled="auto"), "cuda") is None
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="vcam.telemetry"):
        assert open_telemetry(TelemetryConfig(enabled="on"), "cuda") is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "pip install 'fastswap-cam[nvml]'" in caplog.records[0].getMessage()


def test_open_telemetry_when_nvml_does_not_start(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(init_error=9))  # NVML_ERROR_DRIVER_NOT_LOADED
    with caplog.at_level(logging.DEBUG, logger="vcam.telemetry"):
        assert open_telemetry(TelemetryConfig(enabled="auto"), "cuda") is None
        assert [r.levelno for r in caplog.records] == [logging.DEBUG]
        assert open_telemetry(TelemetryConfig(enabled="on"), "cuda") is None
    assert caplog.records[-1].levelno == logging.WARNING and "NVIDIA driver" in caplog.records[-1].getMessage()


def test_gpu_found_by_pci_bus_id_then_visible_devices(nvml, monkeypatch):
    monkeypatch.setattr(telemetry, "_cuda_pci_bus_id", lambda i: "0000:41:00.0")
    handle, index, how = telemetry._resolve_handle(nvml, 0)
    assert handle == ("handle", "0000:41:00.0") and how == "PCI bus id 0000:41:00.0"
    monkeypatch.setattr(telemetry, "_cuda_pci_bus_id", lambda i: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert telemetry._resolve_handle(nvml, 1)[:2] == (("handle", 5), 5)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f6c")
    assert telemetry._resolve_handle(nvml, 0)[0] == ("handle", "GPU-8f6c")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert telemetry._resolve_handle(nvml, 0)[:2] == (("handle", 0), 0)


# --- status, OBS text, vcam ctl status, vcam check ----------------------------------------------


def test_status_carries_gpu_and_degraded_stages():
    s = sample(throttle=("sw_power_cap",), power_limit_w=700.0, memory_used_mib=14540.8, util_gpu_pct=87)
    st = Status(gpu=s.as_dict(), degraded=("upscale", "enhancer"), guarded={"inswapper_128": 3})
    assert status_suffix(st) == (
        " | NaN guard: inswapper_128 3 | GPU 61°C 1980 MHz 312/700 W 14.2 GiB util 87% THROTTLED: sw_power_cap"
        " | degraded: upscale, enhancer off"
    )
    assert status_suffix(Status()) == ""
    d = json.loads(json.dumps(st.as_dict()))
    assert d["degraded"] == ["upscale", "enhancer"] and d["gpu"]["throttle"] == ["sw_power_cap"]
    assert GpuSample.from_dict(d["gpu"]) == s
    # publish/read copy: nothing the frame loop holds is shared with readers
    state = RuntimeState()
    state.publish_status(st)
    st.gpu["throttle"].append("hw_thermal")
    read = state.read_status()
    assert read.gpu["throttle"] == ["sw_power_cap"] and read.degraded == ("upscale", "enhancer")
    read.gpu["temperature_c"] = 0
    assert state.read_status().gpu["temperature_c"] == 61


def test_live_stats_status_takes_gpu_and_degraded():
    live = LiveStats(RunSummary())
    assert live.status(0, {}).gpu is None and live.status(0, {}).degraded == ()
    st = live.status(2, {"classic": 0}, gpu=sample(), degraded=["upscale"])
    assert st.gpu["temperature_c"] == 61 and st.degraded == ("upscale",) and st.dropped_capture == 2
    assert live.status(0, {}, gpu=sample().as_dict()).gpu["name"] == "NVIDIA H200"


class _State:
    """What vcam.control.obs.status_text reads from its state."""

    def __init__(self, status):
        self._status, self.swap_enabled, self.active, self.mappings, self.paused = status, True, "alice", {}, False

    def read_status(self):
        return self._status


def test_obs_status_text_shows_gpu_and_degraded():
    from vcam.control.obs import status_text

    st = Status(fps_out=29.5, latency_p50_ms=41.0, gpu=sample().as_dict(), degraded=("upscale",))
    text = status_text(_State(st))  # type: ignore[arg-type]
    assert text.startswith("face: alice  swap: on  29.5 fps  41 ms  GPU 61°C 1980 MHz 312 W  degraded: upscale off  (at ")


def test_ctl_status_prints_gpu_and_degraded(monkeypatch):
    from typer.testing import CliRunner

    from vcam.cli import control

    st = Status(gpu=sample(throttle=("hw_thermal",), temperature_c=90).as_dict(), degraded=("upscale", "enhancer"))
    monkeypatch.setattr(control, "_send", lambda config, cmd, ctx=None: {"ok": True, "face": "alice", "status": st.as_dict()})
    res = CliRunner().invoke(control.ctl_app, ["status"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"]["degraded"] == ["upscale", "enhancer"]
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "note: NVIDIA H200: GPU 90°C 1980 MHz 312 W THROTTLED: hw_thermal"
    assert lines[1].startswith("note: GPU 0 is throttling for heat (hw_thermal at 90°C")
    assert lines[2].startswith("note: degraded: upscale, enhancer off (")


def _check_items(cfg):
    from vcam.runtime.check import check_telemetry

    return check_telemetry(cfg)


def test_check_item(nvml, monkeypatch):
    from vcam.config import Config

    cfg = Config()
    (item,) = _check_items(cfg)
    assert (item.name, item.level) == ("gpu telemetry", "ok")
    assert item.detail == "NVIDIA H200: GPU 61°C 1980 MHz 312/700 W 14.2 GiB util 87%"
    nvml.values["reasons"] = 0x40
    (item,) = _check_items(cfg)
    assert item.level == "warn" and "THROTTLED: hw_thermal" in item.detail and "improve cooling" in item.fix
    assert nvml.calls.count("nvmlInit") == nvml.calls.count("nvmlShutdown") == 2
    monkeypatch.setitem(sys.modules, "pynvml", None)
    (item,) = _check_items(cfg)
    assert item.level == "info" and item.fix == "pip install 'fastswap-cam[nvml]'"
    (item,) = _check_items(cfg.replace(telemetry=TelemetryConfig(enabled="off")))
    assert item.level == "info" and "off" in item.detail


@pytest.mark.gpu
def test_real_nvml_reads_this_gpu():
    try:
        import pynvml  # noqa: F401
    except ImportError:
        require("gpu", "nvidia-ml-py is not installed (pip install 'fastswap-cam[nvml]')")
    try:
        s = telemetry.probe(0)
    except telemetry.TelemetryUnavailable as exc:
        require("gpu", f"no NVIDIA GPU through NVML: {exc.message}")
    assert s.name and s.memory_total_mib and s.memory_total_mib > 0
    assert s.text().startswith("GPU ")
    json.dumps(s.as_dict())


# --- the Degrader -------------------------------------------------------------------------------

FPS = 30
DT = 1.0 / FPS
BUDGET = 0.033


def drive(deg, t0, seconds, frame_time, *, dropped=False, throttled=False):
    """Feed ``seconds`` of frames at 30 fps from ``t0``; returns (end time, [(t, Change)])."""
    changes = []
    n = round(seconds * FPS)
    for i in range(n):
        t = t0 + i * DT
        ch = deg.observe(t, frame_time=frame_time, budget=BUDGET, dropped=dropped, throttled=throttled)
        if ch is not None:
            changes.append((t, ch))
    return t0 + n * DT, changes


def make(**kw):
    args = dict(after=2.0, recover=10.0, headroom=0.6)
    args.update(kw)
    return Degrader(kw.pop("order", ["upscale", "enhancer", "occlusion", "region"]), **args)


def test_overload_turns_stages_off_in_order_with_the_after_spacing():
    deg = make(available={"upscale", "enhancer", "region"})
    t, changes = drive(deg, 0.0, 10.0, 0.050)
    assert [c.stage for _, c in changes] == ["upscale", "enhancer", "region"]  # occlusion is not configured
    assert all(not c.on for _, c in changes)
    times = [tc for tc, _ in changes]
    assert 2.0 <= times[0] < 2.2
    assert all(2.0 <= b - a < 2.2 for a, b in zip(times, times[1:]))
    assert changes[0][1].line() == "degrade: upscale off (frames over the 33 ms budget for 2.0 s)"
    assert deg.off == ("upscale", "enhancer", "region")
    _, more = drive(deg, t, 5.0, 0.050)
    assert more == []  # nothing left to turn off


def test_the_frames_are_behind_while_most_are_over_the_budget_whatever_is_left_to_turn_off():
    """``Degrader.behind`` (the frame loop tells the background work, RoundTurns.fall_behind): more
    than half the frames of the last ``after`` seconds over the budget or dropped, with no stage
    left to turn off too; a throttling GPU alone is not behind; frames within it again end it."""
    deg = make(available=set())
    t, changes = drive(deg, 0.0, 1.5, 0.050)
    assert not deg.behind  # not for `after` seconds yet
    t, changes = drive(deg, t, 1.0, 0.050)
    assert deg.behind and changes == []
    t, _ = drive(deg, t, 2.5, 0.010)
    assert not deg.behind
    t, _ = drive(deg, t, 2.5, 0.0, dropped=True)
    assert deg.behind
    t, _ = drive(deg, t, 1.0, 0.010)
    assert deg.behind  # 1 s of good frames against 1 s of dropped ones: not more than half within
    t, _ = drive(deg, t, 1.5, 0.010)
    assert not deg.behind
    throttled = make(available=set())
    drive(throttled, 0.0, 5.0, 0.010, throttled=True)
    assert not throttled.behind
    off = make(available={"upscale"}, enabled=False)  # nothing turned off, but the frames are still judged
    _, changes = drive(off, 0.0, 5.0, 0.050)
    assert off.behind and changes == [] and off.off == ()


def test_headroom_brings_them_back_last_off_first_on():
    deg = make(available={"upscale", "enhancer"})
    t, changes = drive(deg, 0.0, 4.5, 0.050)
    assert deg.off == ("upscale", "enhancer")
    last_off = changes[-1][0]
    t, changes = drive(deg, t, 25.0, 0.010)
    assert [(c.stage, c.on) for _, c in changes] == [("enhancer", True), ("upscale", True)]
    assert changes[0][0] - last_off >= 10.0 and changes[1][0] - changes[0][0] >= 10.0
    assert changes[0][1].line() == "degrade: enhancer back on (headroom for 10 s)"
    assert deg.off == ()


def test_no_headroom_while_frames_are_near_the_budget():
    deg = make(available={"upscale"})
    t, _ = drive(deg, 0.0, 3.0, 0.050)
    assert deg.off == ("upscale",)
    _, changes = drive(deg, t, 30.0, 0.025)  # under the budget, above 0.6 of it
    assert changes == [] and deg.off == ("upscale",)


def test_alternating_load_does_not_flap():
    deg = make(available={"upscale", "enhancer"})
    changes = []
    for i in range(600):  # one frame in three over the budget: not more than half
        ch = deg.observe(i * DT, frame_time=0.050 if i % 3 == 0 else 0.010, budget=BUDGET, dropped=False, throttled=False)
        changes += [ch] if ch else []
    assert changes == []
    deg, t = make(available={"upscale", "enhancer"}), 0.0
    for _ in range(10):  # bursts of overload, less than half of any `after` window, then calm
        t, ch1 = drive(deg, t, 0.9, 0.050)
        t, ch2 = drive(deg, t, 1.2, 0.010)
        changes += ch1 + ch2
    assert changes == []
    deg, t = make(available={"upscale", "enhancer"}), 0.0
    for _ in range(10):  # overload long enough, calm too short: stages go off one at a time and stay off
        t, ch1 = drive(deg, t, 3.0, 0.050)
        t, ch2 = drive(deg, t, 3.0, 0.010)
        changes += ch1 + ch2
    assert [(c.stage, c.on) for _, c in changes] == [("upscale", False), ("enhancer", False)]
    assert changes[1][0] - changes[0][0] >= 2.0


def test_a_stage_the_load_cannot_carry_waits_longer_to_come_back():
    deg = make(available={"upscale"})
    t, _ = drive(deg, 0.0, 3.0, 0.050)
    t, changes = drive(deg, t, 12.0, 0.010)
    assert [(c.stage, c.on) for _, c in changes] == [("upscale", True)]
    t, changes = drive(deg, t, 3.0, 0.050)  # back on, and the frames are over the budget again
    assert [(c.stage, c.on) for _, c in changes] == [("upscale", False)]
    off_at = changes[0][0]
    t, changes = drive(deg, t, 30.0, 0.010)
    assert changes[0][1] == Change("upscale", True, "headroom for 20 s") and changes[0][0] - off_at >= 20.0


def test_throttling_alone_counts_as_overload():
    deg = make(available={"upscale", "enhancer"})
    t, changes = drive(deg, 0.0, 1.5, 0.005, throttled=True)
    assert changes == []
    t, changes = drive(deg, t, 2.6, 0.005, throttled=True)
    assert [c.stage for _, c in changes] == ["upscale", "enhancer"]
    assert changes[0][1].reason == "GPU throttling for 2.0 s"
    t, changes = drive(deg, t, 12.0, 0.005, throttled=True)
    assert changes == []  # no headroom while the GPU throttles, however fast the frames
    _, changes = drive(deg, t, 10.5, 0.005)
    assert [(c.stage, c.on) for _, c in changes] == [("enhancer", True)]


def test_dropped_frames_count_as_over_budget():
    deg = make(available={"upscale"})
    _, changes = drive(deg, 0.0, 3.0, 0.001, dropped=True)
    assert [c.stage for _, c in changes] == ["upscale"]


def test_a_stage_the_pipeline_refuses_is_left_alone():
    deg = make(available={"upscale", "enhancer"})
    t, changes = drive(deg, 0.0, 2.5, 0.050)
    assert [c.stage for _, c in changes] == ["upscale"]
    deg.drop_stage("upscale")  # set_stage("upscale", False) failed
    assert deg.off == ()
    _, changes = drive(deg, t, 20.0, 0.050)
    assert [c.stage for _, c in changes] == ["enhancer"]


def test_disabled_does_nothing():
    deg = make(enabled=False)
    _, changes = drive(deg, 0.0, 20.0, 0.5, throttled=True)
    assert changes == [] and deg.off == ()


def test_degrader_from_config_and_available_stages():
    from vcam.config import Config, MaskConfig, SwapConfig, UpscaleConfig
    from vcam.runtime.degrade import available_stages

    cfg = Config()
    assert available_stages(cfg) == set()
    cfg = cfg.replace(
        upscale=UpscaleConfig(model="real_esrgan_x2"),
        swap=SwapConfig(enhancer="gfpgan_1.4"),
        mask=MaskConfig(types=["box", "occlusion"]),
    )
    assert available_stages(cfg) == {"upscale", "enhancer", "occlusion"}
    deg = Degrader.from_config(DegradeConfig(), available_stages(cfg))
    assert deg.order == ("upscale", "enhancer", "occlusion", "region", "swap") and deg.after == 2.0 and deg.enabled
    assert not Degrader.from_config(DegradeConfig(enabled=False)).enabled
    assert not Degrader.from_config(DegradeConfig(), enabled=False).enabled


def _nearly_still(deg, t0, seconds, sent_every):
    """``seconds`` of 30 fps frames over the budget, one in ``sent_every`` published (late), the rest
    dropped; returns (end time, [(t, Change)])."""
    changes = []
    n = round(seconds * FPS)
    for i in range(n):
        t = t0 + i * DT
        ch = deg.observe(t, frame_time=0.2, budget=BUDGET, dropped=i % sent_every != 0, throttled=False)
        if ch is not None:
            changes.append((t, ch))
    return t0 + n * DT, changes


def test_the_swap_is_the_last_resort_only_when_the_camera_nearly_stands_still():
    from vcam.runtime.degrade import LAST_RESORT_SPAN

    span = 2.0 * LAST_RESORT_SPAN
    # Every frame over the budget but still going out at 30 fps: the other stages go, the swap stays.
    deg = Degrader(["upscale", "swap"], after=2.0, recover=10.0, headroom=0.6, available={"upscale", "swap"})
    _, changes = drive(deg, 0.0, 2.0 + span + 2.0, 0.050)
    assert [(c.stage, c.on) for _, c in changes] == [("upscale", False)]
    # One frame a second going out (the rest over the budget, dropped): after 3 x `after`, the swap goes.
    deg = Degrader(["upscale", "swap"], after=2.0, recover=10.0, headroom=0.6, available={"upscale", "swap"})
    _, changes = _nearly_still(deg, 0.0, 2.0 + span + 1.0, 30)
    assert [(c.stage, c.on) for _, c in changes] == [("upscale", False), ("swap", False)]
    (t_up, _), (t_swap, swap) = changes
    assert 2.0 <= t_up < 2.2 and span <= t_swap - t_up < span + 0.2
    assert swap.line() == f"degrade: swap off (1.0 frames a second went out for {span:.1f} s)"
    # A still moment after a good spell is not enough: most of the span must be over the budget.
    deg = Degrader(["swap"], after=2.0, recover=10.0, headroom=0.6, available={"swap"})
    t, _ = drive(deg, 0.0, 8.0, 0.010)
    t, changes = _nearly_still(deg, t, 2.5, 30)
    assert changes == []


def test_the_status_line_counts_the_early_frames_of_an_early_swap_as_the_camera_moving():
    """While an early swap's CPU swap races the budget, the frames that go out pixelated move the
    camera: the status line's in/out rates and latencies count them, the swapped counts do not (on
    the H200 the line said "out 0.0 fps" while 25 early frames a second went out)."""
    live = LiveStats(RunSummary())
    for i in range(30):
        live.published_early(i / 30, i / 30 + 0.004)
    st = live.status(0, {})
    assert st.fps_out == pytest.approx(30.0) and st.fps_in == pytest.approx(30.0)
    assert st.frames_out == 0 and st.frames_in == 0
    assert st.latency_p99_ms == pytest.approx(4.0)
