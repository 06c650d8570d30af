"""Runtime state that control channels may change while frames flow.

Control threads (OBS, local socket, CLI) only post changes here; the frame loop reads one
immutable :class:`Snapshot` per frame with :meth:`RuntimeState.snapshot`. Each change builds the
next snapshot (under the lock, in the changing thread) and the frame loop only reads a pointer to
it: it never takes part in a change and never waits on I/O. Switching the active face is therefore
a pointer swap: the face's latents are computed before :meth:`set_face` is called.

Per-person mapping (``[[swap.map]]``, ``vcam ctl map``): the state keeps target name -> source
face name and the targets' reference faces (each with its recogniser embedding). The snapshot
carries them resolved to faces (:class:`Mapping`), so a face replaced on disk and reloaded is what
its mappings use from the next frame on. Which track gets which source is decided by
:class:`vcam.stages.mapping.Assigner`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from vcam.errors import ControlError, FaceError
from vcam.types import SourceFace


@dataclass(frozen=True)
class Mapping:
    """One per-person mapping: the person seen in ``target`` (a reference face carrying its
    recogniser embedding) gets ``source`` (a face prepared for the swapper)."""

    target: SourceFace
    source: SourceFace


@dataclass(frozen=True)
class Snapshot:
    """What one frame uses: the active face, swap on/off, the mappings (in the order they were set;
    a mapping whose source is not loaded is left out), whether the stream is to be paused, the
    desk's settings (:data:`vcam.control.commands.SETTINGS`: key -> value, only those this run
    offers) and a version that changes with any of them."""

    face: SourceFace | None
    swap_enabled: bool
    version: int
    mapping: tuple[Mapping, ...] = ()
    paused: bool = False
    settings: MappingProxyType[str, object] = field(default_factory=lambda: MappingProxyType({}))


@dataclass
class Status:
    """Live numbers published by the frame loop (read by the status line, OBS and `vcam ctl status`)."""

    fps_in: float = 0.0
    fps_out: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    frames_in: int = 0
    frames_out: int = 0
    dropped_capture: int = 0
    dropped_latency: int = 0
    over_budget: bool = False
    #: Frames are going out over the budget (the stream would otherwise freeze): see ``published_late``.
    overloaded: bool = False
    published_late: int = 0
    faces: int = 0
    guarded: dict[str, int] = field(default_factory=dict)  # model name -> faces passed through (NaN/Inf)
    full_scans: int = 0
    gpu: dict | None = None  # the newest GPU reading (vcam.telemetry.GpuSample.as_dict()), None without telemetry
    upscale_skipped: int = 0  # frames resized instead of enhanced: the frame enhancer would have pushed them over the budget
    degraded: tuple[str, ...] = ()  # optional stages turned off under load (vcam.runtime.degrade), in the order they went
    #: Engine notes: 'swapper: remote gpu-box:8001 down since 12:01:03', 'swapper: compiling engines: 2/4, ~40 s left'.
    engines: tuple[str, ...] = ()
    #: Paused: the camera closed, a still card published (:mod:`vcam.runtime.pause`).
    paused: bool = False
    #: The video's delay behind its sound, for OBS's audio sync offset (``[obs] audio_sync``): the
    #: capture-to-publish p50 of the last :data:`vcam.status.AV_WINDOW` frames plus the camera's frame
    #: time (a frame is exposed over the interval before it arrives); 0 before the first frame.
    av_delay_ms: float = 0.0

    @property
    def guarded_total(self) -> int:
        return sum(self.guarded.values())

    def guard_text(self) -> str:
        """``NaN guard: inswapper_128 3, gfpgan_1.4 1`` (models with a non-zero count), or ''."""
        return guard_text(self.guarded)

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out["guarded"] = dict(self.guarded)
        out["gpu"] = _copy_gpu(self.gpu)
        out["degraded"] = list(self.degraded)
        out["engines"] = list(self.engines)
        return out

    def copy(self) -> Status:
        """A copy sharing nothing mutable with this one."""
        return replace(self, guarded=dict(self.guarded), gpu=_copy_gpu(self.gpu), degraded=tuple(self.degraded))


def _copy_gpu(gpu: dict | None) -> dict | None:
    """A GPU reading's dict, copied (its list of throttle reasons too); None stays None."""
    if gpu is None:
        return None
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in gpu.items()}


def guard_text(guarded: dict[str, int]) -> str:
    """The per-model NaN/Inf guard counts as one phrase, '' when every count is zero."""
    parts = [f"{name} {n}" for name, n in guarded.items() if n]
    return f"NaN guard: {', '.join(parts)}" if parts else ""


_UNSET = object()

MAPPING_OFF_HINT = "start `vcam run` with --map TARGET=SOURCE or a [[swap.map]] entry in config.toml"


class RuntimeState:
    """The active face, swap on/off, pause, the known faces and the per-person mappings, behind one lock."""

    def __init__(self, faces: dict[str, SourceFace] | None = None, active: str | None = None, swap_enabled: bool = True):
        self._lock = threading.Lock()
        self._loader: Callable[[str], SourceFace] | None = None
        self._target_loader: Callable[[str], SourceFace] | None = None
        self._faces: dict[str, SourceFace] = dict(faces or {})
        self._active = active if active in self._faces else None
        self._swap = swap_enabled
        self._paused = False
        self._targets: dict[str, SourceFace] = {}  # target name -> reference face (with its embedding)
        self._aliases: dict[str, str] = {}  # what a target was given as (a photo path) -> its name
        self._maps: dict[str, str] = {}  # target name -> source face name, in the order they were set
        self._settings: dict[str, object] = {}  # the desk's settings this run offers (see offer)
        self._choices: dict[str, list[tuple[object, str]]] = {}  # a choice setting's values, as last listed
        self._listers: dict[str, Callable[[bool], list[tuple[object, str]]]] = {}
        self._appliers: dict[str, Callable[[object], None]] = {}
        self._version = 0
        self._snap: Snapshot
        self._rebuild()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self.status = Status()
        self._status_lock = threading.Lock()

    # -- frame loop side ---------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The state as of the last change: one pointer read, whatever the control threads do."""
        return self._snap

    def publish_status(self, status: Status) -> None:
        with self._status_lock:
            self.status = status.copy()

    def read_status(self) -> Status:
        with self._status_lock:
            return self.status.copy()

    def _rebuild(self) -> None:
        """The next snapshot, after a change (call with the lock held)."""
        face = self._faces.get(self._active) if self._active else None
        mapping = tuple(
            Mapping(self._targets[t], self._faces[s]) for t, s in self._maps.items() if t in self._targets and s in self._faces
        )
        self._snap = Snapshot(
            face=face,
            swap_enabled=self._swap,
            version=self._version,
            mapping=mapping,
            paused=self._paused,
            settings=MappingProxyType(dict(self._settings)),
        )

    def _changed(self) -> None:
        """A new version and snapshot (call with the lock held)."""
        self._version += 1
        self._rebuild()

    # -- control side ------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._faces)

    @property
    def active(self) -> str | None:
        with self._lock:
            return self._active

    @property
    def swap_enabled(self) -> bool:
        with self._lock:
            return self._swap

    @property
    def paused(self) -> bool:
        """Whether the stream is to be paused (the frame loop closes its camera and publishes a
        still card; :mod:`vcam.runtime.pause`)."""
        with self._lock:
            return self._paused

    def add_face(self, face: SourceFace, *, activate: bool | None = None) -> None:
        """Add (or replace) a loaded face. ``activate``: True makes it the active face; None (the
        default) only when no face is active; False never (a mapping's source, say)."""
        with self._lock:
            self._faces[face.name] = face
            if activate or (activate is None and self._active is None):
                self._active = face.name
            self._changed()
        self._notify()

    def remove_face(self, name: str) -> None:
        with self._lock:
            self._faces.pop(name, None)
            if self._active == name:
                self._active = None
            self._changed()
        self._notify()

    def set_loader(self, loader: Callable[[str], SourceFace] | None) -> None:
        """``loader(name)`` prepares a face that is not loaded yet (e.g. added to the face bank while
        the daemon runs); :meth:`set_face` calls it in the calling (control) thread, never the frame loop."""
        with self._lock:
            self._loader = loader

    def face(self, name: str) -> SourceFace | None:
        """The loaded face ``name`` (None when it is not loaded)."""
        with self._lock:
            return self._faces.get(name)

    def _ensure_face(self, name: str) -> None:
        """Load face ``name`` through the loader when it is not loaded yet (outside the lock: slow).
        It does not become active."""
        with self._lock:
            loader = None if name in self._faces else self._loader
        if loader is not None:
            self.add_face(loader(name), activate=False)

    def _unknown_face(self, name: str) -> FaceError:
        names = sorted(self._faces)
        if not names:
            return FaceError("no faces are loaded", hint="add one with `vcam faces add PHOTO`", page_hint="add a photo below")
        return FaceError(f"unknown face '{name}'", hint=f"known faces: {', '.join(names)}")

    def set_face(self, name: str) -> str:
        """Make ``name`` (or ``next``/``prev``) active; returns the active name. Raises FaceError.

        A name that is not loaded is loaded first through the loader, if one is set (slow, but in the
        caller's thread and outside the lock: frames keep flowing meanwhile).
        """
        if name not in ("next", "prev"):
            self._ensure_face(name)
        with self._lock:
            names = sorted(self._faces)
            if name in ("next", "prev") and names:
                i = names.index(self._active) if self._active in names else -1
                step = 1 if name == "next" else -1
                name = names[(i + step) % len(names)] if i >= 0 else names[0]
            elif name not in self._faces:
                raise self._unknown_face(name)
            changed = name != self._active
            self._active = name
            if changed:
                self._changed()
        if changed:
            self._notify()
        return name

    def set_swap(self, value: str | bool) -> bool:
        """``on``/``off``/``toggle`` (or a bool; not 0, 1 or other numbers); returns the new state."""
        with self._lock:
            if isinstance(value, bool):
                new = value
            elif value == "toggle" and isinstance(value, str):
                new = not self._swap
            elif value in ("on", "off") and isinstance(value, str):
                new = value == "on"
            else:
                raise ValueError(f"swap must be on, off or toggle, got {value!r}")
            changed = new != self._swap
            self._swap = new
            if changed:
                self._changed()
        if changed:
            self._notify()
        return new

    def set_paused(self, value: str | bool) -> bool:
        """``True``/``False`` or ``"toggle"``; returns the new state. ValueError for anything else."""
        with self._lock:
            if isinstance(value, bool):
                new = value
            elif isinstance(value, str) and value == "toggle":
                new = not self._paused
            else:
                raise ValueError(f"pause must be true, false or toggle, got {value!r}")
            changed = new != self._paused
            self._paused = new
            if changed:
                self._changed()
        if changed:
            self._notify()
        return new

    # -- the desk's settings (control side) -----------------------------------------------------
    @property
    def settings(self) -> dict[str, object]:
        """The settings this run offers, key -> value (:data:`vcam.control.commands.SETTINGS`)."""
        with self._lock:
            return dict(self._settings)

    def offer(
        self,
        key: str,
        value: object,
        *,
        choices: Callable[[bool], list[tuple[object, str]]] | None = None,
        apply: Callable[[object], None] | None = None,
    ) -> None:
        """The runtime offers setting ``key`` in this run, starting at ``value`` (the config's);
        control channels may then change it with :meth:`set_setting`. ``choices(refresh)``: the
        values a "choice" setting may take, ``(value, label)`` each (``refresh``: look again, e.g.
        for cameras plugged in since; slow work allowed, in the asking control thread). ``apply(value)``:
        work a change needs before it holds (a camera opened), run in the changing control thread
        outside the lock; what it raises leaves the setting as it was."""
        with self._lock:
            if choices is not None:
                self._listers[key] = choices
            if apply is not None:
                self._appliers[key] = apply
        if choices is not None:
            self.refresh_choices(key, refresh=False)
        self._put(key, value)

    def choices(self) -> dict[str, list[tuple[object, str]]]:
        """The values each offered "choice" setting may take, as last listed: key -> [(value, label)]."""
        with self._lock:
            return {k: list(v) for k, v in self._choices.items()}

    def refresh_choices(self, key: str, *, refresh: bool = True) -> list[tuple[object, str]]:
        """List the values setting ``key`` may take again (its lister's, outside the lock; slow work
        allowed there) and keep them for :meth:`choices`; [] for a setting without a lister."""
        with self._lock:
            lister = self._listers.get(key)
        listed = list(lister(refresh)) if lister is not None else []
        with self._lock:
            changed = self._choices.get(key) != listed
            self._choices[key] = listed
            if changed:
                self._changed()
        if changed:
            self._notify()
        return listed

    def set_setting(self, key: str, value: object) -> object:
        """Change setting ``key`` (validated by the caller, :func:`vcam.control.commands.apply_setting`);
        returns the value. ControlError when this run does not offer ``key``; what the setting's
        ``apply`` raises (see :meth:`offer`), the setting unchanged."""
        with self._lock:
            offered = key in self._settings
            apply = self._appliers.get(key) if self._settings.get(key, _UNSET) != value else None
        if not offered:
            raise ControlError(f"'{key}' is not available in this run")
        if apply is not None:
            apply(value)
        self._put(key, value)
        return value

    def _put(self, key: str, value: object) -> None:
        with self._lock:
            changed = self._settings.get(key, _UNSET) != value
            self._settings[key] = value
            if changed:
                self._changed()
        if changed:
            self._notify()

    # -- per-person mapping (control side) ---------------------------------------------------
    def set_target_loader(self, loader: Callable[[str], SourceFace] | None) -> None:
        """``loader(name_or_photo)`` loads a target reference face with the run's recogniser
        embedding (:func:`vcam.stages.mapping.load_mappings` sets it when a recogniser is loaded). Without
        one, :meth:`set_mapping` only accepts targets already registered, and says how to turn
        mapping on when there are none."""
        with self._lock:
            self._target_loader = loader

    @property
    def mapping_enabled(self) -> bool:
        """Whether :meth:`set_mapping` can work in this run (a recogniser is loaded, or targets are)."""
        with self._lock:
            return self._target_loader is not None or bool(self._targets)

    def add_target(self, face: SourceFace, *, given_as: str | None = None) -> str:
        """Register a target reference face (it must carry an embedding); returns its name, the key
        of its mapping. ``given_as``: what the user named it by (a photo path), accepted too."""
        if not face.embeddings:
            raise FaceError(f"target face '{face.name}' has no recogniser embedding", hint="load it with the run's recogniser")
        with self._lock:
            self._targets[face.name] = face
            if given_as and given_as != face.name:
                self._aliases[given_as] = face.name
            if face.name in self._maps:
                self._changed()
                changed = True
            else:
                changed = False
        if changed:
            self._notify()
        return face.name

    def _target_name(self, target: str) -> str | None:
        """The registered target ``target`` names (its name or what it was given as), else None
        (call with the lock held)."""
        if target in self._targets:
            return target
        return self._aliases.get(target)

    def set_mapping(self, target: str, source: str) -> dict[str, str]:
        """Give the person ``target`` (a target's name, or a face-bank name / photo path the target
        loader can load) the face ``source`` (a loaded face, or a face-bank name the loader loads).
        Slow loads happen here, in the calling thread and outside the lock. Returns the mappings.
        Raises FaceError for an unknown face and ControlError when mapping is off in this run."""
        if not isinstance(target, str) or not target or not isinstance(source, str) or not source:
            raise ControlError("a mapping needs a target and a source face name", hint="e.g. map alice grace")
        with self._lock:
            name = self._target_name(target)
            loader = self._target_loader if name is None else None
            known = sorted(self._targets)
        if name is None:
            if loader is None:
                if not known:
                    raise ControlError("per-person mapping is off in this run (no recogniser is loaded)", hint=MAPPING_OFF_HINT)
                raise FaceError(f"unknown target '{target}'", hint=f"known targets: {', '.join(known)}")
            name = self.add_target(loader(target), given_as=target)
        self._ensure_face(source)
        with self._lock:
            if source not in self._faces:
                raise self._unknown_face(source)
            changed = self._maps.get(name) != source
            self._maps[name] = source
            if changed:
                self._changed()
            out = dict(self._maps)
        if changed:
            self._notify()
        return out

    def remove_mapping(self, target: str) -> dict[str, str]:
        """Drop the mapping of ``target`` (its name or what it was given as); that person then follows
        the default again. Returns the mappings; FaceError when ``target`` has none."""
        with self._lock:
            name = self._target_name(target) or target
            if name not in self._maps:
                mapped = ", ".join(self._maps)
                raise FaceError(
                    f"'{target}' has no mapping", hint=f"mapped targets: {mapped}" if mapped else "there are no mappings"
                )
            del self._maps[name]
            self._changed()
            out = dict(self._maps)
        self._notify()
        return out

    @property
    def mappings(self) -> dict[str, str]:
        """Target name -> source face name, in the order they were set."""
        with self._lock:
            return dict(self._maps)

    @property
    def targets(self) -> list[str]:
        """The registered target names (mapped or not)."""
        with self._lock:
            return sorted(self._targets)

    def subscribe(self, fn: Callable[[Snapshot], None]) -> None:
        """Call ``fn(snapshot)`` after every change (from the changing thread; keep it quick)."""
        with self._lock:
            self._listeners.append(fn)

    def _notify(self) -> None:
        snap = self.snapshot()
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(snap)
            except Exception:  # a listener must never break control
                import logging

                logging.getLogger(__name__).exception("state listener failed")
