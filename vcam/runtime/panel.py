"""The daemon's side of the control panel: :class:`DaemonBackend` answers the panel's questions
(:class:`vcam.panel.view.Backend`) from the running daemon, and :func:`start_panel` serves it.

Faces added from the panel go through :meth:`vcam.stages.faces.FaceBank.add` with the detector
`vcam faces add` uses (its own instance, never the frame loop's) and the run's recogniser, then load
into every stream as a face added to the bank while the daemon runs does (not activated). A person
in view is mapped by the identity the run's recogniser gave their track: a target named
``person-ID`` carrying that embedding, then the ``map`` command of ``vcam ctl``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from vcam.control.local import handle_command
from vcam.errors import ControlError, FaceError, VcamError
from vcam.panel.access import source_url
from vcam.state import MAPPING_OFF_HINT, RuntimeState
from vcam.types import SourceFace

log = logging.getLogger(__name__)


class DaemonBackend:
    """:class:`vcam.panel.view.Backend` over a running daemon (``d``: as
    :class:`vcam.runtime.startup.Daemon` describes it)."""

    def __init__(self, d: Any) -> None:
        self.d = d
        self.states: dict[str, RuntimeState] = {st.name: st.state for st in d.streams}
        self.faces_dir: Path = d.cfg.faces_dir
        self._detector: Any = None
        self._lock = threading.Lock()  # one bank change at a time

    def _stream(self, name: str) -> Any:
        for st in self.d.streams:
            if st.name == name:
                return st
        raise ControlError(f"no stream {name!r}", hint="streams of this daemon: " + ", ".join(self.states))

    def info(self) -> dict:
        asm = self.d.assembly
        if asm is None:
            return {"device": "", "models": []}
        models = [{"role": p.role, "model": p.model, "where": p.where} for p in asm.current_placements()]
        return {"device": asm.device, "models": models}

    def published(self, stream: str) -> int:
        return self._stream(stream).summary.frames_out

    def people(self, stream: str) -> list[dict]:
        st = self._stream(stream)
        pipe = st.pipeline
        if pipe is None:
            return []
        snap = st.state.snapshot()
        assigner = getattr(pipe, "assigner", None)
        out = []
        for t in list(getattr(pipe, "last_tracks", None) or ()):
            if assigner is not None:
                target, source = assigner.match(t.id, snap)
            else:
                target, source = None, snap.face
            if not snap.swap_enabled:
                source = None
            box = [round(float(v)) for v in np.asarray(t.box).reshape(-1)[:4]]
            out.append({"track": int(t.id), "box": box, "target": target, "source": source.name if source else None})
        return out

    def map_person(self, stream: str, track: int, source: str) -> dict:
        st = self._stream(stream)
        pipe = st.pipeline
        assigner = getattr(pipe, "assigner", None)
        state = st.state
        if assigner is None or assigner.recogniser is None:
            raise ControlError("per-person mapping is off in this run (no recogniser is loaded)", hint=MAPPING_OFF_HINT)
        if not any(t.id == track for t in (getattr(pipe, "last_tracks", None) or ())):
            raise FaceError(f"person {track} is no longer in view", hint="pick someone in view now")
        target, _ = assigner.match(track, state.snapshot())
        if target is None:
            identity = assigner.identity(track)
            if identity is None:
                raise FaceError(f"person {track} is not recognised yet", hint="try again in a moment")
            face = SourceFace(
                name=f"person-{track}",
                image=np.zeros((1, 1, 3), np.uint8),
                embeddings={assigner.recogniser.name: np.asarray(identity, np.float32)},
            )
            target = state.add_target(face)
        cmd: dict[str, Any] = {"map": {"target": target, "source": source}}
        if len(self.states) > 1:
            cmd["stream"] = stream
        return handle_command(state, cmd, self.states if len(self.states) > 1 else None)

    def _photo_detector(self) -> Any:
        """The detector `vcam faces add` uses, built once (not the frame loop's: no sharing)."""
        if self._detector is None:
            from vcam.runtime.roles import stage_params
            from vcam.stages.detect import RetinaFaceDetector
            from vcam.stages.detections import DetectParams

            cfg = self.d.cfg
            self._detector = RetinaFaceDetector(stage_params(DetectParams, cfg.detect), cfg.track.roi_size, backend="onnxruntime")
        return self._detector

    def add_face(self, photo: Path, name: str | None, pick: int | None = None) -> str:
        from vcam.stages.faces import FaceBank

        asm = self.d.assembly
        recogniser = asm.recogniser if asm is not None else None
        bank = FaceBank(self.faces_dir)
        with self._lock:
            entry = bank.add(photo, name, pick, detector=self._photo_detector(), recogniser=recogniser)
        if asm is not None:
            try:
                face = bank.load(entry.name, recogniser=recogniser, swappers=[asm.swapper])
            except VcamError as exc:  # stored, but not loadable now: it loads on first use
                log.warning("face '%s' added but not loaded: %s", entry.name, exc)
                return entry.name
            for state in self.states.values():
                state.add_face(face, activate=False)
        log.info("face '%s' added from the panel", entry.name)
        return entry.name

    def remove_face(self, name: str) -> None:
        from vcam.stages.faces import FaceBank

        bank = FaceBank(self.faces_dir)
        if name not in bank:
            loaded = any(state.face(name) is not None for state in self.states.values())
            raise FaceError(
                f"'{name}' is not in the face bank" if loaded else f"unknown face '{name}'",
                hint="it was given to `vcam run` as a photo; only bank faces can be removed"
                if loaded
                else "known faces: " + ", ".join(bank.names()),
            )
        with self._lock:
            bank.remove(name)
        for state in self.states.values():
            state.remove_face(name)
        log.info("face '%s' removed from the panel", name)


def obs_source_address(cfg: Any) -> tuple[str, int, int]:
    """The direct OBS source's URL and size for `vcam obs setup`: the running daemon's (its panel
    file), else what a run of ``cfg`` will serve (``[panel]`` host and port, the key kept beside
    the control socket, made now when missing, ``[capture]`` size)."""
    from vcam.panel.access import load_source_key, read_panel_file

    data = read_panel_file(cfg.panel_file) or {}
    if isinstance(data.get("source_url"), str):
        return data["source_url"], int(data.get("width") or cfg.capture.width), int(data.get("height") or cfg.capture.height)
    host = "127.0.0.1" if cfg.panel.host in ("0.0.0.0", "::", "") else cfg.panel.host
    scheme = "https" if cfg.panel.tls_cert and cfg.panel.tls_key else "http"
    base = f"{scheme}://{f'[{host}]' if ':' in host else host}:{cfg.panel.port}"
    return source_url(base, load_source_key(cfg.source_key_file)), cfg.capture.width, cfg.capture.height


def source_facts(d: Any, server: Any) -> dict:
    """The OBS source's URL and size for the panel file (`vcam obs setup` reads them); {} when off."""
    if not server.source_key:
        return {}
    out = d.streams[0].output
    w, h = (out.width, out.height) if out is not None else (d.cfg.capture.width, d.cfg.capture.height)
    return {"source_url": source_url(server.base_url, server.source_key), "width": w, "height": h}


def _wire_frames(d: Any, server: Any) -> None:
    """The frame loop's hooks into the panel's server: each published frame offered to the preview
    (and the OBS source), and, with before/after on, the input frame kept for the preview only."""
    offer = server.tap.offer
    feed = server.source.offer if server.source is not None else None

    # A published frame stays valid until `ring` more frames are begun; one more may already be
    # begun when it is published where rounds overlap (the GPU). Asked at each frame: an early
    # swap (vcam.runtime.early_swap) changes the pipelines and the ops between two frames.
    pairs: dict[str, bool] = {}  # stream -> before/after on (set by the setting's change, before it holds)

    def tap(st: Any, data: Any) -> None:
        summary = st.summary
        overlap = bool(getattr(getattr(d.assembly, "ops", None), "concurrent", False))
        slack = max(0, int(getattr(st.pipeline, "ring", 1)) - (2 if overlap else 1))
        # a frame begun while before/after was on and published after it went off is shown alone
        seq = st.shown_seq if pairs.get(st.name) else -1
        offer(st.name, data, st.output.fmt, lambda: summary.frames_in, slack, seq)
        if feed is not None:
            feed(st.name, data, st.output.fmt, lambda: summary.frames_in, slack)

    d.rounds.tap = tap
    watched, keep = server.tap.wants_before, server.tap.keep_before

    def before(st: Any, frame: Any) -> None:  # before/after: the input frame, kept small for the preview only
        if watched(st.name):  # watched, and a preview frame due soon
            settings = st.state.snapshot().settings
            if settings.get("before_after"):
                keep(st.name, frame.seq, frame.data, frame.fmt, bool(settings.get("mirror")))

    d.rounds.before = before
    for st in d.streams:
        st.state.offer("before_after", False, apply=lambda on, name=st.name: pairs.__setitem__(name, bool(on)))


def start_panel(d: Any, up: Any) -> Any:
    """Serve the panel for daemon ``d`` (``[panel]``); returns the server (a component: stopped with
    the daemon) or None when the panel is off or cannot start (one warning line; the video goes on).
    With its default port in use (another vcam), it serves on a free port and says which in a line.
    A link with a one-time code goes to ``d.announce``; when this daemon holds the control socket's
    lock, the address and the token go into the panel file beside the socket (mode 0600), from which
    `vcam panel` makes fresh links."""
    pcfg = d.cfg.panel
    if not pcfg.enabled:
        if d.cfg.obs_source:
            log.warning("the OBS source is off: the panel's server serves it, and the panel is off ([panel] enabled)")
        return None
    from vcam.config import PanelConfig
    from vcam.panel.access import (
        load_pairing_key,
        load_source_key,
        new_token,
        read_panel_file,
        remove_panel_file,
        write_panel_file,
    )
    from vcam.panel.server import PanelServer
    from vcam.panel.source import SourceTap

    path = d.cfg.panel_file
    try:
        kept = (read_panel_file(path) or {}) if up.locks is not None else {}
    except VcamError as exc:  # another user's file: nothing in it is used, it is replaced below
        log.warning("%s", exc)
        kept = {}
    previous = kept.get("token") if pcfg.keep_token else None
    try:
        server = PanelServer(
            DaemonBackend(d),
            token=new_token(previous),
            host=pcfg.host,
            port=pcfg.port,
            tls_cert=pcfg.tls_cert,
            tls_key=pcfg.tls_key,
            # The default port taken (another vcam's panel): any free one, said below. A port the
            # user chose is theirs (a dock's URL, a firewall rule): taken or the panel stays off.
            or_free_port=pcfg.port == PanelConfig().port,
            # kept across runs beside the panel file: an open page follows a restarted daemon
            pairing_key=load_pairing_key(path.with_name(path.name + "key") if up.locks is not None else None),
            # the OBS Browser Source's key, kept across runs like the pairing key (its URL is in OBS's scene)
            source=SourceTap() if d.cfg.obs_source else None,
            source_key=load_source_key(d.cfg.source_key_file if up.locks is not None else None) if d.cfg.obs_source else None,
            remember=pcfg.keep_token,  # a dock reloaded by OBS proves the key it kept (README: the cost)
        )
        server.start()
    except VcamError as exc:
        log.warning("panel disabled: %s", exc)
        return None
    if server.moved_from is not None:
        log.warning("panel: port %d is in use (another vcam?), so this run's panel is on port %d", server.moved_from, server.port)
    _wire_frames(d, server)
    if up.locks is not None:
        try:
            write_panel_file(path, server.base_url + "/", server.token, **source_facts(d, server))
        except OSError as exc:
            log.warning("cannot write %s (`vcam panel` will not find the URL): %s", path, exc)
    announce = getattr(d, "announce", None)
    if announce is not None:
        announce(f"panel: {server.url}")
        announce("  (the link opens the panel once, within 2 minutes; `vcam panel` prints a fresh one)")
        if server.source_key:
            announce(f"OBS source: {source_url(server.base_url, server.source_key)}")
    else:
        log.info("panel at %s", server.base_url)

    class _Stop:
        panel = server

        def stop(self) -> None:
            d.rounds.tap = d.rounds.before = None
            server.stop()
            if up.locks is not None and not pcfg.keep_token:  # kept: the next run reuses its token
                remove_panel_file(path)

    return _Stop()
