"""One typed, immutable config object built from config.toml plus CLI overrides.

Precedence (later wins): built-in defaults < the config file < CLI flags. The file is, in order,
``--config PATH``, ``$VCAM_CONFIG``, or ``config.toml`` in the user config dir (platformdirs, through
:mod:`vcam.platform.folders`) if it exists. Every setting is declared once, here, with its type,
default, allowed range and doc; the shipped ``config.toml`` documents the same defaults and a test
keeps the two in step.

Errors name the file, table, key, what was expected and, for a likely typo, the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vcam.platform import folders
from vcam.types import OPTIONAL_STAGES

APP = "vcam"


class Duration(float):
    """Seconds, parsed from ``"33ms"``, ``"0.5s"``, ``"2m"`` or a bare number of seconds."""

    _RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s|m)?\s*$")
    _UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, None: 1.0}

    @classmethod
    def parse(cls, value: Any) -> Duration:
        if isinstance(value, bool):
            raise ValueError("a duration like '33ms' or '0.5s'")
        if isinstance(value, (int, float)):
            return cls(float(value))
        if isinstance(value, str):
            m = cls._RE.match(value)
            if m:
                return cls(float(m.group(1)) * cls._UNITS[m.group(2)])
        raise ValueError("a duration like '33ms' or '0.5s'")

    def __str__(self) -> str:
        return f"{self * 1000:g}ms" if self < 1 else f"{float(self):g}s"


def _opt(
    default: Any, doc: str, *, min: float | None = None, max: float | None = None, keys: tuple[str, ...] | None = None
) -> Any:
    meta = {"doc": doc, "min": min, "max": max, "keys": keys}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class CaptureConfig:
    input: str = _opt("webcam", "Frame source: webcam[:N], a video or image PATH, 'demo' or 'pattern'.")
    width: int = _opt(1280, "Requested camera width in pixels.", min=16, max=8192)
    height: int = _opt(720, "Requested camera height in pixels.", min=16, max=8192)
    fps: float = _opt(30.0, "Requested camera frame rate.", min=1, max=240)
    fourcc: str = _opt("MJPG", "Camera pixel format to request (MJPG, YUYV).")
    decode: Literal["auto", "gpu", "cpu"] = _opt(
        "auto",
        "Where MJPG frames (a camera's MJPG, a Motion-JPEG file) are decoded: 'gpu' with nvJPEG (needs torchvision), "
        "'cpu' with OpenCV, 'auto' = gpu when the pipeline runs on CUDA and nvJPEG works there. The latency clock "
        "starts when the JPEG arrives, before the decode.",
    )
    loop: bool = _opt(
        True, "Loop video files and the demo clip (not when converting to a file: every frame is then written once)."
    )
    pacing: Literal["auto", "realtime", "fast"] = _opt(
        "auto",
        "How files, images, the demo and the pattern are delivered: 'realtime' at their frame rate, the newest frame "
        "winning (as a camera); 'fast' frame by frame as fast as the pipeline goes, every frame once and in order; "
        "'auto' = fast when the output is a file (the input then plays once), realtime otherwise. A camera is always realtime.",
    )


@dataclass(frozen=True)
class PipelineConfig:
    device: Literal["auto", "cpu", "cuda"] = _opt("auto", "Where frames are processed.")
    backend: Literal["auto", "tensorrt", "torch", "onnxruntime"] = _opt(
        "auto",
        "Inference backend of every model (auto: on CUDA TensorRT, then PyTorch, then onnxruntime's CUDA provider; "
        "on the CPU onnxruntime, then PyTorch).",
    )
    fp16: bool = _opt(False, "Run neural models in FP16 (GPU only; warns and runs FP32 on the CPU).")
    max_latency: Duration = _opt(Duration(0.1), "Drop a frame older than this when it would be published (0: off).", min=0)
    max_faces: int = _opt(8, "Most faces swapped per frame.", min=1, max=64)
    batch_deadline: Duration = _opt(
        Duration(0.002),
        "Several streams: how long the frame loop waits for the other streams' frames once one is ready, so that "
        "their faces go through the swapper in one batch; a stream never waits longer (0: take what is ready).",
        min=0,
        max=0.1,
    )
    early_frames: Literal["swap", "pixelate", "camera", "off"] = _opt(
        "swap",
        "While the models load, publish the camera so a video call shows a picture within a second of the start: "
        "'swap' swaps it on the CPU (NumPy, onnxruntime) where every model the run needs runs on onnxruntime "
        "(the detector, the swapper, the recogniser: no enhancer, model masks or landmarker) and it runs on a GPU, "
        "and switches to the GPU between two frames once that is loaded (a swap network: a few frames a second "
        "until then); elsewhere as 'pixelate'; 'pixelate' in coarse blocks (no face can be "
        "recognised), 'camera' as it is (unswapped), 'off' nothing until the first swapped frame. Live runs without "
        "a frame enhancer; a file conversion is swapped throughout.",
    )
    compile: Literal["auto", "background", "load", "build", "off"] = _opt(
        "auto",
        "Compiled swap network (the inswapper on the PyTorch backend; on an H200 1.2 ms a face instead of 1.9): "
        "'auto' loads the batch sizes compiled for this GPU, driver, torch and Triton in the background, and on a GPU "
        "compiles the missing ones in the background on first use (other processes, at a lower priority; frames run "
        "uncompiled meanwhile, `vcam ctl status` and the OBS text say 'compiling engines: 2/4, ~40 s left', each size "
        "is put into use once built; a failed build is remembered and not retried); 'background' also compiles on the "
        "CPU; 'load' only loads what `vcam engines build` compiled; 'build' compiles the missing ones before swapping; "
        "'off' never. Flag: --compile.",
    )
    band: bool = _opt(
        True,
        "Move a frame swapped with predicted faces in two row bands: the rows around the faces are uploaded and "
        "converted first and the swap starts on them, while the rest of the frame is uploaded, converted and "
        "downloaded beside the swap (on a GPU most of a 1080p frame's transfers leave its latency); false: whole "
        "frames.",
    )


@dataclass(frozen=True)
class DetectConfig:
    model: str = _opt(
        "retinaface_mnet025", "Face detector: the embedded 'retinaface_mnet025' or a detector model from `vcam models list`."
    )
    size: int = _opt(
        640,
        "Input size (long side) of a full scan's coarse pass over the whole frame. It finds faces down to about "
        "20/size of the frame's long side (60 px in 1080p at 640); smaller ones come from the tiles (`small_face`). "
        "Larger: a slower coarse pass that needs fewer tiles.",
        min=64,
        max=2048,
    )
    score: float = _opt(0.6, "Minimum face score.", min=0.0, max=1.0)
    nms_iou: float = _opt(0.4, "IoU above which overlapping detections are merged.", min=0.0, max=1.0)
    min_face: int = _opt(20, "Smallest face (box side, pixels) that is kept.", min=1)
    small_face: int = _opt(
        40,
        "Smallest face (pixels) a full scan must find. Where `size` is too coarse for it (large frames), full scans "
        "add tiles of the frame at a finer scale; faces down to max(small_face, long side / 64) are found "
        "(40 px at 1080p, 60 at 4K). A new face smaller than 3/4 of that starts no track (a crowd far away, a "
        "cartoon on a poster: seen only near a tracked face, never by the search); a tracked face that shrinks "
        "below it stays tracked.",
        min=8,
    )
    fp16: bool = _opt(
        False,
        "Run the detector in FP16 too when --fp16 is on. Off by default: the detector is small, and on an H200 its "
        "FP16 convolutions cost about 8 s of cuDNN kernel compilation at every start for a fraction of a millisecond "
        "a frame.",
    )


@dataclass(frozen=True)
class TrackConfig:
    rescan_every: int = _opt(
        30,
        "A full scan (the coarse pass plus the tiles) every N frames, at start, when a track is lost, and every "
        "other frame while no face is tracked; in between, only the tracked faces' regions and the `rolling` slice run "
        "(with `search` in a worker, tracked frames have no scheduled scan: the worker's slices cover the frame).",
        min=1,
    )
    rolling: int = _opt(
        5,
        "While faces are tracked, the frame is searched for new faces again over this many frames, a fixed slice "
        "(the coarse scan, or a share of the tiles) each frame, so a new face is found within that many frames; "
        "0: new faces wait for the next full scan.",
        min=0,
        max=120,
    )
    search: Literal["auto", "worker", "frame"] = _opt(
        "auto",
        "Where the rolling search runs. 'worker': a thread beside the frame with its own detector (one CPU thread); "
        "each slice's faces are taken two frames after it, the cycle is two frames shorter (new faces come as soon) "
        "and tracked frames need no scheduled full scan (CPU only); 'frame': in the frame's own detector call; "
        "'auto': a worker on the CPU with two cores or more when other programs leave one idle during the start "
        "(their CPU time and running threads since vcam started; the frame's own work keeps one core busy), else the "
        "frame; the frame on a GPU.",
    )
    roi_scale: float = _opt(2.0, "ROI side as a multiple of the tracked box's longer side.", min=1.0, max=6.0)
    roi_size: int = _opt(160, "Side the ROI crop is resized to for detection.", min=64, max=1024)
    max_missed: int = _opt(2, "Frames a track survives without a detection.", min=0)
    predict: Literal["auto", "on", "off"] = _opt(
        "auto",
        "Swap a frame with its faces predicted from the frames before (their motion) while its own detection runs "
        "beside the swap, correcting the next frame; only while every tracked face was found in the last frame (a new, "
        "lost or first face waits for its detection). 'auto': where the device runs both at once (CUDA); 'on': also "
        "on the CPU (no gain there); 'off': every frame waits for its own detection.",
    )
    min_cutoff: float = _opt(
        0.2,
        "The face's smoothing: cutoff (Hz) of the head pose's filter at rest; lower removes more jitter (a moving "
        "head is followed by its velocity, without lag).",
        min=0.001,
    )
    beta: float = _opt(
        2.0,
        "The face's smoothing: how much the cutoff rises (Hz) per face size a second the head moves; higher follows "
        "a head that speeds up or turns back sooner, lower keeps a moving paste steadier.",
        min=0.0,
    )
    confirm_hits: int = _opt(
        2,
        "A new face is swapped (and counted) once confirmed: this many detections whose landmarks make a face "
        "within its first confirm_within frames, one more where none scores confirm_score (1: at once).",
        min=1,
        max=10,
    )
    confirm_score: float = _opt(
        0.9,
        "A new face none of whose detections scored at least this needs one hit more; a hit scores within 0.1 of it.",
        min=0.0,
        max=1.0,
    )
    confirm_at_once: float = _opt(
        0.95,
        "Or it is swapped at once when its first detection scores at least this and its landmarks make a face "
        "(objects among real photographs were first found at up to 0.92).",
        min=0.0,
        max=1.0,
    )
    confirm_within: int = _opt(5, "Frames a new face has to be confirmed in, else it is dropped.", min=1, max=60)


@dataclass(frozen=True)
class SwapConfig:
    swapper: str = _opt("classic", "Swapper: 'classic' (no model needed) or a swapper model name.")
    source: str = _opt(
        "",
        "Active source face: a face-bank name or an image path ('' : none, frames pass through until a face is chosen "
        "with `vcam ctl face` or OBS; the demo face for --input demo).",
    )
    pick: int = _opt(
        0,
        "Which face of a source photo holding several (1 = leftmost); 0: the photo must show one face "
        "(a group photo is refused, listing its faces).",
        min=0,
        max=256,
    )
    faces: Literal["all", "largest", "reference"] = _opt("all", "Which faces to swap.")
    reference: str = _opt("", "Reference face (bank name or image path) for faces = 'reference'.")
    reference_threshold: float = _opt(0.3, "Minimum similarity to the reference face.", min=-1.0, max=1.0)
    blur: float = _opt(0.3, "Feather of the paste mask as a fraction of the crop half-size.", min=0.0, max=1.0)
    color_match: bool = _opt(True, "Classic swap: match source colours to the target face (CIE L*a*b* statistics).")
    seamless: bool = _opt(
        False, "Classic swap: also carry the target's lighting across the face (gradient-domain blend; costs more)."
    )
    local_color: bool = _opt(
        True,
        "Classic swap: match light and colour locally too (the difference from the target blurred over about a quarter "
        "of the face, added to the swapped face), not only on average; part of color_match (off when it is off).",
    )
    crop_size: int = _opt(128, "Classic swap crop size in pixels.", min=32, max=1024)
    enhancer: str = _opt("", "Face enhancer model run after the swap ('' : off; e.g. 'gfpgan_1.4').")
    enhancer_amount: float = _opt(0.8, "How much of the enhanced face is blended in (0..1).", min=0.0, max=1.0)
    fp32: bool = _opt(
        False,
        "Run the swapper in FP32 even with --fp16 (the other models stay FP16): the escape when FP16 output looks "
        "wrong without being NaN. Flag: --fp32-swapper.",
    )
    map_threshold: float = _opt(0.35, "Minimum similarity of a face in frame to a [[swap.map]] target.", min=-1.0, max=1.0)
    unmatched: Literal["active", "keep"] = _opt(
        "active", "With [[swap.map]] entries: faces matching no target get the active face ('active') or stay ('keep')."
    )
    map: list[dict] = _opt(
        [],
        "Per-person mapping, as [[swap.map]] tables below [swap] with 'target' (a face-bank name or a photo of the "
        "person in frame) and 'source' (the face they get); each person recognised as a target gets their own source.",
        keys=("target", "source"),
    )


MASK_TYPES = ("box", "face", "mouth", "eyes", "occlusion", "region")
REGIONS = ("skin", "brows", "eyes", "glasses", "nose", "mouth", "lips", "ears", "hair", "neck")


@dataclass(frozen=True)
class MaskConfig:
    types: list[Literal["box", "face", "mouth", "eyes", "occlusion", "region"]] = _opt(
        ["box", "face"],
        "Paste masks, multiplied together (--mask box,face,mouth): 'box' the feathered crop square ([swap] blur, "
        "box_padding); 'face' brows-to-chin and cheek-to-cheek from the landmarks; 'mouth' keeps the target's own "
        "mouth; 'eyes' keeps the target's own eyes (with a landmarker: as far as they are shut or cast down); "
        "'occlusion' keeps hands, glasses and microphones in front of the face (the occluder model); 'region' "
        "only the face-parser classes in 'regions'. Masks not listed cost nothing.",
    )
    box_padding: list[float] = _opt(
        [0.0, 0.0, 0.0, 0.0],
        "Box mask padding per side (top, right, bottom, left) in percent of the crop.",
        min=0,
        max=50,
        keys=("top", "right", "bottom", "left"),
    )
    face_feather: float = _opt(
        0.06, "Feather of the face and mouth masks as a fraction of the eye-to-mouth distance.", min=0.0, max=1.0
    )
    face_scale: float = _opt(1.0, "Size of the face mask relative to the face the landmarks describe.", min=0.5, max=1.5)
    mouth_scale: float = _opt(1.0, "Size of the mouth opening (1: the lips corner to corner).", min=0.3, max=3.0)
    landmarker: str = _opt(
        "", "Dense landmark model ('' : the 5 detector points; e.g. '2dfan4') used by the face and mouth masks."
    )
    occluder: str = _opt("xseg_1", "Occlusion model for the 'occlusion' mask.")
    parser: str = _opt("bisenet_resnet_34", "Face-parser model for the 'region' mask.")
    regions: list[Literal["skin", "brows", "eyes", "glasses", "nose", "mouth", "lips", "ears", "hair", "neck"]] = _opt(
        ["skin", "brows", "eyes", "nose", "lips"], "Face-parser classes the 'region' mask keeps."
    )


@dataclass(frozen=True)
class OutputConfig:
    target: str = _opt("vcam", "Where frames go: vcam, file:PATH, window, null, or obs-source (an OBS Browser Source).")
    device_name: str = _opt("FastSwap Cam", "Virtual camera name (Linux: the v4l2loopback card label).")
    backend: Literal["auto", "v4l2loopback", "unitycapture", "obs"] = _opt(
        "auto",
        "Virtual camera backend. auto: v4l2loopback on Linux; on Windows Unity Capture when it is registered under "
        "device_name (apps list that name), else OBS's virtual camera (apps list \"OBS Virtual Camera\" and OBS's own "
        "virtual camera must be off); on macOS OBS's. `vcam check` says which one works here.",
    )
    pixel_format: Literal["auto", "I420", "NV12", "RGB"] = _opt(
        "auto", "Virtual camera pixel format (auto: what the device takes)."
    )
    fps: float = _opt(0.0, "Output frame rate (0: the input's).", min=0, max=240)
    record_dir: str = _opt(
        "",
        "Folder of the recordings started from the desk (`vcam ctl record on`, the panel, OBS): one file per start, "
        "vcam-STREAM-DATE-TIME.mp4 ('' : ~/Videos where it exists, else the home folder).",
    )
    chroma: Literal["420", "444"] = _opt(
        "420",
        "File output chroma: '420' (yuv420p, which every H.264 player decodes; an odd size is padded to even with the "
        "edge pixels) or '444' (yuv444p, H.264 High 4:4:4 at the exact size; many players cannot decode it).",
    )


@dataclass(frozen=True)
class UpscaleConfig:
    model: str = _opt(
        "",
        "Frame enhancer: a super-resolution model from `vcam models list --kind upscaler` run on the whole output "
        "frame ('' : off; e.g. 'real_esrgan_x2'). The output is the input times the model's scale.",
    )
    tile: int = _opt(256, "Tile side in input pixels (memory is bounded by tile and batch, not the frame).", min=32, max=2048)
    overlap: int = _opt(32, "Overlap of neighbouring tiles in input pixels, blended with feathered weights.", min=0, max=512)
    batch: int = _opt(4, "Tiles per engine call.", min=1, max=64)
    drop_first: bool = _opt(
        True,
        "When a frame would miss the latency budget, skip the enhancer for it (a plain resize to the output size) "
        "before dropping frames.",
    )


@dataclass(frozen=True)
class TelemetryConfig:
    enabled: Literal["auto", "on", "off"] = _opt(
        "auto",
        "GPU telemetry through NVML (temperature, clocks, power, memory, utilisation, throttling): 'auto' when the "
        "nvidia-ml-py package and an NVIDIA GPU are there, 'on' warns when they are not.",
    )
    interval: Duration = _opt(Duration(0.5), "How often NVML is sampled (off the frame loop).", min=0.1, max=60)


@dataclass(frozen=True)
class DegradeConfig:
    enabled: bool = _opt(
        True, "Under sustained overload or GPU throttling, turn optional stages off (in 'order') and back on with headroom."
    )
    order: list[Literal["upscale", "enhancer", "occlusion", "region", "swap"]] = _opt(
        [*OPTIONAL_STAGES, "swap"],
        "Which stages go first: 'upscale' the frame enhancer, 'enhancer' the face enhancer, 'occlusion' and 'region' the "
        "model masks; 'swap', the last resort, publishes the camera as the early frames do ([pipeline] early_frames: "
        "pixelated, or as it is with 'camera'; never with 'off') until there is headroom again. Leave 'swap' out to keep "
        "swapping late.",
    )
    after: Duration = _opt(Duration(2.0), "Overload lasting this long turns the next stage off.", min=0.1)
    recover: Duration = _opt(Duration(10.0), "Headroom lasting this long brings the last stage turned off back.", min=0.1)
    headroom: float = _opt(
        0.6, "Headroom: the frame time (p90) below this fraction of the latency budget (or the frame interval).", min=0.1, max=1.0
    )


@dataclass(frozen=True)
class EngineConfig:
    """How one model role runs (``[engines.ROLE]``); today the swapper's."""

    backend: Literal["", "auto", "tensorrt", "torch", "onnxruntime", "remote"] = _opt(
        "",
        "Inference backend of this role ('' : [pipeline] backend). 'remote': a KServe V2 server (NVIDIA Triton, "
        "`vcam serve`) at 'url' runs it; never chosen by 'auto' (faces leave the machine only when set here).",
    )
    url: str = _opt(
        "",
        "remote: grpc://127.0.0.1:8001 on this machine; another host needs grpcs://HOST:PORT with a token or a "
        "client certificate (plain gRPC to another host is refused: faces are biometric data).",
    )
    model: str = _opt("", "remote: the served model's name ('' : the role's model, e.g. inswapper_128).")
    timeout: Duration = _opt(
        Duration(0.1),
        "remote: longest wait for an answer (the frame's budget for the server); faces without one take on_fault.",
        min=0.001,
        max=60,
    )
    token_env: str = _opt("VCAM_REMOTE_TOKEN", "remote: environment variable holding the bearer token.")
    token: str = _opt("", "remote: bearer token (prefer token_env: a config file is easily shared).")
    ca: str = _opt("", "remote: CA certificate (PEM) the server's certificate is checked against ('' : the system's).")
    cert: str = _opt("", "remote: client certificate (PEM) for mutual TLS ('' : none).")
    key: str = _opt("", "remote: the client certificate's private key (PEM).")
    on_fault: Literal["local", "pixelate", "pass"] = _opt(
        "local",
        "remote: faces without a good answer within 'timeout' (server late, down, an error, a malformed answer): "
        "'local' swaps them here (the local GPU engine on a GPU, else the classic swap), 'pixelate' blanks them, "
        "'pass' sends the camera's real face (a warning at start). Counted: 'remote late/down, swapped locally N'; "
        "one line when the server goes down and one when it is back.",
    )


@dataclass(frozen=True)
class EnginesConfig:
    """Per-role engine settings, as ``[engines.ROLE]`` tables."""

    swapper: EngineConfig = field(default_factory=EngineConfig)


@dataclass(frozen=True)
class FacesConfig:
    dir: str = _opt("", "Face bank directory ('' : the user data dir).")


@dataclass(frozen=True)
class ModelsConfig:
    dir: str = _opt("", "Model directory ('' : the user data dir).")
    allow_download: bool = _opt(False, "Download missing models without asking.")
    mirror: str = _opt("", "URL template tried before the official hosts, e.g. 'http://mirror.lan/{base}/{file}' ('' : none).")
    sha256: dict = _opt(
        {}, "Pinned SHA-256 per model file name, checked whenever the file changes (size or time) or the pin does."
    )


@dataclass(frozen=True)
class ObsConfig:
    enabled: bool = _opt(False, "Connect to OBS over obs-websocket 5.")
    host: str = _opt("127.0.0.1", "OBS websocket host.")
    port: int = _opt(4455, "OBS websocket port.", min=1, max=65535)
    password: str = _opt("", "OBS websocket password (prefer the environment variable below).")
    password_env: str = _opt("VCAM_OBS_PASSWORD", "Environment variable read for the password.")
    scene: str = _opt("FastSwap Faces", "Scene holding one image source per face.")
    status_source: str = _opt("FastSwap Status", "Text source updated with face, fps and latency ('' : off).")
    source: bool = _opt(
        False,
        "Serve the published frames to an OBS Browser Source (MJPEG on the panel's server, full size and rate; "
        "`vcam obs setup` adds the source): OBS shows vcam without a virtual camera. `--output obs-source` does "
        "this and publishes no virtual camera.",
    )
    audio_sync: list[str] = _opt(
        [],
        "OBS audio inputs (e.g. 'Mic/Aux') whose sync offset vcam keeps at the video's delay: its measured "
        "capture-to-publish time plus the camera's frame time, updated when that moves by more than 4 ms (at most "
        "every 3 s); each input's own offset is put back when vcam stops. The panel's audio sync switch pauses it.",
    )

    def for_stream(self, name: str, count: int) -> ObsConfig:
        """The OBS names of stream ``name`` when the daemon runs ``count`` streams: with several,
        each stream has its own control scene and status source, '<scene> (<name>)'."""
        if count <= 1:
            return self
        return dataclasses.replace(
            self,
            scene=f"{self.scene} ({name})",
            status_source=f"{self.status_source} ({name})" if self.status_source else "",
        )


@dataclass(frozen=True)
class ControlConfig:
    socket: str = _opt(
        "",
        "Local control socket path ('': $XDG_RUNTIME_DIR/vcam.sock, or ~/.local/state/vcam/run/vcam.sock without "
        "XDG_RUNTIME_DIR). Its folder must be yours and not writable by others.",
    )


@dataclass(frozen=True)
class PanelConfig:
    enabled: bool = _opt(True, "Serve the control panel (faces, mapping, preview, health) in the browser and OBS docks.")
    host: str = _opt(
        "127.0.0.1",
        "Address the panel listens on. Anything but loopback (127.0.0.1, ::1, localhost) needs tls_cert and tls_key.",
    )
    port: int = _opt(
        8765,
        "Panel port (0: any free port; `vcam panel` prints the URL). The default taken by another vcam: a free port, "
        "said in one line. $VCAM_PANEL_PORT replaces this default.",
        min=0,
        max=65535,
    )
    tls_cert: str = _opt("", "TLS certificate (PEM) for a panel on a non-loopback host ('' : plain HTTP on loopback).")
    tls_key: str = _opt("", "TLS private key (PEM) for tls_cert.")
    keep_token: bool = _opt(
        False,
        "Reuse the previous run's access token, and let a page keep the pairing key in its storage, so an OBS dock"
        " reloaded by OBS reconnects without a fresh link (README: its cost); false: a new token per run.",
    )


@dataclass(frozen=True)
class StatusConfig:
    interval: Duration = _opt(Duration(1.0), "How often the live status line is refreshed.", min=0.05)


@dataclass(frozen=True)
class StreamConfig:
    """One input/output pair of a daemon running several streams (``[[streams]]``); what a stream
    leaves out comes from ``[capture]``, ``[output]``, ``[swap] source`` and ``[pipeline]``."""

    name: str = _opt("", "Stream name for `vcam ctl --stream NAME` and its OBS scene ('' : s1, s2, ... by position).")
    input: str = _opt("", "Its frame source, as [capture] input.")
    output: str = _opt("", "Where its frames go, as [output] target; 'vcam:LABEL' picks the virtual camera labelled LABEL.")
    face: str = _opt("", "Its starting face ('' : [swap] source).")
    max_latency: Duration | None = _opt(None, "Its latency budget, e.g. '33ms' ('' : [pipeline] max_latency).")


STREAM_KEYS = tuple(f.name for f in dataclasses.fields(StreamConfig))


@dataclass(frozen=True)
class Config:
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    detect: DetectConfig = field(default_factory=DetectConfig)
    track: TrackConfig = field(default_factory=TrackConfig)
    swap: SwapConfig = field(default_factory=SwapConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    faces: FacesConfig = field(default_factory=FacesConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    obs: ObsConfig = field(default_factory=ObsConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    panel: PanelConfig = field(default_factory=PanelConfig)
    status: StatusConfig = field(default_factory=StatusConfig)
    upscale: UpscaleConfig = field(default_factory=UpscaleConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    degrade: DegradeConfig = field(default_factory=DegradeConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    streams: tuple[StreamConfig, ...] = field(default=(), metadata={"array": True})
    source_path: str = field(default="", metadata={"internal": True})

    # Derived paths -------------------------------------------------------------------------
    @property
    def faces_dir(self) -> Path:
        return Path(self.faces.dir).expanduser() if self.faces.dir else folders.data_dir() / "faces"

    @property
    def models_dir(self) -> Path:
        return Path(self.models.dir).expanduser() if self.models.dir else folders.data_dir() / "models"

    @property
    def socket_path(self) -> Path:
        """``[control] socket``, else ``vcam.sock`` in the runtime folder (``$XDG_RUNTIME_DIR``, else,
        for su, ssh, cron or Windows, ``run`` in the user's state folder: ``~/.local/state/vcam/run``),
        never a guessable /tmp path another user could create first. On Windows the file holds the
        loopback port and token of the control transport (:mod:`vcam.platform.transport`)."""
        if self.control.socket:
            return Path(self.control.socket).expanduser()
        return folders.runtime_dir() / "vcam.sock"

    @property
    def panel_file(self) -> Path:
        """Where a running daemon keeps its panel URL and token (mode 0600, beside the control socket)."""
        sock = self.socket_path
        return sock.with_name(sock.name + ".panel")

    @property
    def source_key_file(self) -> Path:
        """Where the OBS source's key is kept across runs (mode 0600, beside the control socket)."""
        sock = self.socket_path
        return sock.with_name(sock.name + ".sourcekey")

    @property
    def obs_source(self) -> bool:
        """Whether a run serves the direct OBS source: ``[obs] source``, or a stream's output is
        ``obs-source``."""
        return self.obs.source or any((s.output.target or "").strip().lower() == "obs-source" for _, s in self.per_stream())

    def replace(self, **sections: Any) -> Config:
        return dataclasses.replace(self, **sections)

    def per_stream(self) -> list[tuple[str, Config]]:
        """``(name, config)`` per stream: each ``[[streams]]`` row applied over this config (its input,
        output, face and budget); without streams, this config alone as stream ``s1``."""
        if not self.streams:
            return [("s1", self)]
        out = []
        for st in self.streams:
            target, device_name = st.output.strip(), self.output.device_name
            if target.lower().startswith("vcam:"):
                target, device_name = "vcam", target.split(":", 1)[1].strip() or device_name
            cfg = dataclasses.replace(
                self,
                capture=dataclasses.replace(self.capture, input=st.input),
                output=dataclasses.replace(self.output, target=target, device_name=device_name),
                swap=dataclasses.replace(self.swap, source=st.face or self.swap.source),
                pipeline=dataclasses.replace(
                    self.pipeline,
                    max_latency=st.max_latency if st.max_latency is not None else self.pipeline.max_latency,
                ),
            )
            out.append((st.name, cfg))
        return out


SECTIONS: dict[str, type] = {
    f.name: f.type for f in dataclasses.fields(Config) if not f.metadata.get("internal") and not f.metadata.get("array")
}
