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

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vcam.align import TEMPLATES, estimate
from vcam.errors import FaceError
from vcam.kernels.warp import warp_crops_ref
from vcam.stages.photos import image_size, read_photo
from vcam.types import Detection, SourceFace

log = logging.getLogger(__name__)

CLASSIC_TEMPLATE = "arcface_128"
CLASSIC_SIZE = 128
#: The side of the source image a loaded face carries (arcface_128 alignment): the classic swap draws
#: from it at the frame's resolution, so it keeps the photo's detail for faces up to about this size.
SOURCE_SIZE = 512
_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # \Z: "$" would pass a trailing newline
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


def _aligned(img: np.ndarray, landmarks: np.ndarray, template: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Aligned crop (size, size, 3) uint8 and the landmarks in crop pixels (5, 2) float32."""
    m = estimate(landmarks, template, size)
    crop = warp_crops_ref(img, m[None], size)[0]
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


def _found(dets: Sequence[Detection]) -> list[dict]:
    return [{"box": [round(float(v), 1) for v in d.box], "score": round(float(d.score), 3)} for d in dets]


def choose_face(dets: Sequence[Detection], photo: str, pick: int | None) -> Detection:
    """The face of a photo: its only one, or the ``pick``-th (1-based, left to right). A photo
    with several faces and no ``pick`` (a group photo) is one FaceError listing them and how to
    choose; a ``pick`` out of range too; no face at all as well."""
    dets = sorted(dets, key=lambda d: float(d.box[0]))
    if not dets:
        raise FaceError(f"no face found in {photo}", hint="use a photo where the face is clearly visible")
    if pick is None:
        if len(dets) > 1:
            raise FaceError(
                f"{len(dets)} faces found in {photo} ({describe_faces(dets)})",
                hint="choose one with --pick K (K counts from 1, left to right)",
                page_hint="choose which one below (left to right)",
                found=_found(dets),
            )
        return dets[0]
    if not 1 <= pick <= len(dets):
        raise FaceError(
            f"--pick {pick} is out of range: {len(dets)} face(s) found in {photo} ({describe_faces(dets)})",
            hint=f"use --pick between 1 and {len(dets)}",
            page_hint="choose one of the faces shown",
            found=_found(dets),
        )
    return dets[pick - 1]


class FaceBank:
    """Faces stored under ``root``. Thread-safe for one writer (adds are atomic renames)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    # -- queries ---------------------------------------------------------------------------------
    def _folder(self, name: str) -> Path:
        return self.root / name

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(
            p.name for p in self.root.iterdir() if _NAME_RE.match(p.name) and p.is_dir() and (p / "meta.json").is_file()
        )

    def __contains__(self, name: str) -> bool:
        return (self._folder(name) / "meta.json").is_file() if _NAME_RE.match(name or "") else False

    def entry(self, name: str) -> FaceEntry:
        """The face ``name`` as stored; FaceError naming the fix when it is unknown or damaged."""
        if name not in self:
            known = self.names()
            raise FaceError(
                f"unknown face '{name}'",
                hint=f"known faces: {', '.join(known)}" if known else "add one with `vcam faces add PHOTO`",
                page_hint=None if known else "add a photo below",
            )
        folder = self._folder(name)

        def damaged(what: str) -> FaceError:
            return FaceError(
                f"face '{name}' is damaged: {what}",
                hint=f"remove it with `vcam faces remove {name}` and add the photo again",
                page_hint="remove it (× on its tile) and add the photo again",
            )

        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError, RecursionError) as exc:
            raise damaged(f"its meta.json cannot be read ({exc})") from None
        if not isinstance(meta, dict):
            raise damaged("its meta.json is not a JSON object")
        missing = [k for k in ("photo", "sha256", "landmarks", "box") if k not in meta]
        if missing:
            raise damaged(f"its meta.json has no {', '.join(repr(k) for k in missing)}")
        try:
            landmarks = np.asarray(meta["landmarks"], np.float32).reshape(5, 2)
            box = np.asarray(meta["box"], np.float32).reshape(4)
            photo = folder / str(meta["photo"])
            sha = str(meta["sha256"])
        except (TypeError, ValueError):
            raise damaged("its meta.json has landmarks or a box of the wrong shape") from None
        if not np.isfinite(landmarks).all() or not np.isfinite(box).all():
            raise damaged("its meta.json has landmarks that are not numbers")
        if photo.parent != folder or not photo.is_file():
            raise damaged(f"its photo {photo.name} is missing")
        if not _inside(folder, photo):
            raise damaged(f"its photo {photo.name} is a link to a file outside the face's folder")
        emb_dir = folder / "embeddings"
        models = tuple(sorted({p.name.rsplit("-", 1)[0] for p in emb_dir.glob("*.npy")})) if emb_dir.is_dir() else ()
        return FaceEntry(
            name=name,
            folder=folder,
            photo=photo,
            sha256=sha,
            landmarks=landmarks,
            box=box,
            added=str(meta.get("added", "")),
            embeddings=models,
        )

    def scan(self) -> tuple[list[FaceEntry], dict[str, FaceError]]:
        """Every face of the bank: the usable entries, and the damaged ones with what is wrong."""
        entries, damaged = [], {}
        for n in self.names():
            try:
                entries.append(self.entry(n))
            except FaceError as exc:
                damaged[n] = exc
        return entries, damaged

    def list(self) -> list[FaceEntry]:
        """The usable faces (damaged ones are left out: see :meth:`scan`)."""
        return self.scan()[0]

    def stamp(self, name: str) -> tuple[int, int] | None:
        """Changes whenever face ``name`` is replaced on disk (its meta.json's inode and mtime); None
        when the bank has no such face."""
        try:
            st = os.stat(self._folder(name) / "meta.json") if _NAME_RE.match(name or "") else None
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns) if st else None

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
                f"a face named '{name}' already exists",
                hint=f"pass --name, or remove it first with `vcam faces remove {name}`",
                page_hint="type another name, or remove it first (× on its tile)",
            )
        img = read_photo(photo)
        det = choose_face(detector.detect(img), str(photo), pick)
        lms = np.asarray(det.landmarks, np.float32).reshape(5, 2)
        sha = _sha256(photo)
        # Everything is written into a hidden temporary folder, renamed to the face's name only
        # once complete: a failed write (a full disk) leaves no half-written face behind.
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=self.root))
        except OSError as exc:
            raise _write_error(f"cannot write face '{name}' into {self.root}", exc) from None
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
                raise FaceError(
                    f"a face named '{name}' already exists", hint="pass another --name", page_hint="type another name"
                )
            os.rename(tmp, final)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _write_error(f"cannot write face '{name}' into {self.root}", exc) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.entry(name)

    def remove(self, name: str) -> Path | None:
        """Delete face ``name``, damaged or not (only a folder this bank wrote: it must hold a
        meta.json). A face whose folder is a symlink loses only the link, never what it points to:
        the link's target is returned then, else None."""
        if name not in self:
            self.entry(name)  # raises the unknown-face error with the known names
        folder = self._folder(name)
        try:
            if folder.is_symlink():
                target = Path(os.readlink(folder))
                folder.unlink()
                return target
            shutil.rmtree(folder)
        except OSError as exc:
            raise FaceError(
                f"cannot remove face '{name}' ({folder}): {exc.strerror or exc}", hint="check the faces directory is writable"
            ) from None
        return None

    # -- loading ---------------------------------------------------------------------------------
    def load(self, name: str, *, recogniser: Any | None = None, swappers: Sequence[Any] = ()) -> SourceFace:
        """The face as a :class:`SourceFace`, ready for ``swappers``.

        ``image``: the arcface_128 crop at :data:`SOURCE_SIZE` from the photo (BGR uint8; the stored
        128 crop when the photo cannot be read); ``landmarks``: its 5 points in that crop. With a
        ``recogniser`` the embedding is read from the cache (computed and stored if missing). Each
        swapper's ``prepare`` then fills ``latents``. Slow parts run here, never in the frame loop.
        """
        import cv2

        entry = self.entry(name)
        crop_path = entry.folder / f"crop_{CLASSIC_TEMPLATE}.png"
        img = None
        crop = None
        if crop_path.is_file():
            self._check_crop(entry, crop_path)
            crop = cv2.imread(str(crop_path), cv2.IMREAD_COLOR)
        try:  # the source at a resolution that keeps the photo's detail
            img = read_photo(entry.photo)
            crop, crop_lms = _aligned(img, entry.landmarks, CLASSIC_TEMPLATE, SOURCE_SIZE)
        except FaceError:
            if crop is None:
                raise
            crop_lms = (TEMPLATES[CLASSIC_TEMPLATE] * CLASSIC_SIZE).astype(np.float32)
        embeddings: dict[str, np.ndarray] = {}
        if recogniser is not None:
            path = self._embedding_path(entry.folder, recogniser.name, entry.sha256)
            cached = _load_npy(path)
            if cached is not None:
                embeddings[recogniser.name] = cached
            else:
                img = img if img is not None else read_photo(entry.photo)
                try:
                    embeddings[recogniser.name] = self._store_embedding(
                        entry.folder, entry.sha256, recogniser, img, entry.landmarks
                    )
                except FaceError as exc:  # the cache could not be written: the face still loads
                    log.warning("%s", exc)
                    embeddings[recogniser.name] = self._embed(recogniser, img, entry.landmarks)
        else:  # whatever is cached
            for model in entry.embeddings:
                cached = _load_npy(self._embedding_path(entry.folder, model, entry.sha256))
                if cached is not None:
                    embeddings[model] = cached
        face = SourceFace(name=entry.name, image=crop, landmarks=crop_lms, embeddings=embeddings)
        for swapper in swappers:
            face = swapper.prepare(face)
        return face

    # -- internals -------------------------------------------------------------------------------
    @staticmethod
    def _check_crop(entry: FaceEntry, crop_path: Path) -> None:
        """FaceError (damaged, with the fix) unless the stored crop is a file of this face's folder
        whose header says it is the size the bank writes; nothing beyond the header is read."""

        def damaged(what: str) -> FaceError:
            return FaceError(
                f"face '{entry.name}' is damaged: {what}",
                hint=f"remove it with `vcam faces remove {entry.name}` and add the photo again",
                page_hint="remove it (× on its tile) and add the photo again",
            )

        if not _inside(entry.folder, crop_path):
            raise damaged(f"its crop {crop_path} is a link to a file outside the face's folder")
        try:
            size = image_size(crop_path, "crop", max_pixels=None)
        except FaceError as exc:
            raise damaged(exc.message) from None
        if size != (CLASSIC_SIZE, CLASSIC_SIZE):
            raise damaged(f"its crop {crop_path} is {size[0]}x{size[1]} pixels, not {CLASSIC_SIZE}x{CLASSIC_SIZE}")

    @staticmethod
    def _embedding_path(folder: Path, model: str, sha: str) -> Path:
        return folder / "embeddings" / f"{model}-{sha[:32]}.npy"

    def _write_crops(self, folder: Path, img: np.ndarray, lms: np.ndarray) -> None:
        import cv2

        for template, size in ((CLASSIC_TEMPLATE, CLASSIC_SIZE), ("arcface_112_v2", 112)):
            crop, _ = _aligned(img, lms, template, size)
            try:
                ok = cv2.imwrite(str(folder / f"crop_{template}.png"), crop)
            except cv2.error:
                ok = False
            if not ok:
                raise FaceError(
                    f"cannot write the aligned crop into {folder}",
                    hint="check the faces directory ([faces] dir) is writable and the disk is not full",
                )

    @staticmethod
    def _embed(recogniser: Any, img: np.ndarray, lms: np.ndarray) -> np.ndarray:
        return np.asarray(recogniser.embed(img, np.asarray(lms, np.float32)[None]), np.float32).reshape(-1)

    def _store_embedding(self, folder: Path, sha: str, recogniser: Any, img: np.ndarray, lms: np.ndarray) -> np.ndarray:
        emb = self._embed(recogniser, img, lms)
        path = self._embedding_path(folder, recogniser.name, sha)
        tmp = path.with_name(path.name + ".tmp.npy")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(tmp, emb)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise _write_error(f"cannot cache the embedding in {path.parent}", exc) from None
        return emb


def _inside(folder: Path, path: Path) -> bool:
    """Whether ``path``, links followed, lies directly in ``folder`` (links followed too: a face
    folder may itself be a link)."""
    try:
        return path.resolve().parent == folder.resolve()
    except (OSError, RuntimeError):
        return False


def _write_error(what: str, exc: OSError) -> FaceError:
    """One-line FaceError for a failed write into the bank, with the fix for the usual causes."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "the disk is full: free some space and try again"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "check the faces directory ([faces] dir) is writable"
    else:
        hint = "check the faces directory ([faces] dir) and the disk"
    return FaceError(f"{what}: {exc.strerror or exc}", hint=hint)


def _load_npy(path: Path) -> np.ndarray | None:
    """A cached embedding, or None when it is missing or unreadable (it is then computed again)."""
    try:
        return np.load(path).astype(np.float32).reshape(-1)
    except (OSError, ValueError, EOFError):
        return None


class BankWatcher:
    """Keeps the faces a running daemon loaded from the bank in step with the disk.

    :meth:`load` is the state's loader (it remembers each face's :meth:`FaceBank.stamp`); a thread
    (``vcam-faces``, :meth:`start`/:meth:`stop`) calls :meth:`check` every ``interval`` seconds,
    which reloads a face replaced on disk (removed and added again under the same name) and swaps
    it into ``state`` (a pointer swap: the active face stays active). A face removed from the bank
    stays loaded until it comes back. Loading happens in the watcher's thread, never the frame loop.
    """

    def __init__(self, bank: FaceBank, state: Any, load: Any, *, interval: float = 1.0) -> None:
        self.bank, self.state, self._load = bank, state, load
        self.interval = float(interval)
        self._stamps: dict[str, tuple[int, int]] = {}
        self._failed: dict[str, tuple[int, int]] = {}  # the stamp a face failed to load at (warned once)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def rebind(self, load: Any) -> None:
        """Load faces with ``load`` from now on (an early swap's switch: the full assembly's models,
        so the replaced one is not kept alive); the faces loaded and their stamps stay. One reference
        replaced: a load under way finishes with the models it began with."""
        self._load = load

    def load(self, name: str) -> SourceFace:
        stamp = self.bank.stamp(name)
        face = self._load(name)
        if stamp is not None:
            with self._lock:
                self._stamps[name] = stamp
        return face

    def check(self) -> list[str]:
        """Reload every watched face whose stamp changed; returns their names."""
        with self._lock:
            watched = dict(self._stamps)
        reloaded = []
        for name, old in watched.items():
            now = self.bank.stamp(name)
            if now is None or now == old:
                continue  # removed (kept loaded until it comes back) or unchanged
            try:
                face = self.load(name)
            except FaceError as exc:  # e.g. half-written: try again on the next pass, warn once per change
                if self._failed.get(name) != now:
                    self._failed[name] = now
                    log.warning("face '%s' changed on disk but cannot be loaded: %s", name, exc)
                continue
            self._failed.pop(name, None)
            self.state.add_face(face, activate=False)  # the active face stays what it was
            reloaded.append(name)
            log.info("face '%s' was replaced in the face bank; reloaded", name)
        return reloaded

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="vcam-faces", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # a watcher must never take the daemon down
                log.exception("checking the face bank failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    close = stop


# -- faces from photos and names (--face, [swap] source / reference) -----------------------------


def face_from_image(
    image: np.ndarray,
    name: str,
    *,
    detector: _Detector,
    swappers: Sequence[Any] = (),
    recogniser: Any | None = None,
    pick: int | None = None,
) -> SourceFace:
    """The face of a BGR photo as a :class:`SourceFace` (aligned at arcface_128, :data:`SOURCE_SIZE`), with
    its embedding when a ``recogniser`` is given, prepared for each of ``swappers``. A photo of
    several faces needs ``pick`` (1-based, left to right; :func:`choose_face`): a group photo is
    refused, listing its faces. The landmarks and the embedding of a photo seen before come from
    :mod:`vcam.stages.face_cache` (neither the detector nor the recogniser runs then)."""
    from vcam.stages import face_cache

    # The face chosen is part of the key (a photo cached before group photos were refused held
    # its largest face: "-pick0" entries are only ever written for a photo of one face).
    digest, found_by = face_cache.image_digest(image), f"{face_cache.detector_id(detector)}-pick{pick or 0}"
    points = face_cache.landmarks(digest, found_by)
    if points is None:
        dets = detector.detect(image)
        if not dets:
            raise FaceError(
                f"no face found in source photo '{name}'", hint="use a photo where one face is clearly visible and frontal"
            )
        det = choose_face(dets, f"source photo '{name}'", pick)
        points = np.asarray(det.landmarks, np.float32).reshape(5, 2)
        face_cache.store_landmarks(digest, found_by, points)
    crop, lms = _aligned(image, points, CLASSIC_TEMPLATE, SOURCE_SIZE)
    embeddings = {}
    if recogniser is not None:
        emb = face_cache.embedding(digest, recogniser.name, points)
        if emb is None:
            emb = np.asarray(recogniser.embed(image, points[None]), np.float32)[0]
            face_cache.store_embedding(digest, recogniser.name, points, emb)
        embeddings[recogniser.name] = emb
    face = SourceFace(name=name, image=crop, landmarks=lms, embeddings=embeddings)
    for swapper in swappers:
        face = swapper.prepare(face)
    return face


def load_face_arg(
    arg: str,
    *,
    faces_dir: Path,
    detector: _Detector,
    swappers: Sequence[Any] = (),
    recogniser: Any | None = None,
    pick: int | None = None,
) -> SourceFace:
    """``--face NAME|PATH``: a photo path (anything with a suffix that exists or names a folder),
    else a face-bank name. ``pick``: which face of a photo of several (``--pick K``); a bank
    name is one face already, so a ``pick`` with one is an error."""
    p = Path(arg).expanduser()
    if p.suffix and (p.exists() or "/" in arg or "\\" in arg):
        if not p.is_file():
            raise FaceError(f"face photo not found: {p}", hint="check the path, or use a name from `vcam faces list`")
        return face_from_image(read_photo(p), p.stem, detector=detector, swappers=swappers, recogniser=recogniser, pick=pick)
    if pick:
        raise FaceError(
            f"--pick {pick} chooses a face of a photo, and '{arg}' is a face-bank name (one face)",
            hint="leave out --pick, or give the photo's path with --face",
        )
    return FaceBank(faces_dir).load(arg, recogniser=recogniser, swappers=swappers)
