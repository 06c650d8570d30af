"""Per-person mapping: each person in frame gets their own source face.

``[[swap.map]]`` entries (``vcam run --map TARGET=SOURCE``) name a *target*, the person as seen
in a reference photo or a face-bank face, and the *source* face that person gets. At start
:func:`load_mappings` loads every target with the run's recogniser embedding and every source
prepared for the swapper, and registers them in :class:`~vcam.state.RuntimeState`; from then on
``vcam ctl map``/``unmap`` and OBS change them like the active face (a pointer swap in the
snapshot).

In the frame loop, :class:`Assigner` decides which source each tracked face gets. Identity is
computed once per track, when it first appears (one batched recogniser call for all new tracks,
from ``host_frame()``, which on the GPU is a download), never per frame; a track keeps the target
it matched for as long as it is tracked. Faces matching no target follow ``[swap] unmatched``: the
active face (``active``) or no swap (``keep``). Without any mapping, every face gets the active
face and the recogniser is never called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vcam.errors import ConfigError, FaceError
from vcam.stages.recognize import DEFAULT_RECOGNISER, normalize
from vcam.state import RuntimeState, Snapshot
from vcam.types import Detection, SourceFace, Track

log = logging.getLogger(__name__)

_ROLE_HINT = "--map TARGET=SOURCE / [[swap.map]]"


def is_photo_arg(arg: str) -> bool:
    """Whether ``arg`` names a photo rather than a face-bank name (the rule of ``--face``: a name
    with a suffix that exists as a file or holds a path separator)."""
    p = Path(arg).expanduser()
    return bool(p.suffix) and (p.exists() or "/" in arg or "\\" in arg)


def face_name(arg: str) -> str:
    """The name a target or source given as ``arg`` goes by: a bank name as it is, a photo by its
    file name without the extension (what :func:`vcam.stages.faces.load_face_arg` names it)."""
    return Path(arg).expanduser().stem if is_photo_arg(arg) else arg


class _Found:
    """A detector that answers with detections found already (so a photo is searched once)."""

    def __init__(self, dets: list[Detection]) -> None:
        self._dets = dets

    def detect(self, frame_bgr: np.ndarray) -> list[Detection]:
        return list(self._dets)


def load_target(arg: str, *, faces_dir: Path, detector: Any, recogniser: Any) -> SourceFace:
    """The target reference face ``arg`` (a face-bank name or a photo path) with ``recogniser``'s
    embedding. A photo without a face is one FaceError, as for ``--face``; so is a missing one."""
    from vcam.stages.faces import FaceBank, face_from_image
    from vcam.stages.photos import read_photo

    if recogniser is None:
        raise _no_recogniser()
    if is_photo_arg(arg):
        p = Path(arg).expanduser()
        if not p.is_file():
            raise FaceError(f"map target photo not found: {p}", hint=f"check the path ({_ROLE_HINT})")
        img = read_photo(p)
        dets = detector.detect(img)
        if not dets:
            raise FaceError(
                f"no face found in map target photo {p}",
                hint=f"use a photo where that person's face is clearly visible ({_ROLE_HINT})",
            )
        if len(dets) > 1:
            from vcam.stages.faces import describe_faces

            listed = describe_faces(sorted(dets, key=lambda d: float(d.box[0])))
            raise FaceError(
                f"{len(dets)} faces found in map target photo {p} ({listed})",
                hint="crop it to that person, or `vcam faces add PHOTO --pick K --name NAME` and map NAME",
            )
        face = face_from_image(img, p.stem, detector=_Found(dets), recogniser=recogniser)
    else:
        bank = FaceBank(faces_dir)
        if arg not in bank:
            raise _unknown(bank, arg, "target")
        face = bank.load(arg, recogniser=recogniser)
    if recogniser.name not in face.embeddings:  # pragma: no cover - both loaders fill it
        raise FaceError(f"map target '{arg}' has no {recogniser.name} embedding", hint="add the face again")
    return face


def _unknown(bank: Any, name: str, role: str) -> FaceError:
    known = bank.names()
    hint = f"known faces: {', '.join(known)}" if known else "add it with `vcam faces add PHOTO --name NAME`, or give a photo"
    return FaceError(f"unknown map {role} '{name}': no such face in the face bank, and not a photo path", hint=hint)


def _no_recogniser() -> ConfigError:
    return ConfigError(
        "[swap] map needs the face recogniser to tell people apart, and this run has none loaded",
        hint=f"the recogniser is {DEFAULT_RECOGNISER}: `vcam models pull {DEFAULT_RECOGNISER}` (or run with --download), "
        "and assembly must load it whenever [swap] map is set",
    )


def targets_loader(faces_dir: Path | str, *, detector: Any, recogniser: Any) -> Callable[[str], SourceFace]:
    """How a target reference face loads at runtime (``vcam ctl map``): a bank name or a photo at
    ``faces_dir``, its face found by ``detector``, with ``recogniser``'s embedding."""
    folder = Path(faces_dir)

    def load(arg: str) -> SourceFace:
        return load_target(arg, faces_dir=folder, detector=detector, recogniser=recogniser)

    return load


def load_mappings(
    entries: Any, faces_dir: Path | str, state: RuntimeState, *, detector: Any, recogniser: Any, swapper: Any
) -> None:
    """Load every ``[swap] map`` entry (``entries``: dicts with ``target`` and ``source``; names of
    the face bank at ``faces_dir``) into ``state``: its target (with ``recogniser``'s embedding)
    and its source (prepared for ``swapper``; a bank name already loaded in ``state`` is reused, so
    call this after :func:`vcam.runtime.assemble.load_faces`). With a recogniser, ``state`` also learns to
    load targets later, so ``vcam ctl map`` works at runtime; without one, runtime mapping answers
    how to turn it on.

    Raises ConfigError when entries exist but ``recogniser`` is None or a target is mapped twice,
    FaceError for a target or source that cannot be loaded (no face in the photo, unknown name).
    ``detector``: the photo detector (``Assembly.photo_detector``).
    """
    from vcam.stages.faces import FaceBank, load_face_arg

    entries = list(entries or [])
    if recogniser is None:
        if entries:
            raise _no_recogniser()
        return
    faces_dir = Path(faces_dir)
    target_loader = targets_loader(faces_dir, detector=detector, recogniser=recogniser)
    state.set_target_loader(target_loader)
    seen: dict[str, str] = {}
    for entry in entries:
        target, source = str(entry["target"]), str(entry["source"])
        name = face_name(target)
        if name in seen:
            raise ConfigError(
                f"[swap] map: the target '{name}' is mapped twice ('{seen[name]}' and '{target}')",
                hint="keep one [[swap.map]] entry (or --map) per person",
            )
        seen[name] = target
        name = state.add_target(target_loader(target), given_as=target)
        if is_photo_arg(source):
            kw = {"detector": detector, "swappers": [swapper], "recogniser": recogniser}
            face = load_face_arg(source, faces_dir=faces_dir, **kw)
            state.add_face(face, activate=False)
            source = face.name
        elif source not in state.names:
            bank = FaceBank(faces_dir)
            if source not in bank:
                raise _unknown(bank, source, "source")
            state.add_face(bank.load(source, recogniser=recogniser, swappers=[swapper]), activate=False)
        state.set_mapping(name, source)


class Assigner:
    """Which source face each tracked face gets (see the module docstring).

    ``recogniser``: has ``name`` and ``embed(frame, landmarks) -> (F, D)``; None turns mapping off
    (every face then gets the active face). ``threshold``: the least cosine similarity to a target
    that counts as that person. ``unmatched``: ``active`` or ``keep``.

    Two faces can match the same target: both get its source. Each face is judged on its own, so
    its source never flips because someone else walks in or out of the frame; the price is that a
    lookalike above the threshold gets the same source as the person.
    """

    def __init__(self, recogniser: Any, threshold: float, unmatched: str = "active") -> None:
        if unmatched not in ("active", "keep"):
            raise ValueError(f"unmatched must be 'active' or 'keep', got {unmatched!r}")
        self.recogniser = recogniser
        self.threshold = float(threshold)
        self.unmatched = unmatched
        self._embeddings: dict[int, np.ndarray] = {}  # track id -> normalised embedding
        self._targets: tuple[tuple, np.ndarray, list[SourceFace]] | None = None  # (snap.mapping, matrix, sources)
        self._warned = False

    def assign(
        self, tracks: Sequence[Track], host_frame: Callable[[], np.ndarray], snap: Snapshot
    ) -> list[tuple[Track, SourceFace]]:
        """(track, source) for each track to swap, in track order; tracks left out stay as they are."""
        if not snap.mapping or self.recogniser is None:
            if snap.mapping and not self._warned:
                log.warning("mappings are set but no recogniser is loaded: every face gets the active face")
                self._warned = True
            return [(t, snap.face) for t in tracks] if snap.face is not None else []
        if not tracks:
            self._embeddings.clear()
            return []
        alive = {t.id for t in tracks}
        for gone in [i for i in self._embeddings if i not in alive]:
            del self._embeddings[gone]
        new = [t for t in tracks if t.id not in self._embeddings]
        if new:
            emb = np.asarray(self.recogniser.embed(host_frame(), np.stack([t.landmarks for t in new])), np.float32)
            for t, e in zip(new, normalize(emb.reshape(len(new), -1))):
                self._embeddings[t.id] = e
        matrix, sources = self._target_matrix(snap)
        default = snap.face if self.unmatched == "active" else None
        out: list[tuple[Track, SourceFace]] = []
        for t in tracks:
            source = default
            if sources:
                sims = matrix @ self._embeddings[t.id]
                best = int(np.argmax(sims))
                if sims[best] >= self.threshold:
                    source = sources[best]
            if source is not None:
                out.append((t, source))
        return out

    def _target_matrix(self, snap: Snapshot) -> tuple[np.ndarray, list[SourceFace]]:
        """The targets' normalised embeddings (M, D) and their sources, rebuilt when the mappings
        change. A target without this recogniser's embedding cannot match and is left out."""
        if self._targets is None or self._targets[0] is not snap.mapping:
            rows, sources = [], []
            for m in snap.mapping:
                e = m.target.embeddings.get(self.recogniser.name)
                if e is not None:
                    rows.append(np.asarray(e, np.float32).reshape(-1))
                    sources.append(m.source)
            matrix = normalize(np.stack(rows)) if rows else np.zeros((0, 0), np.float32)
            self._targets = (snap.mapping, matrix, sources)
        return self._targets[1], self._targets[2]

    def match(self, track_id: int, snap: Snapshot) -> tuple[str | None, SourceFace | None]:
        """(the target a tracked face matched, the source it gets) as :meth:`assign` decided it: the
        target is None for a face matching nobody (or not recognised yet), the source None when it
        is left as filmed."""
        default = snap.face if self.unmatched == "active" else None
        emb = self._embeddings.get(track_id)
        if emb is None or not snap.mapping or self.recogniser is None:
            return None, (snap.face if not snap.mapping or self.recogniser is None else default)
        matrix, sources = self._target_matrix(snap)
        if not sources:
            return None, default
        sims = matrix @ emb
        best = int(np.argmax(sims))
        if sims[best] < self.threshold:
            return None, default
        names = [m.target.name for m in snap.mapping if self.recogniser.name in m.target.embeddings]
        return names[best], sources[best]

    def identity(self, track_id: int) -> np.ndarray | None:
        """The cached (normalised) embedding of a track, if computed."""
        return self._embeddings.get(track_id)


__all__ = ["Assigner", "face_name", "is_photo_arg", "load_mappings", "load_target", "targets_loader"]
