"""OBS Studio control over obs-websocket 5 (through obsws-python).

Streamers bind keys in OBS (Settings -> Hotkeys) to show one scene item each. ``vcam obs setup``
builds a scene (default "FastSwap Faces") holding one image source per face, named
``Face: <name>``, plus a ``FastSwap: Swap`` source; :class:`ObsController` then watches it:

- a face source becoming visible (its "Show 'Face: <name>'" hotkey, or the eye icon) makes that face
  active and hides the other face sources (radio behaviour);
- showing/hiding ``FastSwap: Swap`` turns swapping on/off;
- showing/hiding ``FastSwap: Pause`` pauses/resumes (paused: the camera is closed and the virtual
  camera shows a still card, :mod:`vcam.runtime.pause`);
- a CustomEvent ``{"vcam": {"face": NAME|"next"|"prev", "swap": "on"|"off"|"toggle", "pause":
  true|false|"toggle"}}`` (OBS's BroadcastCustomEvent, what Stream Deck's websocket actions send)
  does the same; every such command is answered with a CustomEvent ``{"vcam_reply": {"ok": ...,
  "face": ..., "swap": ..., "paused": ...}}`` carrying ``"error"`` when it failed (an unknown face
  name, for example; a message nesting deeper than 64 levels is dropped before obsws-python parses
  it, and answered so when it mentions ``vcam``);
- changes made elsewhere (``vcam ctl``) are mirrored onto the sources' visibility;
- an optional text source (default "FastSwap Status") shows face, fps, latency, the mappings and
  the NaN guard counts (when non-zero) and the time of the update (a frozen time means vcam is
  gone), updated at most twice a second; on a clean exit it says "vcam stopped" with the time.

Per-person mapping (``[[swap.map]]``): each mapped person (target) gets a scene of their own,
``<scene>: <target>`` (default "FastSwap Faces: alice"), holding one image source per face named
``Face for <target>: <face>`` and a ``Face for <target>: (default)`` text source. Showing one of
them (its hotkey, listed under that scene in Settings -> Hotkeys, or the eye icon) gives that person
that face (``(default)``: they follow ``[swap] unmatched`` again), radio style like the faces; the
custom events ``{"vcam": {"map": {"target": T, "source": S}}}`` and ``{"vcam": {"unmap": T}}`` do
the same. ``vcam obs setup`` makes these scenes for the targets of the config's ``[[swap.map]]``.

Staying in sync: vcam's face and swap state is the truth OBS mirrors. Whenever the scene's structure
changes (``vcam obs setup`` re-run, a scene or source created, removed or renamed) and every
``ping_interval`` seconds, the scene is compared with the state and corrected (only the active face
visible, the swap source = swap on/off). After a reconnect the two are merged: a change made in
OBS while vcam was away (a face shown, swap toggled) is adopted if vcam's own state did not change
meanwhile; otherwise vcam's state wins.

Threads: obsws-python runs one listener thread per event client; our callbacks there only put
events on a queue. One worker thread (``vcam-obs``) owns both connections: it connects, handles the
queue, sends requests, and on any failure drops both clients and reconnects with backoff. Nothing
here is ever called from the frame loop, and no exception leaves the worker.

Passwords: taken from ``[obs] password`` or the environment variable named by
``[obs] password_env``; never logged. obsws-python logs connection parameters, password included, at
INFO, and logs every failed request with a traceback at ERROR, so its logger is raised to CRITICAL
whenever this module creates a client; this module reports failures itself, once, in plain words.

A rejected password is logged once as an error; the worker then retries quietly every
``auth_retry`` seconds (30 by default) so fixing the password in OBS is picked up without a restart.
Video is never affected.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

from vcam.config import ObsConfig
from vcam.control import short
from vcam.control.local import apply_control
from vcam.control.obs_audio import ObsAudio
from vcam.control.obs_mirror import SceneMirror
from vcam.control.obs_scene import (
    DEFAULT_CHOICE,
    FACE_PREFIX,
    MAX_EVENT_DEPTH,
    PAUSE_SOURCE,
    REPLY_KEY,
    SWAP_SOURCE,
    ObsAuthError,
    TooDeep,
    connect,
    face_source_name,
    hook_custom_events,
    map_choice,
    map_target,
    request_failed,
    scene_names,
    setup_scene,
)
from vcam.errors import ControlError, FaceError
from vcam.state import RuntimeState, Snapshot

log = logging.getLogger(__name__)


class _Lost(Exception):
    """The event connection ended; reconnect."""


def _guarded(name: str, fn):
    """Wrap an obsws-python callback: it is matched by ``__name__`` and must never raise."""

    def callback(data):
        try:
            fn(data)
        except Exception:
            log.exception("OBS event %s could not be handled", name)

    callback.__name__ = name
    return callback


class ObsController:
    """Keeps a supervised connection to OBS and maps its events onto :class:`RuntimeState`.

    ``start()`` returns at once; ``stop()`` disconnects and joins the worker. ``face_images``
    (face name -> image path) lets the controller add ``Face: <name>`` sources for faces missing
    from an existing control scene when it connects (it never creates the scene: `vcam obs setup`).
    """

    def __init__(
        self,
        cfg: ObsConfig,
        state: RuntimeState,
        *,
        face_images: dict[str, str | os.PathLike] | None = None,
        retry_min: float = 0.5,
        retry_max: float = 5.0,
        auth_retry: float = 30.0,
        request_timeout: float = 3.0,
        status_interval: float = 0.5,
        ping_interval: float = 2.0,
        stream: str | None = None,
        audio: ObsAudio | None = None,
    ) -> None:
        self.cfg = cfg
        self.audio = audio or ObsAudio()  # [obs] audio_sync: one controller of a daemon (the first stream's)
        self.state = state
        self.stream = stream  # a daemon running several streams: the one this controller serves
        self.face_images = dict(face_images or {})
        self.retry_min, self.retry_max, self.auth_retry = retry_min, retry_max, auth_retry
        self.request_timeout = request_timeout
        self.status_interval = max(0.5, status_interval)
        self.ping_interval = ping_interval
        self.connected = threading.Event()
        self.connections = 0  # successful connections so far (reconnects included)
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue()
        self._sync_pending = threading.Event()
        self._thread: threading.Thread | None = None
        self._req = None
        self._ev = None
        self.mirror = SceneMirror(cfg.scene, cfg.status_source)  # OBS's side of the control scenes
        self._last_text: str | None = None
        self._subscribed = False
        self._merge_pending = False
        self._obs_frames: int | None = None  # OBS's rendered-frame count when last seen (drops on a restart)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        if not self._subscribed:
            self.state.subscribe(self._on_state)
            self._subscribed = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vcam-obs", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._queue.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._close_clients()
        self.audio.left_behind()

    close = stop

    def __enter__(self) -> ObsController:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- called from other threads (must be quick and never raise) -----------------------------
    def _on_state(self, snap: Snapshot) -> None:
        self._sync_pending.set()
        self._queue.put(("wake",))

    def _callbacks(self) -> list:
        put = self._queue.put
        return [
            _guarded(
                "on_scene_item_enable_state_changed",
                lambda d: put(("item", d.scene_name, d.scene_item_id, bool(d.scene_item_enabled))),
            ),
            _guarded("on_scene_item_created", lambda d: put(("refresh",))),
            _guarded("on_scene_item_removed", lambda d: put(("refresh",))),
            _guarded("on_input_name_changed", lambda d: put(("refresh",))),
            _guarded("on_scene_created", lambda d: put(("refresh",))),
            _guarded("on_scene_removed", lambda d: put(("refresh",))),
            _guarded("on_scene_name_changed", lambda d: put(("refresh",))),
            _guarded("on_exit_started", lambda d: put(("exit",))),
        ]

    # -- worker ----------------------------------------------------------------------------------
    def _run(self) -> None:
        delay = self.retry_min
        reported: str | None = None  # the last failure kind we logged, to log each kind once
        while not self._stop.is_set():
            try:
                self._connect()
            except ObsAuthError as exc:
                self.last_error = str(exc)
                if reported != "auth":
                    log.error("%s; OBS control is off until this is fixed (video keeps running)", exc)
                    reported = "auth"
                self._close_clients()
                self._stop.wait(self.auth_retry)
                continue
            except Exception as exc:
                self.last_error = str(exc) if isinstance(exc, ControlError) else f"{type(exc).__name__}: {exc}"
                if reported not in ("unreachable", "lost"):
                    log.warning("%s; retrying in the background", self.last_error)
                else:
                    log.debug("OBS still unreachable: %s", self.last_error)
                reported = reported if reported == "lost" else "unreachable"
                self._close_clients()
                self._stop.wait(delay)
                delay = min(delay * 2, self.retry_max)
                continue
            delay = self.retry_min
            reported = None
            self.last_error = None
            self.connections += 1
            self.connected.set()
            log.info("connected to OBS at %s:%s", self.cfg.host, self.cfg.port)
            try:
                self._serve()
                self.audio.restore(self._req)
                self._say_stopped()
            except Exception as exc:
                if not self._stop.is_set():
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    if not isinstance(exc, _Lost):
                        log.debug("OBS connection error", exc_info=True)
                    log.warning("lost the connection to OBS; reconnecting in the background")
                    reported = "lost"
            finally:
                self.connected.clear()
                self._close_clients()
            if not self._stop.is_set():
                self._stop.wait(self.retry_min)

    def _connect(self) -> None:
        self._drop_stale_events()
        self._req = connect(self.cfg, timeout=self.request_timeout)
        self._ev = connect(self.cfg, events=True, timeout=self.request_timeout)
        hook_custom_events(self._ev, lambda data: self._queue.put(("custom", data)))
        self._ev.callback.register(self._callbacks())
        self._refresh()
        if self.face_images and self.cfg.scene in scene_names(self._req):
            have = self.mirror.sources(self.cfg.scene)
            missing = {n: p for n, p in self.face_images.items() if face_source_name(n) not in have}
            if missing:
                rep = setup_scene(
                    self._req, missing, scene=self.cfg.scene, status_source=self.cfg.status_source, active=self.state.active
                )
                if rep.created or rep.updated:
                    log.info("added OBS sources: %s", ", ".join(rep.created + rep.updated))
                self._refresh()
        self._last_text = None
        self.mirror.echoes.clear()
        self.audio.reconnected()
        # Merge what changed on either side while we were apart, unless OBS itself restarted: its
        # scene then holds whatever it last saved, not something the user just did.
        before, self._obs_frames = self._obs_frames, self._rendered_frames()
        restarted = before is not None and self._obs_frames is not None and self._obs_frames < before
        self._merge_pending = not restarted
        self._sync_pending.set()

    def _drop_stale_events(self) -> None:
        """Forget the visibility events the last connection left unhandled (and its exit notice):
        they may be the echoes of our own last sync, whose record is cleared with a new connection,
        and would then undo what vcam set while away. What the user changed in OBS meanwhile is not
        lost: the merge after the reconnect finds it in the scene. Commands (custom events) stay."""
        kept = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item[0] not in ("item", "exit"):
                kept.append(item)
        for item in kept:
            self._queue.put(item)

    def _close_clients(self) -> None:
        for attr in ("_ev", "_req"):
            client = getattr(self, attr)
            setattr(self, attr, None)
            if client is None:
                continue
            try:
                ws = client.base_client.ws
                ws.close(timeout=0.5)
            except Exception:
                pass
            worker = getattr(client, "worker", None)
            if worker is not None and worker is not threading.current_thread():
                worker.join(1.0)

    def _serve(self) -> None:
        last_status = 0.0
        last_request = time.monotonic()
        while not self._stop.is_set():
            if self._ev is None or not self._ev.worker.is_alive():
                raise _Lost("event connection closed")
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                item = None
            batch = [item] if item is not None else []
            while True:  # handle everything queued before mirroring state back
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for it in batch:
                if it[0] == "exit":
                    raise _Lost("OBS is exiting")
                self._requesting(self._handle, it)
                last_request = time.monotonic()
            if self._sync_pending.is_set():
                self._sync_pending.clear()
                merge, self._merge_pending = self._merge_pending, False
                self._requesting(self._sync_visibility, merge)
                last_request = time.monotonic()
            now = time.monotonic()
            self.audio.tick(self._req, self.state, now)
            if self.mirror.has_status and now - last_status >= self.status_interval:
                last_status = now
                self._update_status()
            if now - last_request >= self.ping_interval:
                # Also the keep-alive: compare the scene with the state and heal any difference.
                self._requesting(self._sync_visibility, False, True)
                self._obs_frames = self._rendered_frames()
                last_request = now

    # -- handlers (worker thread) -----------------------------------------------------------------
    def _requesting(self, fn, *args) -> None:
        """Run a handler; OBS answering 'no such source' (the user edited the scene meanwhile) only
        refreshes our view of the scene. Connection errors go up and cause a reconnect."""
        try:
            fn(*args)
        except Exception as exc:
            if not request_failed(exc):
                raise
            log.debug("OBS request failed: %s", exc)
            self._refresh()

    def _handle(self, item: tuple) -> None:
        kind = item[0]
        if kind == "item":
            _, scene, item_id, enabled = item
            if self.mirror.watches(scene):
                self._on_item(scene, item_id, enabled)
        elif kind == "custom":
            self._on_custom(item[1])
        elif kind == "refresh":
            self._refresh()
            self._sync_pending.set()  # the scene changed shape: show vcam's state on it again

    def _refresh(self) -> None:
        self.mirror.refresh(self._req)

    def _sync_visibility(self, merge: bool = False, quiet: bool = False) -> None:
        """Make the scenes show the state (see :meth:`SceneMirror.sync`); ``quiet`` (the periodic
        check): left to the next round when events are waiting, as they may explain a difference."""
        self.mirror.sync(self._req, self.state, merge=merge, skip_if=self._queue.qsize if quiet else None)

    def _on_item(self, scene: str, item_id: int, enabled: bool) -> None:
        name = self.mirror.changed(self._req, scene, item_id, enabled)
        if name is None:
            return  # our own change's event, or an item no longer there
        target = map_target(self.cfg.scene, scene)
        if target is not None:
            choice = map_choice(target, name)
            if enabled and choice is not None:
                self._choose(target, choice, name)
            return
        if name.startswith(FACE_PREFIX):
            if not enabled:
                return  # hiding a face (our own radio updates included) changes nothing
            face = name[len(FACE_PREFIX) :]
            try:
                self.state.set_face(face)
            except Exception as exc:  # an unknown or damaged face: say so, keep the connection
                log.warning("OBS showed '%s': %s", short(name), short(exc, 200))
                self._reply(False, error=str(exc))
            self._sync_pending.set()  # radio: hide the others (or re-hide an unknown face)
        elif name == SWAP_SOURCE:
            self.state.set_swap(enabled)
        elif name == PAUSE_SOURCE:
            self.state.set_paused(enabled)

    def _choose(self, target: str, choice: str, source: str) -> None:
        """A map scene's source was shown: ``target`` gets face ``choice`` (or the default)."""
        try:
            if choice != DEFAULT_CHOICE:
                self.state.set_mapping(target, choice)
            elif target in self.state.mappings:
                self.state.remove_mapping(target)
        except Exception as exc:  # mapping off, an unknown face: say so, keep the connection
            log.warning("OBS showed '%s': %s", short(source), short(exc, 200))
            self._reply(False, error=str(exc))
        self._sync_pending.set()  # radio: hide the other choices (or show the state's again)

    def _on_custom(self, data: Any) -> None:
        """A CustomEvent's raw data (see :func:`hook_custom_events`): ``{"vcam": {...}}`` is ours;
        anything else carrying ``vcam`` is answered with an error (one DEBUG line, not a warning:
        whoever sent it reads the reply)."""
        cmd, error = vet_custom_event(data, self.stream)
        if cmd is None:
            if error:
                self._reply(False, error=error)
            return
        error = None
        try:
            apply_control(self.state, cmd)
        except Exception as exc:  # a bad command or a damaged face: answered, never a dropped connection
            error = str(exc) if isinstance(exc, (FaceError, ControlError)) else f"{type(exc).__name__}: {exc}"
            error = short(error, 300)  # it holds the name sent, which may be huge
            log.warning("OBS custom event %s: %s", short(repr(cmd)), short(error, 200))
        self._reply(error is None, error=error)

    def _reply(self, ok: bool, *, error: str | None = None) -> None:
        self._req.broadcast_custom_event({"eventData": {REPLY_KEY: reply_body(self.state, ok, error, self.stream)}})

    def _rendered_frames(self) -> int | None:
        try:
            return int(self._req.get_stats().render_total_frames)
        except Exception as exc:
            if not request_failed(exc) and not isinstance(exc, (AttributeError, TypeError, ValueError)):
                raise
            return None

    def _update_status(self, text: str | None = None) -> bool:
        text = text or status_text(self.state)
        if text == self._last_text:
            return False
        try:
            self._req.set_input_settings(self.cfg.status_source, {"text": text}, True)
        except Exception as exc:
            if not request_failed(exc):
                raise
            self.mirror.has_status = False  # removed in OBS; looked up again on the next refresh
            return True
        self._last_text = text
        return True

    def _say_stopped(self) -> None:
        """On a clean stop: the status source says vcam stopped, and when (best effort)."""
        if not self.mirror.has_status or self._req is None:
            return
        try:
            self._update_status(f"vcam stopped (at {time.strftime('%H:%M:%S')})")
        except Exception:
            log.debug("could not mark the OBS status as stopped", exc_info=True)


def vet_custom_event(data: Any, stream: str | None) -> tuple[dict | None, str | None]:
    """A CustomEvent's raw data seen by the controller of ``stream`` (None: the daemon's only one):
    ``(command, None)`` to apply; ``(None, error)`` to answer with an error; ``(None, None)`` for an
    event that is someone else's or another stream's, left unanswered."""
    if isinstance(data, TooDeep):
        return None, too_deep_error(data)
    if not isinstance(data, dict) or "vcam" not in data:
        return None, None  # someone else's event
    cmd = data["vcam"]
    extra = [k for k in data if k != "vcam"]
    if extra:
        error = "a vcam custom event holds only 'vcam', not also " + ", ".join(short(repr(k), 40) for k in extra[:5])
        log.debug("ignored OBS custom event: %s", error)
        return None, error
    if not isinstance(cmd, dict):
        log.debug("ignored OBS custom event: 'vcam' is a %s, not an object", type(cmd).__name__)
        return None, '\'vcam\' must be an object like {"face": "NAME"}'
    target = cmd.get("stream")
    if target is not None and stream is not None and target != stream:
        return None, None  # another stream's controller answers it
    if target is not None and stream is None:
        return None, f"this vcam runs one stream, there is no stream {short(repr(target))}"
    return cmd, None


def too_deep_error(data: TooDeep) -> str | None:
    """What a custom event nested deeper than :data:`MAX_EVENT_DEPTH` is answered (None: it was not
    ours, nothing is said); one DEBUG line either way."""
    log.debug("ignored OBS custom event: nested deeper than %d levels", MAX_EVENT_DEPTH)
    return f"a vcam custom event nests at most {MAX_EVENT_DEPTH} levels deep" if data.ours else None


def reply_body(state: RuntimeState, ok: bool, error: str | None = None, stream: str | None = None) -> dict[str, Any]:
    """The ``vcam_reply`` custom event's data: ok, face, swap, paused, the desk's settings (when the
    run offers any) and the values of its choice settings (the cameras), mappings, and the stream
    and the error where there is one."""
    body: dict[str, Any] = {
        "ok": ok,
        "face": state.active,
        "swap": "on" if state.swap_enabled else "off",
        "paused": state.paused,
        "mappings": state.mappings,
    }
    if settings := state.settings:
        body["settings"] = settings
    if choices := state.choices():  # the cameras, for {"camera": "list"}
        body["choices"] = choices
    if stream is not None:
        body["stream"] = stream
    if error:
        body["error"] = error
    return body


def status_text(state: RuntimeState, now: float | None = None) -> str:
    """The OBS status source's text for ``state``: face, swap, fps and latency (PAUSED instead, at
    once, while the state asks for a pause), the mappings, the status's other parts and the time."""
    from dataclasses import replace

    from vcam.status import status_parts

    st = state.read_status()
    swap = "on" if state.swap_enabled else "off"
    stamp = time.strftime("%H:%M:%S", time.localtime(now))
    extra = ""
    mappings = state.mappings
    if mappings:
        extra += "  map: " + ", ".join(f"{t} -> {f}" for t, f in mappings.items())
    paused = state.paused  # said at once, not at the frame loop's next status
    for part in status_parts(replace(st, paused=False)):  # NaN guard counts, the GPU reading, the stages off under load
        extra += f"  {part}"
    numbers = "PAUSED (camera closed)" if paused else f"{st.fps_out:.1f} fps  {st.latency_p50_ms:.0f} ms"
    return f"face: {state.active or '-'}  swap: {swap}  {numbers}{extra}  (at {stamp})"
