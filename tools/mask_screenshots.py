"""Before/after pictures of the masks for docs/masks.md:

    git worktree add /tmp/vcam-before f2c32a2      # the code before issue 10 (optional)
    python tools/mask_screenshots.py [OUT_DIR] [--before /tmp/vcam-before]

Runs the assembled CPU pipeline (the built-in classic swapper, the astronaut as the source face) on a
frame of the demo clip and on a three-face frame, once per mask set, and writes one small PNG per
scene: the input, the swap before issue 10 (``vcam run`` of the ``--before`` checkout on the same
frame, through a lossless file), then each mask set, side by side around the faces.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vcam.config import Config  # noqa: E402
from vcam.config_file import build  # noqa: E402
from vcam.runtime import assemble  # noqa: E402
from vcam.stages import demo  # noqa: E402
from vcam.stages.faces import face_from_image  # noqa: E402
from vcam.state import RuntimeState  # noqa: E402
from vcam.types import Frame, PixelFormat  # noqa: E402

SETS = (("box,face", "box,face (default)"), ("box,face,mouth", "box,face,mouth"), ("box,face+seamless", "+ seamless"))


def before(frame: np.ndarray, checkout: Path) -> np.ndarray:
    """The frame swapped by ``vcam run`` of another checkout (the code before the masks)."""
    import os
    import subprocess
    import tempfile

    import av

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.png", Path(tmp) / "out.mkv"
        cv2.imwrite(str(src), frame)
        face = ROOT / "vcam" / "assets" / "astronaut.jpg"
        env = dict(os.environ, PYTHONPATH=str(checkout))
        args = ["run", "--input", str(src), "--output", f"file:{dst}", "--face", str(face), "--device", "cpu", "--quiet"]
        subprocess.run([sys.executable, "-m", "vcam", *args], check=True, env=env, cwd=checkout, capture_output=True)
        with av.open(str(dst)) as c:
            return next(c.decode(video=0)).to_ndarray(format="bgr24")


def swapped(frame: np.ndarray, masks: str) -> np.ndarray:
    masks, _, extra = masks.partition("+")
    swap = build({"swap": {"seamless": extra == "seamless"}}).swap
    cfg = Config().replace(
        pipeline=build({"pipeline": {"device": "cpu"}}).pipeline, mask=build({"mask": {"types": masks}}).mask, swap=swap
    )
    asm = assemble.build(cfg)
    state = RuntimeState()
    state.add_face(
        face_from_image(demo.portrait("astronaut"), "astronaut", detector=asm.photo_detector, swappers=[asm.swapper]),
        activate=True,
    )
    h, w = frame.shape[:2]
    pipe = asm.make_pipeline(PixelFormat.BGR, w, h, PixelFormat.BGR)
    out = frame
    for i in range(3):  # a few frames: the tracker settles as it does live
        out, _ = pipe.process(Frame(frame, w, h, PixelFormat.BGR, 0.0, i), state.snapshot())
    return out.copy()


def panel(img: np.ndarray, box: tuple[int, int, int, int], label: str, width: int) -> np.ndarray:
    x0, y0, x1, y1 = box
    crop = img[y0:y1, x0:x1]
    crop = cv2.resize(crop, (width, round(width * crop.shape[0] / crop.shape[1])), interpolation=cv2.INTER_AREA)
    cv2.rectangle(crop, (0, 0), (width, 22), (0, 0, 0), -1)
    cv2.putText(crop, label, (6, 16), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1, cv2.LINE_AA)
    return crop


def sheet(frame: np.ndarray, box: tuple[int, int, int, int], width: int, old: Path | None) -> np.ndarray:
    panels = [panel(frame, box, "input", width)]
    if old is not None:
        panels.append(panel(before(frame, old), box, "before (square paste)", width))
    panels += [panel(swapped(frame, masks), box, label, width) for masks, label in SETS]
    return np.concatenate(panels, axis=1)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=str(ROOT / "docs" / "img"))
    ap.add_argument("--before", default="", help="a checkout of the code before the masks")
    args = ap.parse_args()
    out = Path(args.out)
    old = Path(args.before) if args.before else None
    out.mkdir(parents=True, exist_ok=True)
    clip = demo.DemoClip(1280, 720, seed=0)
    frame = clip.frame(20)
    x0, y0, x1, y1 = clip.truth(20)[0]
    cx, cy, side = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) * 2.0
    box = tuple(int(v) for v in (max(cx - side / 2, 0), max(cy - side / 2, 0), min(cx + side / 2, 1280), min(cy + side / 2, 720)))
    cv2.imwrite(str(out / "masks_demo.png"), sheet(frame, box, 200, old), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    img = demo.portrait("grace_hopper")
    from vcam.stages.detect import RetinaFaceDetector

    fbox = demo.face_box(img, RetinaFaceDetector())
    scene, _ = demo.faces_scene((1280, 720), img, fbox, [(150, (300, 330)), (110, (640, 300)), (190, (980, 360))])
    cv2.imwrite(str(out / "masks_group.png"), sheet(scene, (100, 60, 1220, 620), 240, old), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    for p in sorted(out.glob("masks_*.png")):
        print(p, f"{p.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
