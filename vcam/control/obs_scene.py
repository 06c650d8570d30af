"""OBS Studio over obs-websocket 5: the names vcam gives OBS scenes and sources, connecting, the
scene ``vcam obs setup`` builds, and ``vcam check``'s probe. :mod:`vcam.control.obs` watches that
scene while vcam runs (its docstring describes the sources and the custom events).

Passwords: taken from ``[obs] password`` or the environment variable named by
``[obs] password_env``; never logged. obsws-python logs connection parameters, password included, at
INFO, and logs every failed request with a traceback at ERROR, so its logger is raised to CRITICAL
whenever this module creates a client; this module reports failures itself, once, in plain words.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vcam.config import Config, ObsConfig
from vcam.errors import ControlError

log = logging.getLogger("vcam.control.obs")

FACE_PREFIX = "Face: "
SWAP_SOURCE = "FastSwap: Swap"
PAUSE_SOURCE = "FastSwap: Pause"  # shown: paused (the camera closed, a still card out)
CAMERA_SOURCE = "FastSwap Cam"
TEXT_KIND = "text_ft2_source_v2"
BROWSER_SOURCE = "FastSwap Source"  # the direct OBS source: a Browser Source on vcam's MJPEG
BROWSER_KIND = "browser_source"
NO_BROWSER = (
    "OBS has no Browser Source (its browser plugin is not loaded; Debian's own OBS package has none, OBS's "
    "Flatpak and PPA builds do)"
)
REPLY_KEY = "vcam_reply"
MAX_EVENT_DEPTH = 64  # deeper websocket messages are dropped before obsws-python parses them


class TooDeep:
    """Handed to ``on_custom`` (see :func:`hook_custom_events`) for a message nesting deeper than
    :data:`MAX_EVENT_DEPTH`; ``ours``: it mentions ``"vcam"`` (so its sender waits for a reply)."""

    def __init__(self, ours: bool) -> None:
        self.ours = ours


def nests_deeper(text: str | bytes, limit: int) -> bool:
    """Whether the JSON ``text`` nests arrays and objects deeper than ``limit`` (brackets inside
    strings do not count). Linear, no recursion: cheap next to the parse it spares."""
    import re

    raw = text.encode("utf-8", "replace") if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for m in re.finditer(rb'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', raw):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif tok in (b"]", b"}"):
            depth -= 1
    return False


MAP_PREFIX = "Face for "
DEFAULT_CHOICE = "(default)"  # in a map scene: the person follows [swap] unmatched


def face_source_name(face: str) -> str:
    return f"{FACE_PREFIX}{face}"


def map_scene_name(scene: str, target: str) -> str:
    """The scene of one mapped person: ``FastSwap Faces: alice``."""
    return f"{scene}: {target}"


def map_source_name(target: str, face: str) -> str:
    """The source that gives ``target`` the face ``face`` (or :data:`DEFAULT_CHOICE`)."""
    return f"{MAP_PREFIX}{target}: {face}"


def map_target(scene: str, name: str) -> str | None:
    """The target whose map scene ``name`` is (for the control scene ``scene``), else None."""
    prefix = f"{scene}: "
    return (name[len(prefix) :] or None) if name.startswith(prefix) else None


def map_choice(target: str, source: str) -> str | None:
    """The face (or :data:`DEFAULT_CHOICE`) the source ``source`` of ``target``'s scene stands for."""
    prefix = map_source_name(target, "")
    return (source[len(prefix) :] or None) if source.startswith(prefix) else None


def show_hotkey(source: str) -> str:
    """The libobs hotkey name that shows ``source`` (bindable in OBS, triggerable over the websocket)."""
    return f"libobs.show_scene_item.{source}"


def obs_password(cfg: ObsConfig) -> str:
    """The websocket password: ``[obs] password``, else the environment variable it names."""
    if cfg.password:
        return cfg.password
    return os.environ.get(cfg.password_env, "") if cfg.password_env else ""


def quiet_obsws_logger() -> None:
    """obsws-python logs the password at INFO and expected request misses at ERROR: silence both."""
    lg = logging.getLogger("obsws_python")
    if lg.level < logging.CRITICAL:
        lg.setLevel(logging.CRITICAL)


# --- connecting ------------------------------------------------------------------------------


class ObsAuthError(ControlError):
    """OBS refused the websocket password (or none was given while OBS wants one)."""


def _auth_error(cfg: ObsConfig, given: bool) -> ObsAuthError:
    what = "rejected the websocket password" if given else "asks for a websocket password and none is set"
    return ObsAuthError(
        f"OBS at {cfg.host}:{cfg.port} {what}",
        hint=f"set ${cfg.password_env} (or [obs] password) to the password in OBS: Tools -> WebSocket Server Settings",
    )


def _unreachable(cfg: ObsConfig, exc: BaseException) -> ControlError:
    """Nothing listening (connection refused: the server is off) is not the same as something
    listening that never answers (a timeout: OBS hung, or a firewall dropping packets)."""
    from websocket import WebSocketTimeoutException

    where = f"{cfg.host}:{cfg.port}"
    if isinstance(exc, (TimeoutError, WebSocketTimeoutException)):
        return ControlError(
            f"OBS at {where} did not answer in time (timed out)",
            hint="OBS (or whatever listens on that port) is not answering: check that OBS is not frozen, "
            "or restart it; check [obs] host/port",
        )
    if isinstance(exc, ConnectionRefusedError):
        return ControlError(
            f"OBS is not reachable at {where} (connection refused)",
            hint="start OBS and enable Tools -> WebSocket Server Settings -> Enable WebSocket server, or fix [obs] host/port",
        )
    return ControlError(
        f"OBS is not reachable at {where} ({type(exc).__name__})",
        hint="start OBS and enable Tools -> WebSocket Server Settings -> Enable WebSocket server, or fix [obs] host/port",
    )


def connect(cfg: ObsConfig, *, events: bool = False, timeout: float = 3.0):
    """Open an obsws-python ``ReqClient`` (or ``EventClient`` when ``events``); raise ControlError.

    Raises :class:`ObsAuthError` for a refused password and :class:`ControlError` when nothing
    answers. The returned client's requests time out after ``timeout`` seconds.
    """
    quiet_obsws_logger()
    import obsws_python as obsws
    from obsws_python.error import OBSSDKError
    from websocket import WebSocketException

    password = obs_password(cfg)
    kind = obsws.EventClient if events else obsws.ReqClient
    try:
        return kind(host=cfg.host, port=cfg.port, password=password, timeout=timeout)
    except OBSSDKError as exc:
        text = str(exc)
        if "no password" in text or "identify" in text:
            raise _auth_error(cfg, bool(password)) from None
        raise ControlError(f"OBS at {cfg.host}:{cfg.port} refused the connection: {text}") from None
    except (OSError, WebSocketException, ValueError) as exc:
        raise _unreachable(cfg, exc) from None


def hook_custom_events(client: Any, on_custom) -> None:
    """Make the obsws-python EventClient ``client`` hand every CustomEvent's data to
    ``on_custom(data)`` as the raw JSON value, before obsws-python turns it into an object.

    obsws-python builds a class from the event's keys (``as_dataclass``): keys such as
    ``__slots__`` or ``__qualname__`` make that raise in its listener thread, which then dies, and
    a key ``attrs`` shadows the method that lists the keys. A CustomEvent's data is whatever any
    websocket client broadcast, so vcam reads it itself. Other events (sent by OBS, with OBS's own
    keys) go through obsws-python as before. Register the other callbacks after this call."""
    from obsws_python.callback import Callback

    class RawCustomEvents(Callback):
        def trigger(self, event, data):
            if event == "CustomEvent":
                try:
                    on_custom(data)
                except Exception:  # the listener thread must live on
                    log.debug("a CustomEvent could not be handled", exc_info=True)
                return
            super().trigger(event, data)

    hooked = RawCustomEvents()
    hooked.register(client.callback._callbacks)
    client.callback = hooked  # the listener thread looks the attribute up for every event

    # obsws-python's listener thread parses each message with json.loads, whose RecursionError on a
    # deeply nested one (anyone may broadcast a CustomEvent) would end the thread: such a message is
    # emptied before it gets there (the listener skips an empty one) and reported to ``on_custom``
    # as a :class:`TooDeep`. The hook sits where websocket-client hands over a whole message,
    # looked up after the socket read, so a read already waiting when this runs is guarded too.
    def too_deep(message: Any) -> bool:
        if not message or not nests_deeper(message, MAX_EVENT_DEPTH):
            return False
        ours = (b'"vcam"' if isinstance(message, bytes) else '"vcam"') in message
        try:
            on_custom(TooDeep(bool(ours)))
        except Exception:
            log.debug("a too deep event could not be reported", exc_info=True)
        return True

    ws = client.base_client.ws
    frames = getattr(ws, "cont_frame", None)
    if frames is not None and hasattr(frames, "extract"):
        plain_extract = frames.extract

        def guarded_extract(frame):
            opcode, whole = plain_extract(frame)
            if too_deep(whole.data):
                whole.data = b""
            return opcode, whole

        frames.extract = guarded_extract
    else:  # another websocket-client: the next reads are guarded
        plain_recv = ws.recv
        ws.recv = lambda: "" if too_deep(message := plain_recv()) else message


def request_failed(exc: BaseException) -> bool:
    """True for an OBS-side 'no such thing' answer (the connection itself is fine)."""
    from obsws_python.error import OBSSDKRequestError

    return isinstance(exc, OBSSDKRequestError)


# --- scene setup -----------------------------------------------------------------------------


def _ensure_scene(client: Any, scene: str, report: Any, *, tries: int = 40) -> list:
    """The items of ``scene``, created first when it does not exist. A scene the user just removed
    can still be listed for a moment while OBS tears it down (reading it then fails; creating it
    fails while it is listed): look again until one of the two works."""
    for _ in range(tries):
        try:
            if scene not in scene_names(client):
                client.create_scene(scene)
                report.scene_created = True
            return list(client.get_scene_item_list(scene).scene_items)
        except Exception as exc:
            if not request_failed(exc):
                raise
            time.sleep(0.05)
    raise ControlError(f"OBS keeps refusing scene '{scene}'", hint="remove it in OBS, then run `vcam obs setup` again")


@dataclass
class SetupReport:
    """What :func:`setup_scene` did. Lists hold OBS source names."""

    scene: str
    scene_created: bool = False
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    hotkeys: list[tuple[str, str]] = field(default_factory=list)  # (hotkey name, what OBS shows)
    notes: list[str] = field(default_factory=list)
    map_scenes: dict[str, bool] = field(default_factory=dict)  # map scene -> created now
    map_hotkeys: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # map scene -> its hotkeys

    def lines(self) -> list[str]:
        out = [f"scene '{self.scene}'" + (" created" if self.scene_created else " already there")]
        out.extend(f"scene '{name}'" + (" created" if new else " already there") for name, new in self.map_scenes.items())
        for label, names in (("created", self.created), ("updated", self.updated), ("unchanged", self.kept)):
            if names:
                out.append(f"{label}: {', '.join(names)}")
        out.extend(self.notes)
        if self.hotkeys:
            out.append(f"Bind these in OBS: Settings -> Hotkeys, under the scene '{self.scene}':")
            out.extend(f"  {shown}" for _, shown in self.hotkeys)
        for name, keys in self.map_hotkeys.items():
            if keys:
                out.append(f"and, to choose one person's face, under the scene '{name}':")
                out.extend(f"  {shown}" for _, shown in keys)
        return out


def scene_names(client) -> list[str]:
    return [s["sceneName"] for s in client.get_scene_list().scenes]


def input_settings(client, name: str) -> dict | None:
    try:
        return client.get_input_settings(name).input_settings
    except Exception as exc:
        if request_failed(exc):
            return None
        raise


def _input_kind(client, name: str) -> str | None:
    for inp in client.get_input_list().inputs:
        if inp["inputName"] == name:
            return inp["inputKind"]
    return None


def _ensure_input(
    client, report: SetupReport, scene: str, name: str, kind: str, settings: dict, enabled: bool, *, update: dict | None = None
) -> None:
    """Create input ``name`` in ``scene`` or make sure the existing one is in it (never deletes)."""
    have_kind = _input_kind(client, name)
    if have_kind is None:
        client.create_input(scene, name, kind, settings, enabled)
        report.created.append(name)
        return
    changed = False
    if have_kind.split("_v")[0] != kind.split("_v")[0]:
        report.notes.append(f"'{name}' exists as a {have_kind} source, not {kind}; left as it is")
    elif update:
        current = input_settings(client, name) or {}
        if any(current.get(k) != v for k, v in update.items()):
            client.set_input_settings(name, update, True)
            changed = True
    try:
        client.get_scene_item_id(scene, name)
    except Exception as exc:
        if not request_failed(exc):
            raise
        client.create_scene_item(scene, name, enabled)
        changed = True
    (report.updated if changed else report.kept).append(name)


def setup_scene(client, faces: dict[str, str | os.PathLike], *, scene: str = "FastSwap Faces", **options: Any) -> SetupReport:
    """:func:`_setup_scene` (see there), again from the start should ``scene`` vanish under it: a
    scene the user just removed can still be listed and read while OBS tears it down, and go in the
    middle of the setup ("No source was found by the name of ..."). The setup is idempotent."""
    for attempt in range(3):
        try:
            return _setup_scene(client, faces, scene=scene, **options)
        except Exception as exc:
            if attempt == 2 or not request_failed(exc) or f"name of `{scene}`" not in str(exc):
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _setup_scene(
    client,
    faces: dict[str, str | os.PathLike],
    *,
    scene: str = "FastSwap Faces",
    status_source: str = "FastSwap Status",
    active: str | None = None,
    add_camera_source: bool = False,
    camera_name: str = CAMERA_SOURCE,
    camera_device: str | None = None,
    targets: dict[str, str | None] | None = None,
) -> SetupReport:
    """Create (idempotently) the control scene in OBS through a connected obsws-python ReqClient.

    ``faces``: face name -> image file shown by its ``Face: <name>`` image source. Existing sources
    are kept as they are, visibility included (their image file is updated); nothing is ever
    removed. New face sources are created hidden, except ``active`` (default: the first name) when
    the scene shows no face yet: re-running setup while vcam runs never shows a second face.
    ``add_camera_source`` adds a Video Capture Device source named ``camera_name`` for
    ``camera_device`` (``/dev/videoN``; left empty if None) to the current program scene.
    ``targets``: mapped person -> the face the config gives them (or None); each gets a map scene
    (see the module docstring), showing that face, or ``(default)``, when it shows nothing yet.
    """
    report = SetupReport(scene=scene)
    names = list(faces)
    shown = [
        it["sourceName"]
        for it in _ensure_scene(client, scene, report)
        if it["sourceName"].startswith(FACE_PREFIX) and it["sceneItemEnabled"]
    ]
    if shown:
        active = None  # a face is shown already (vcam's choice): leave it the only one
    elif active is None and names:
        active = names[0]
    for name in names:
        path = str(Path(faces[name]).expanduser().resolve())
        if not Path(path).is_file():
            report.notes.append(f"face '{name}': image {path} not found; the source shows nothing")
        src = face_source_name(name)
        _ensure_input(client, report, scene, src, "image_source", {"file": path}, name == active, update={"file": path})
        report.hotkeys.append((show_hotkey(src), f"Show '{src}'"))
    _ensure_input(client, report, scene, SWAP_SOURCE, TEXT_KIND, {"text": "face swap on"}, True)
    report.hotkeys.append((show_hotkey(SWAP_SOURCE), f"Show '{SWAP_SOURCE}' (swap on)"))
    report.hotkeys.append((f"libobs.hide_scene_item.{SWAP_SOURCE}", f"Hide '{SWAP_SOURCE}' (swap off)"))
    _ensure_input(client, report, scene, PAUSE_SOURCE, TEXT_KIND, {"text": "camera paused"}, False)
    report.hotkeys.append((show_hotkey(PAUSE_SOURCE), f"Show '{PAUSE_SOURCE}' (pause: the camera closes)"))
    report.hotkeys.append((f"libobs.hide_scene_item.{PAUSE_SOURCE}", f"Hide '{PAUSE_SOURCE}' (resume)"))
    if status_source:
        _ensure_input(client, report, scene, status_source, TEXT_KIND, {"text": "FastSwap Cam"}, True)
    known = {face_source_name(n) for n in names}
    for item in client.get_scene_item_list(scene).scene_items:
        src = item["sourceName"]
        if src.startswith(FACE_PREFIX) and src not in known:
            report.notes.append(f"'{src}' has no face in the face bank (remove it in OBS if it is not wanted)")
    for target, source in (targets or {}).items():
        _setup_map_scene(client, report, scene, target, source, faces)
    if add_camera_source:
        current = client.get_current_program_scene().current_program_scene_name
        settings = {"device_id": camera_device} if camera_device else {}
        _ensure_input(client, report, current, camera_name, "v4l2_input", settings, True, update=settings or None)
        if not camera_device:
            report.notes.append(
                f"'{camera_name}' has no device yet: start `vcam run`, then pick the device in the source's properties"
            )
    return report


def add_browser_source(client, report: SetupReport, url: str, width: int, height: int, name: str = BROWSER_SOURCE) -> bool:
    """Add (or point again) the Browser Source ``name`` showing the direct OBS source at ``url``,
    ``width`` x ``height`` px, to the current program scene; False, with a note saying so and how
    to add it by hand, when this OBS has no Browser Source."""
    kinds = client.get_input_kind_list(False).input_kinds
    if BROWSER_KIND not in kinds and _input_kind(client, name) is None:
        report.notes.append(f"{NO_BROWSER}: '{name}' not added. Once it has one: + -> Browser, URL {url}, {width}x{height}")
        return False
    # the page's own rate follows the frames it gets; OBS's default CSS leaves a transparent page
    where = {"url": url, "width": width, "height": height}
    current = client.get_current_program_scene().current_program_scene_name
    _ensure_input(client, report, current, name, BROWSER_KIND, {**where, "reroute_audio": False}, True, update=where)
    return True


def _setup_map_scene(
    client, report: SetupReport, scene: str, target: str, source: str | None, faces: dict[str, str | os.PathLike]
) -> None:
    """The scene of one mapped person: a ``Face for <target>: <face>`` image source per face and a
    ``(default)`` one; ``source`` (else ``(default)``) is shown if the scene shows no choice yet."""
    name = map_scene_name(scene, target)
    created = name not in scene_names(client)
    if created:
        client.create_scene(name)
    report.map_scenes[name] = created
    shown = [
        it["sourceName"]
        for it in client.get_scene_item_list(name).scene_items
        if map_choice(target, it["sourceName"]) is not None and it["sceneItemEnabled"]
    ]
    initial = None if shown else (source if source in faces else DEFAULT_CHOICE)
    keys = report.map_hotkeys.setdefault(name, [])
    for face in faces:
        path = str(Path(faces[face]).expanduser().resolve())
        src = map_source_name(target, face)
        _ensure_input(client, report, name, src, "image_source", {"file": path}, face == initial, update={"file": path})
        keys.append((show_hotkey(src), f"Show '{src}'"))
    src = map_source_name(target, DEFAULT_CHOICE)
    text = f"{target}: the default face"
    _ensure_input(client, report, name, src, TEXT_KIND, {"text": text}, initial == DEFAULT_CHOICE)
    keys.append((show_hotkey(src), f"Show '{src}' (no face of their own)"))


# --- vcam check ------------------------------------------------------------------------------


def obs_check(cfg: Config | ObsConfig, *, timeout: float = 2.0) -> tuple[bool, str]:
    """For ``vcam check``: is OBS reachable and is the control scene there? Returns (ok, message)."""
    ocfg = cfg.obs if isinstance(cfg, Config) else cfg
    try:
        client = connect(ocfg, timeout=timeout)
    except ObsAuthError as exc:
        return False, str(exc)
    except ControlError as exc:
        if not ocfg.enabled:
            return True, "not configured"
        return False, str(exc)
    try:
        version = client.get_version()
        scenes = scene_names(client)
        where = f"OBS {version.obs_version} (websocket {version.obs_web_socket_version}) at {ocfg.host}:{ocfg.port}"
        note = "" if ocfg.enabled else "; [obs] enabled = false, so `vcam run` will not connect"
        if ocfg.scene not in scenes:
            return False, f"{where}: scene '{ocfg.scene}' is missing; run `vcam obs setup`{note}"
        items = client.get_scene_item_list(ocfg.scene).scene_items
        faces = [i["sourceName"][len(FACE_PREFIX) :] for i in items if i["sourceName"].startswith(FACE_PREFIX)]
        if not faces:
            return False, f"{where}: scene '{ocfg.scene}' has no 'Face: ...' sources; run `vcam obs setup`{note}"
        targets = [t for n in scenes if (t := map_target(ocfg.scene, n)) is not None]
        maps = f"; map scenes for {', '.join(targets)}" if targets else ""
        return ocfg.enabled, f"{where}: scene '{ocfg.scene}' with faces {', '.join(faces)}{maps}{note}"
    except Exception as exc:  # the connection dropped half-way
        return False, f"OBS at {ocfg.host}:{ocfg.port} stopped answering ({type(exc).__name__})"
    finally:
        try:
            client.disconnect()
        except Exception:
            pass


# --- the controller --------------------------------------------------------------------------
