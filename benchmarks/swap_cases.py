"""Before/after pictures and figures of the classic swap on hard real-photo cases (issue 40, items
3-5): a three-quarter face, a near-profile downcast face, a cap's brim and glasses.

    python -m benchmarks.swap_cases OUT_DIR [--json F] [--before OTHER_OUT_DIR]

Every target is a real photograph: the portraits the project ships (``vcam/assets``) and
scikit-image's ``camera`` (a man looking down into a camera's viewfinder, near profile, 2x up).
Grace Hopper's portrait is the brim and glasses case (her cap's peak and her glasses are real). What
is made up, and said so: the three-quarter astronaut is her frontal photo turned 35 degrees by a
depth model (an ellipsoid head with a nose, :func:`turned`). Each case is swapped with the default
classic pipeline (``box, face`` masks on the CPU), and with the eye mask where the build has it;
writes ``<case>.png`` (the target's face region | the swap) and ``swap_occluders.png``
(:func:`occluders`), and prints the figures:

- ``folds``: cells of the warp over the target's face that turn over (:func:`vcam.stages.swap_classic.folds`),
  ``folds_unposed``: the same for the warp that takes every face as frontal (the warp of before);
- ``self_err``: for the turned astronaut swapped with her own frontal photo, the mean absolute
  difference from the target inside its face (the swap should give the target back);
- ``edge``: the mean absolute step in lightness across the paste's edge (a ring 2 px either side of
  where the paste weight crosses 0.5): a seam shows as a step.

Run it twice: once with ``PYTHONPATH`` at another checkout (the before pictures), then here with
``--before`` that run's folder: ``swap_<case>.png`` is input | before | after.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cv2
import numpy as np


def turned(img: np.ndarray, lm5: np.ndarray, degrees: float) -> np.ndarray:
    """``img``'s face turned by ``degrees`` of yaw (``tests/media.py``'s ``turned``: a depth model)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from media import turned as turn

    return turn(img, lm5, degrees)  # type: ignore[no-any-return]


def _detector():
    from vcam.stages.detect import RetinaFaceDetector

    return RetinaFaceDetector()


def _landmarks(det, img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = max(det.detect(img), key=lambda x: x.area)
    return d.landmarks.astype(np.float64), np.asarray(d.box, np.float32)


def source(det, name: str):
    """The shipped portrait ``name`` as the face bank hands it over (:func:`vcam.stages.faces.face_from_image`:
    aligned at 512 px, its landmarks there)."""
    from vcam.stages import demo
    from vcam.stages.faces import face_from_image

    return face_from_image(demo.portrait(name), name, detector=det)


def swap(
    det, frame: np.ndarray, face, types: tuple[str, ...] = ("box", "face"), *, occluder=None, parser=None
) -> tuple[np.ndarray, np.ndarray]:
    """``frame`` with its largest face swapped for ``face`` by the classic pipeline's stages on the
    CPU (mask types ``types``, the config's default feather and parser regions; ``occluder`` and
    ``parser``: the (spec, engine) of the ``occlusion`` and ``region`` masks); returns (frame, its 5
    points)."""
    from vcam import align
    from vcam.config import Config
    from vcam.ops.numpy import NumpyOps
    from vcam.stages.mask import create_masker
    from vcam.stages.swap import ClassicSwapper, paste_faces

    ops = NumpyOps()
    lm, box = _landmarks(det, frame)
    mats = align.estimate(lm, "arcface_128", 128)[None]
    sw = ClassicSwapper(ops=ops)
    regions = Config().mask.regions
    masker = create_masker(list(types), 128, ops=ops, feather=0.06, occluder=occluder, parser=parser, regions=regions)
    crops, mask = sw.swap(frame.copy(), mats, face)
    out = frame.copy()
    mask = masker.masks(out, mats, lm[None], box[None], 1, mask)
    return paste_faces(ops, sw, out, crops, mats, mask, 1, face, lm[None]), lm


def face_zone(lm5: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The target's face (bool (H, W)): the posed 5-point outline shrunk to 85%."""
    from vcam.stages import mask as vmask

    zone = np.zeros(shape[:2], np.uint8)
    cv2.fillConvexPoly(zone, np.round(vmask.face_polygon(lm5, 0.85)).astype(np.int32), 1)
    return zone.astype(bool)


def edge_step(frame: np.ndarray, out: np.ndarray) -> float:
    """Mean |lightness step| across the paste's edge: where the change from ``frame`` to ``out``
    fades out, the gradient of ``out``'s lightness there over the same of ``frame``'s (1: no seam)."""
    changed = (np.abs(out.astype(np.int16) - frame).max(2) > 2).astype(np.uint8)
    if changed.sum() == 0:
        return 0.0
    ring = (cv2.dilate(changed, np.ones((5, 5), np.uint8)) - cv2.erode(changed, np.ones((5, 5), np.uint8))).astype(bool)

    def grad(img: np.ndarray) -> float:
        g = cv2.cvtColor(img, cv2.COLOR_BGR2LAB)[..., 0].astype(np.float32)
        return float(np.hypot(cv2.Sobel(g, cv2.CV_32F, 1, 0), cv2.Sobel(g, cv2.CV_32F, 0, 1))[ring].mean())

    return grad(out) / max(grad(frame), 1e-6)


def cases(det) -> dict[str, tuple[np.ndarray, str]]:
    """Each case's target frame and the source swapped onto it."""
    import skimage.data

    from vcam.stages import demo

    astro = demo.portrait("astronaut")
    hopper = demo.portrait("grace_hopper")
    lm_a, _ = _landmarks(det, astro)
    camera = cv2.resize(cv2.cvtColor(skimage.data.camera(), cv2.COLOR_GRAY2BGR), (1024, 1024), interpolation=cv2.INTER_CUBIC)
    return {
        "three_quarter": (turned(astro, lm_a, 35.0), "grace_hopper"),
        "three_quarter_self": (turned(astro, lm_a, 35.0), "astronaut"),
        "downcast": (camera, "astronaut"),
        "brim_glasses": (hopper, "astronaut"),
    }


def occluders(det, face, out: Path) -> dict:
    """The paste at a cap's brim and glasses frames (issue 40 item 5): ``swap_occluders.png``,
    input | the ``box, face`` masks | with the face parser's ``region`` mask. The brim and frames
    are painted on the astronaut's portrait and the parser is a controlled one that labels them
    (``tests/media.py``'s :class:`MaskModel`: the stand-ins' random weights label nothing);
    figures: the share of the painted pixels inside the plain paste that each paste changes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from media import MaskModel, occluded_portrait

    from vcam.models import registry

    frame, brim, frames = occluded_portrait(det)
    spec = registry.get("bisenet_resnet_34")
    plain, lm = swap(det, frame, face, ("box", "face"))
    masked, _ = swap(det, frame, face, ("box", "face", "region"), parser=(spec, MaskModel(spec)))
    inside = np.abs(plain.astype(np.int16) - frame).max(2) > 8
    painted = (brim | frames) & inside
    fig = {
        name: round(float((np.abs(img.astype(np.int16) - frame).max(2)[painted] > 8).mean()), 3)
        for name, img in (("plain_changed", plain), ("parser_changed", masked))
    }
    trio = np.concatenate([_crop(frame, lm), _crop(plain, lm), _crop(masked, lm)], 1)
    _label(trio, ("input", "box, face", "+ parser"))
    cv2.imwrite(str(out / "swap_occluders.png"), trio)
    return fig


def _label(img: np.ndarray, texts: tuple[str, ...]) -> None:
    for i, text in enumerate(texts):
        cv2.putText(img, text, (256 * i + 8, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 2, cv2.LINE_AA)
        cv2.putText(img, text, (256 * i + 8, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1, cv2.LINE_AA)


def _crop(img: np.ndarray, lm5: np.ndarray) -> np.ndarray:
    e = float(np.hypot(*(lm5[1] - lm5[0])))
    c = lm5.mean(0)
    r = int(max(e * 2.2, 60))
    x0, y0 = int(max(c[0] - r, 0)), int(max(c[1] - r * 1.1, 0))
    out = img[y0 : y0 + 2 * r, x0 : x0 + 2 * r]
    return cv2.resize(out, (256, 256), interpolation=cv2.INTER_AREA if out.shape[0] > 256 else cv2.INTER_CUBIC)


def main(argv: list[str] | None = None) -> int:
    from vcam.stages import mask as vmask
    from vcam.stages import swap_classic

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--before", type=Path, help="another run's OUT_DIR: write input | before | after pictures beside")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    det = _detector()
    faces = {n: source(det, n) for n in ("astronaut", "grace_hopper")}
    eyes = "eyes" in getattr(vmask, "SHAPE_TYPES", ())
    figures = {}
    for name, (frame, src) in cases(det).items():
        types = ("box", "face") + (("eyes",) if eyes and name == "downcast" else ())
        out, lm = swap(det, frame, faces[src], types)
        zone = face_zone(lm, frame.shape)
        fig = {"edge": round(edge_step(frame, out), 3)}
        if name == "three_quarter_self":
            fig["self_err"] = round(float(np.abs(out.astype(np.int16) - frame)[zone].mean()), 2)
        if hasattr(swap_classic, "folds"):
            from vcam import align

            mats = align.estimate(lm, "arcface_128", 128)[None]
            tgt = vmask.to_crop(lm[None], mats)[0]
            spts = np.asarray(faces[src].landmarks, np.float64)
            turned = swap_classic.posed(tgt, spts)
            dst, s = swap_classic.control_points(tgt, turned), swap_classic.control_points(spts, turned)
            used = swap_classic.unfolded(dst, s, vmask.face_polygon(tgt)) if turned else dst
            fig["folds"] = swap_classic.folds(used, s, vmask.face_polygon(tgt))
            keep, vmask.YAW_MAX = vmask.YAW_MAX, 0.0  # the warp without the pose: every face frontal
            plain = swap_classic.control_points(tgt, False), swap_classic.control_points(spts, False)
            fig["folds_unposed"] = swap_classic.folds(*plain, vmask.face_polygon(tgt))
            vmask.YAW_MAX = keep
        figures[name] = fig
        print(name, fig)
        pair = np.concatenate([_crop(frame, lm), _crop(out, lm)], 1)
        cv2.imwrite(str(args.out / f"{name}.png"), pair)
        old = cv2.imread(str(args.before / f"{name}.png")) if args.before else None
        if old is not None:
            trio = np.concatenate([pair[:, :256], old[:, 256:], pair[:, 256:]], 1)
            _label(trio, ("input", "before", "after"))
            cv2.imwrite(str(args.out / f"swap_{name}.png"), trio)
    figures["occluders"] = occluders(det, faces["grace_hopper"], args.out)
    print("occluders", figures["occluders"])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
