"""The face bank: source faces on disk, ready to switch to instantly.

Layout (``cfg.faces_dir``), one folder per face::

    NAME/
      meta.json                 name, photo file, its SHA-256, landmarks and box in the photo, when added
      photo.jpg                 a copy of the original photo (never modified)
      crop_arcface_128.png      aligned crop (arcface_128 at 128): the classic swapper's source image
      crop_arcface_112_v2.png   aligned crop the ArcFace recogniser reads
      embeddings/MODEL-SHA.npy  raw embedding per recogniser, keyed by model name and photo SHA-256

Adding a face is slow (detection, alignment, the recogniser); switching to it is not: the pipeline
loads a face (embeddings from the cache, latents from each swapper's ``prepare``) before calling
``state.add_face``/``state.set_face``, so the frame loop only ever swaps a pointer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .align import TEMPLATES, estimate, warp_crops
from .errors import FaceError
from .types import Detection, SourceFace

log = logging.getLogger(__name__)

CLASSIC_TEMPLATE = "arcface_128"
CLASSIC_SIZE = 128
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PHOTO_EXT = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


class _Detector(Protocol):
    def detect(self, frame_bgr: np.ndarray) -> list[Detection]: ...


@dataclass(frozen=True)
class FaceEntry:
    """A face of the bank as stored on disk (see :meth:`FaceBank.list`)."""

    name: str
    folder: Path
    photo: Path
    sha256: str
    landmarks: np.ndarray  # (5, 2) float32 in photo pixels
    box: np.ndarray  # (4,) float32 in photo pixels
    added: str
    embeddings: tuple[str, ...]  # recogniser names with a cached embedding


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_photo(path: Path) -> np.ndarray:
    """Decode a photo to (H, W, 3) uint8 BGR; FaceError if it is missing or not an image."""
    import cv2

    path = Path(path)
    if not path.is_file():
        raise FaceError(f"photo not found: {path}", hint="check the path")
    data = np.fromfile(str(path), dtype=np.uint8)
    img = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if img is None:
        raise FaceError(f"{path} is not an image OpenCV can read", hint="use a JPEG or PNG photo")
    return img


def _aligned(img: np.ndarray, landmarks: np.ndarray, template: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Aligned crop (size, size, 3) uint8 and the landmarks in crop pixels (5, 2) float32."""
    m = estimate(landmarks, template, size)
    crop = warp_crops(img, m[None], size)[0]
    lms = (np.asarray(landmarks, np.float64) @ m[:, :2].T + m[:, 2]).astype(np.float32)
    return crop, lms


def _default_name(photo: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", photo.stem).strip("-._") or "face"
    if not stem[0].isalnum():
        stem = "face-" + stem
    return stem[:64]


def describe_faces(dets: Sequence[Detection]) -> str:
    parts = []
    for i, d in enumerate(dets, 1):
        x1, y1, x2, y2 = (int(round(float(v))) for v in d.box)
        parts.append(f"{i}: at x={x1} y={y1}, {x2 - x1}x{y2 - y1} px, score {d.score:.2f}")
    return "; ".join(parts)


class FaceBank:
    """Faces stored under ``root``. Thread-safe for one writer (adds are atomic renames)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    @classmethod
    def from_config(cls, cfg) -> FaceBank:
        return cls(cfg.faces_dir)

    # -- queries ---------------------------------------------------------------------------------
    def _folder(self, name: str) -> Path:
        return self.root / name

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and (p / "meta.json").is_file())

    def __contains__(self, name: str) -> bool:
        return (self._folder(name) / "meta.json").is_file() if _NAME_RE.match(name or "") else False

    def entry(self, name: str) -> FaceEntry:
        if name not in self:
            known = self.names()
            raise FaceError(
                f"unknown face '{name}'",
                hint=f"known faces: {', '.join(known)}" if known else "add one with `vcam faces add PHOTO`",
            )
        folder = self._folder(name)
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError) as exc:
            raise FaceError(
                f"face '{name}' has an unreadable meta.json: {exc}",
                hint=f"remove it with `vcam faces remove {name}` and add it again",
            ) from None
        emb_dir = folder / "embeddings"
        models = tuple(sorted({p.name.rsplit("-", 1)[0] for p in emb_dir.glob("*.npy")})) if emb_dir.is_dir() else ()
        return FaceEntry(
            name=meta["name"],
            folder=folder,
            photo=folder / meta["photo"],
            sha256=meta["sha256"],
            landmarks=np.asarray(meta["landmarks"], np.float32).reshape(5, 2),
            box=np.asarray(meta["box"], np.float32).reshape(4),
            added=meta.get("added", ""),
            embeddings=models,
        )

    def list(self) -> list[FaceEntry]:
        return [self.entry(n) for n in self.names()]

    # -- changes ---------------------------------------------------------------------------------
    def add(
        self,
        photo: str | os.PathLike,
        name: str | None = None,
        pick: int | None = None,
        *,
        detector: _Detector,
        recogniser: Any | None = None,
    ) -> FaceEntry:
        """Detect the face in ``photo`` and store it as ``name`` (default: the file name).

        ``pick`` (1-based, faces ordered left to right) chooses among several faces. With a
        ``recogniser`` its embedding is computed and cached now; otherwise on first :meth:`load`.
        """
        photo = Path(photo)
        name = name or _default_name(photo)
        if not _NAME_RE.match(name):
            raise FaceError(f"invalid face name {name!r}", hint="use letters, digits, '-', '_' or '.', at most 64 characters")
        if name in self:
            raise FaceError(
                f"a face named '{name}' already exists", hint=f"pass --name, or remove it first with `vcam faces remove {name}`"
            )
        img = read_photo(photo)
        dets = sorted(detector.detect(img), key=lambda d: float(d.box[0]))
        if not dets:
            raise FaceError(f"no face found in {photo}", hint="use a photo where the face is clearly visible")
        if pick is None:
            if len(dets) > 1:
                raise FaceError(
                    f"{len(dets)} faces found in {photo} ({describe_faces(dets)})",
                    hint="choose one with --pick K (K counts from 1, left to right)",
                )
            det = dets[0]
        else:
            if not 1 <= pick <= len(dets):
                raise FaceError(
                    f"--pick {pick} is out of range: {len(dets)} face(s) found in {photo} ({describe_faces(dets)})",
                    hint=f"use --pick between 1 and {len(dets)}",
                )
            det = dets[pick - 1]
        lms = np.asarray(det.landmarks, np.float32).reshape(5, 2)
        sha = _sha256(photo)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.root))
        try:
            ext = photo.suffix.lower() if photo.suffix.lower() in _PHOTO_EXT else ".img"
            shutil.copyfile(photo, tmp / f"photo{ext}")
            self._write_crops(tmp, img, lms)
            meta = {
                "name": name,
                "photo": f"photo{ext}",
                "source_path": str(photo.resolve()),
                "sha256": sha,
                "landmarks": lms.astype(float).tolist(),
                "box": np.asarray(det.box, np.float32).round(2).tolist(),
                "score": round(float(det.score), 4),
                "pick": pick,
                "added": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            if recogniser is not None:
                self._store_embedding(tmp, sha, recogniser, img, lms)
            final = self._folder(name)
            if final.exists():
                raise FaceError(f"a face named '{name}' already exists", hint="pass another --name")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.entry(name)

    def remove(self, name: str) -> None:
        """Delete face ``name`` (only a folder this bank wrote: it must hold a meta.json)."""
        entry = self.entry(name)
        shutil.rmtree(entry.folder)

    # -- loading ---------------------------------------------------------------------------------
    def load(self, name: str, *, recogniser: Any | None = None, swappers: Sequence[Any] = ()) -> SourceFace:
        """The face as a :class:`SourceFace`, ready for ``swappers``.

        ``image``: the arcface_128 crop at 128 (BGR uint8); ``landmarks``: its 5 points in that
        crop. With a ``recogniser`` the embedding is read from the cache (computed and stored if
        missing). Each swapper's ``prepare`` then fills ``latents``. Slow parts run here, never in
        the frame loop.
        """
        import cv2

        entry = self.entry(name)
        crop_path = entry.folder / f"crop_{CLASSIC_TEMPLATE}.png"
        img = None
        crop = cv2.imread(str(crop_path), cv2.IMREAD_COLOR) if crop_path.is_file() else None
        if crop is None:
            img = read_photo(entry.photo)
            crop, _ = _aligned(img, entry.landmarks, CLASSIC_TEMPLATE, CLASSIC_SIZE)
        crop_lms = (TEMPLATES[CLASSIC_TEMPLATE] * CLASSIC_SIZE).astype(np.float32)
        embeddings: dict[str, np.ndarray] = {}
        if recogniser is not None:
            path = self._embedding_path(entry.folder, recogniser.name, entry.sha256)
            if path.is_file():
                embeddings[recogniser.name] = np.load(path).astype(np.float32)
            else:
                img = img if img is not None else read_photo(entry.photo)
                embeddings[recogniser.name] = self._store_embedding(entry.folder, entry.sha256, recogniser, img, entry.landmarks)
        else:  # whatever is cached
            for model in entry.embeddings:
                p = self._embedding_path(entry.folder, model, entry.sha256)
                if p.is_file():
                    embeddings[model] = np.load(p).astype(np.float32)
        face = SourceFace(name=entry.name, image=crop, landmarks=crop_lms, embeddings=embeddings)
        for swapper in swappers:
            face = swapper.prepare(face)
        return face

    # -- internals -------------------------------------------------------------------------------
    @staticmethod
    def _embedding_path(folder: Path, model: str, sha: str) -> Path:
        return folder / "embeddings" / f"{model}-{sha[:32]}.npy"

    def _write_crops(self, folder: Path, img: np.ndarray, lms: np.ndarray) -> None:
        import cv2

        for template, size in ((CLASSIC_TEMPLATE, CLASSIC_SIZE), ("arcface_112_v2", 112)):
            crop, _ = _aligned(img, lms, template, size)
            if not cv2.imwrite(str(folder / f"crop_{template}.png"), crop):
                raise FaceError(f"cannot write the aligned crop into {folder}", hint="check the faces directory is writable")

    def _store_embedding(self, folder: Path, sha: str, recogniser: Any, img: np.ndarray, lms: np.ndarray) -> np.ndarray:
        emb = np.asarray(recogniser.embed(img, np.asarray(lms, np.float32)[None]), np.float32).reshape(-1)
        path = self._embedding_path(folder, recogniser.name, sha)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npy")
        np.save(tmp, emb)
        os.replace(tmp, path)
        return emb


# -- faces from photos and names (--face, [swap] source / reference) -----------------------------


def face_from_image(
    image: np.ndarray, name: str, *, detector: _Detector, swappers: Sequence[Any] = (), recogniser: Any | None = None
) -> SourceFace:
    """The largest face of a BGR photo as a :class:`SourceFace` (aligned at arcface_128/128), with
    its embedding when a ``recogniser`` is given, prepared for each of ``swappers``."""
    dets = detector.detect(image)
    if not dets:
        raise FaceError(
            f"no face found in source photo '{name}'", hint="use a photo where one face is clearly visible and frontal"
        )
    best = max(dets, key=lambda d: d.area)
    crop, lms = _aligned(image, best.landmarks, CLASSIC_TEMPLATE, CLASSIC_SIZE)
    embeddings = {}
    if recogniser is not None:
        embeddings[recogniser.name] = np.asarray(recogniser.embed(image, best.landmarks[None]), np.float32)[0]
    face = SourceFace(name=name, image=crop, landmarks=lms, embeddings=embeddings)
    for swapper in swappers:
        face = swapper.prepare(face)
    return face


def load_face_arg(
    arg: str, *, faces_dir: Path, detector: _Detector, swappers: Sequence[Any] = (), recogniser: Any | None = None
) -> SourceFace:
    """``--face NAME|PATH``: a photo path (anything with a suffix that exists or names a folder),
    else a face-bank name."""
    p = Path(arg).expanduser()
    if p.suffix and (p.exists() or "/" in arg or "\\" in arg):
        if not p.is_file():
            raise FaceError(f"face photo not found: {p}", hint="check the path, or use a name from `vcam faces list`")
        return face_from_image(read_photo(p), p.stem, detector=detector, swappers=swappers, recogniser=recogniser)
    return FaceBank(faces_dir).load(arg, recogniser=recogniser, swappers=swappers)
