"""OBS control against a real OBS Studio (obs-websocket 5) under Xvfb.

One OBS instance is shared by the module; the kill/restart test starts its own. A small frame loop
(``Frames``) reads the runtime state the way the daemon does, so "video keeps running" is checked by
its frame counter; the daemon end-to-end test drives the real ``Daemon`` on the demo clip.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import require
from obs_harness import (
    CapturingOutput,
    ObsInstance,
    colour_pixels,
    demo_daemon_config,
    free_port,
    missing_programs,
    solid_faces,
    with_map_targets,
)

import vcam
from vcam.cli.control import obs_app
from vcam.config import ObsConfig
from vcam.control.obs import ObsController
from vcam.control.obs_scene import (
    DEFAULT_CHOICE,
    FACE_PREFIX,
    PAUSE_SOURCE,
    SWAP_SOURCE,
    connect,
    face_source_name,
    hook_custom_events,
    map_choice,
    map_scene_name,
    map_source_name,
    obs_check,
    setup_scene,
    show_hotkey,
)
from vcam.state import RuntimeState, Status
from vcam.types import SourceFace

pytestmark = pytest.mark.obs

SCENE = "FastSwap Faces"
FACES = ("alice", "bob", "carol")
COLOURS = {"alice": (0, 0, 255), "bob": (255, 0, 0), "carol": (0, 255, 0)}


def _need_obs():
    missing = missing_programs()
    if missing:
        require("obs", f"{', '.join(missing)} not installed (apt-get install obs-studio xvfb libgl1-mesa-dri)")


@pytest.fixture(scope="module")
def obs_server(tmp_path_factory):
    _need_obs()
    inst = ObsInstance(tmp_path_factory.mktemp("obs"))
    inst.start()
    yield inst
    inst.close()


@pytest.fixture(scope="module")
def face_images(tmp_path_factory):
    import cv2

    d = tmp_path_factory.mktemp("faces")
    out = {}
    for name in FACES:
        img = np.empty((64, 64, 3), np.uint8)
        img[...] = COLOURS[name]
        out[name] = d / f"{name}.png"
        cv2.imwrite(str(out[name]), img)
    return out


def obs_cfg(inst: ObsInstance, **kw) -> ObsConfig:
    base = dict(enabled=True, host="127.0.0.1", port=inst.port, password=inst.password, scene=SCENE, password_env="")
    base.update(kw)
    return ObsConfig(**base)


@pytest.fixture(scope="module")
def scene(obs_server, face_images):
    client = connect(obs_cfg(obs_server))
    try:
        report = setup_scene(client, face_images, scene=SCENE)
    finally:
        client.disconnect()
    return report


@pytest.fixture
def client(obs_server):
    c = connect(obs_cfg(obs_server))
    yield c
    c.disconnect()


def make_state(active: str = "alice") -> RuntimeState:
    faces = {}
    for n in FACES:
        img = np.empty((128, 128, 3), np.uint8)
        img[...] = COLOURS[n]
        faces[n] = SourceFace(name=n, image=img)
    return RuntimeState(faces, active=active)


class Frames:
    """A stand-in frame loop: reads one snapshot per 'frame' like the daemon and counts frames."""

    def __init__(self, state: RuntimeState) -> None:
        self.state = state
        self.count = 0
        self.last_face: str | None = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="test-frames", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            snap = self.state.snapshot()
            self.last_face = snap.face.name if snap.face else None
            self.count += 1
            if self.count % 10 == 0:
                self.state.publish_status(Status(fps_out=25.0, latency_p50_ms=12.0, frames_out=self.count))
            time.sleep(0.01)

    def __enter__(self) -> Frames:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()

    def advancing(self, seconds: float = 0.3) -> bool:
        n = self.count
        time.sleep(seconds)
        return self.count > n


def wait_for(pred, timeout: float = 5.0, step: float = 0.01) -> float | None:
    """Seconds until ``pred()`` held, or None on timeout. A timeout of a second or more is an
    "eventually" (a round trip through OBS), not a latency claim: it gets 4x slack, so a busy 2-core
    machine (OBS, Xvfb and the suite beside other work) does not fail it; sub-second timeouts are
    the claims and stay as written."""
    if timeout >= 1.0:
        timeout *= 4
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if pred():
            return time.perf_counter() - t0
        time.sleep(step)
    return None


def visible(client, scene: str = SCENE) -> dict[str, bool]:
    return {i["sourceName"]: bool(i["sceneItemEnabled"]) for i in client.get_scene_item_list(scene).scene_items}


def visible_faces(client) -> list[str]:
    return sorted(n[len(FACE_PREFIX) :] for n, on in visible(client).items() if n.startswith(FACE_PREFIX) and on)


def visible_faces_in(client, scene: str) -> list[str]:
    shown = visible(client, scene)
    return sorted(n[len(FACE_PREFIX) :] for n, on in shown.items() if n.startswith(FACE_PREFIX) and on)


class EventRecorder:
    """A second websocket client that records CustomEvents (to read the controller's replies)."""

    def __init__(self, cfg: ObsConfig) -> None:
        self.events: list[dict] = []

        self.client = connect(cfg, events=True)
        # Raw dicts: the recorder must survive the hostile events some tests broadcast.
        hook_custom_events(self.client, lambda data: self.events.append(data) if isinstance(data, dict) else None)

    def replies(self) -> list[dict]:
        return [e["vcam_reply"] for e in self.events if "vcam_reply" in e]

    def close(self) -> None:
        self.client.disconnect()


@pytest.fixture
def controller(obs_server, scene):
    state = make_state()
    ctl = ObsController(obs_cfg(obs_server), state, retry_min=0.2, retry_max=1.0)
    ctl.start()
    assert ctl.connected.wait(10), ctl.last_error
    yield ctl, state
    ctl.stop()


# --- setup -----------------------------------------------------------------------------------


def test_setup_scene_creates_sources_and_is_idempotent(obs_server, scene, client, face_images):
    assert scene.scene == SCENE
    shown = visible(client)
    for name in FACES:
        assert face_source_name(name) in shown
    assert SWAP_SOURCE in shown and "FastSwap Status" in shown
    assert visible_faces(client) == ["alice"]  # only the first face is shown
    settings = client.get_input_settings("Face: bob").input_settings
    assert settings["file"] == str(face_images["bob"].resolve())
    hotkeys = set(client.get_hot_key_list().hotkeys)
    for hk, label in scene.hotkeys[: len(FACES)]:
        assert hk in hotkeys
        assert label.startswith("Show 'Face: ")
    again = setup_scene(client, face_images, scene=SCENE)
    assert not again.scene_created and again.created == [] and again.updated == []
    assert sorted(again.kept) == sorted([face_source_name(n) for n in FACES] + [SWAP_SOURCE, PAUSE_SOURCE, "FastSwap Status"])
    assert len(client.get_scene_item_list(SCENE).scene_items) == len(shown)
    text = "\n".join(again.lines())
    assert "Show 'Face: alice'" in text and "Settings -> Hotkeys" in text


def test_setup_adds_a_camera_source_to_the_current_scene(client, scene):
    current = client.get_current_program_scene().current_program_scene_name
    report = setup_scene(
        client, {}, scene=SCENE, add_camera_source=True, camera_name="FastSwap Cam", camera_device="/dev/video42"
    )
    assert "FastSwap Cam" in report.created
    assert "FastSwap Cam" in visible(client, current)
    assert client.get_input_settings("FastSwap Cam").input_settings["device_id"] == "/dev/video42"
    again = setup_scene(client, {}, scene=SCENE, add_camera_source=True, camera_name="FastSwap Cam", camera_device="/dev/video42")
    assert "FastSwap Cam" in again.kept


def test_obs_check(obs_server, scene):
    ok, msg = obs_check(obs_cfg(obs_server))
    assert ok, msg
    assert f"scene '{SCENE}' with faces alice, bob, carol" in msg
    ok, msg = obs_check(obs_cfg(obs_server, scene="No Such Scene"))
    assert not ok and "scene 'No Such Scene' is missing; run `vcam obs setup`" in msg
    ok, msg = obs_check(obs_cfg(obs_server, password="wrong"))
    assert not ok and "rejected the websocket password" in msg
    closed = free_port()
    assert obs_check(obs_cfg(obs_server, enabled=False, port=closed)) == (True, "not configured")
    ok, msg = obs_check(obs_cfg(obs_server, port=closed))
    assert not ok and f"OBS is not reachable at 127.0.0.1:{closed}" in msg


# --- switching -------------------------------------------------------------------------------


def test_hotkeys_switch_faces_radio_style(controller, client):
    ctl, state = controller
    assert wait_for(lambda: visible_faces(client) == ["alice"], 3) is not None
    with Frames(state) as frames:
        for name in ("bob", "carol", "alice", "bob"):
            client.trigger_hot_key_by_name(show_hotkey(face_source_name(name)))
            took = wait_for(lambda: state.active == name, 0.5)
            assert took is not None, f"hotkey for {name} not applied within 500 ms"
            assert wait_for(lambda: frames.last_face == name, 1) is not None
            assert wait_for(lambda: visible_faces(client) == [name], 2) is not None, visible(client)
        assert frames.advancing()


def test_swap_source_visibility_is_the_switch(controller, client):
    ctl, state = controller
    item = client.get_scene_item_id(SCENE, SWAP_SOURCE).scene_item_id
    client.set_scene_item_enabled(SCENE, item, False)  # the eye icon
    assert wait_for(lambda: state.swap_enabled is False, 2) is not None
    client.trigger_hot_key_by_name(show_hotkey(SWAP_SOURCE))
    assert wait_for(lambda: state.swap_enabled is True, 2) is not None


def test_pause_source_hotkeys_and_custom_events_pause_and_resume(controller, client, obs_server):
    """``FastSwap: Pause`` (made hidden by setup): shown = paused, hidden = running, by its hotkeys,
    its eye icon or the custom event ``{"vcam": {"pause": ...}}``; vcam's own pause (`vcam ctl
    pause`) shows on it; the status text says PAUSED at once; every reply carries ``paused``."""
    ctl, state = controller
    hotkeys = set(client.get_hot_key_list().hotkeys)
    assert show_hotkey(PAUSE_SOURCE) in hotkeys and f"libobs.hide_scene_item.{PAUSE_SOURCE}" in hotkeys
    assert wait_for(lambda: visible(client)[PAUSE_SOURCE] is False, 2) is not None
    rec = EventRecorder(obs_cfg(obs_server))

    def status_text():
        return client.get_input_settings("FastSwap Status").input_settings.get("text", "")

    try:
        with Frames(state) as frames:
            client.broadcast_custom_event({"eventData": {"vcam": {"pause": True}}})
            assert wait_for(lambda: state.paused, 2) is not None
            assert wait_for(lambda: visible(client)[PAUSE_SOURCE] is True, 2) is not None
            assert wait_for(lambda: any(r.get("paused") is True for r in rec.replies()), 2) is not None
            assert wait_for(lambda: "PAUSED (camera closed)" in status_text(), 3) is not None, status_text()
            item = client.get_scene_item_id(SCENE, PAUSE_SOURCE).scene_item_id
            client.set_scene_item_enabled(SCENE, item, False)  # the eye icon: resume
            assert wait_for(lambda: state.paused is False, 2) is not None
            assert wait_for(lambda: "PAUSED" not in status_text(), 3) is not None, status_text()
            client.trigger_hot_key_by_name(show_hotkey(PAUSE_SOURCE))  # the hotkey: pause
            assert wait_for(lambda: state.paused is True, 2) is not None
            client.broadcast_custom_event({"eventData": {"vcam": {"pause": "toggle"}}})
            assert wait_for(lambda: state.paused is False, 2) is not None
            assert wait_for(lambda: visible(client)[PAUSE_SOURCE] is False, 2) is not None
            state.set_paused(True)  # what `vcam ctl pause` does
            assert wait_for(lambda: visible(client)[PAUSE_SOURCE] is True, 2) is not None
            state.set_paused(False)
            assert wait_for(lambda: visible(client)[PAUSE_SOURCE] is False, 2) is not None
            client.broadcast_custom_event({"eventData": {"vcam": {"pause": 1}}})  # not a boolean: refused
            refused = wait_for(
                lambda: any("'pause' must be true, false or toggle" in r.get("error", "") for r in rec.replies()), 2
            )
            assert refused is not None
            assert state.paused is False and ctl.connected.is_set() and frames.advancing()
    finally:
        rec.close()


def test_custom_events_switch_face_and_toggle_swap(controller, client, obs_server):
    ctl, state = controller
    rec = EventRecorder(obs_cfg(obs_server))
    try:
        with Frames(state) as frames:
            client.broadcast_custom_event({"eventData": {"vcam": {"face": "carol"}}})
            assert wait_for(lambda: state.active == "carol", 2) is not None
            assert wait_for(lambda: visible_faces(client) == ["carol"], 2) is not None
            client.broadcast_custom_event({"eventData": {"vcam": {"swap": "toggle"}}})
            assert wait_for(lambda: state.swap_enabled is False, 2) is not None
            assert wait_for(lambda: visible(client)[SWAP_SOURCE] is False, 2) is not None
            client.broadcast_custom_event({"eventData": {"vcam": {"face": "next", "swap": "toggle"}}})
            assert wait_for(lambda: state.active == "alice" and state.swap_enabled, 2) is not None
            # An unknown face: reported back, nothing else changes, the controller keeps going.
            client.broadcast_custom_event({"eventData": {"vcam": {"face": "nobody"}}})
            assert wait_for(lambda: any(not r["ok"] for r in rec.replies()), 2) is not None
            bad = [r for r in rec.replies() if not r["ok"]][0]
            assert "unknown face 'nobody'" in bad["error"] and bad["face"] == "alice"
            assert state.active == "alice"
            assert frames.advancing()
            assert ctl.connected.is_set()
            client.broadcast_custom_event({"eventData": {"vcam": {"face": "prev"}}})
            assert wait_for(lambda: state.active == "carol", 2) is not None
            client.broadcast_custom_event({"eventData": {"other_tool": {"x": 1}}})  # not ours: ignored
            # A stream name sent to a one-stream vcam: answered with the error, nothing changes.
            client.broadcast_custom_event({"eventData": {"vcam": {"stream": "side", "face": "alice"}}})
            assert wait_for(lambda: any("no stream 'side'" in r.get("error", "") for r in rec.replies()), 2) is not None
            assert state.active == "carol"
        oks = [r for r in rec.replies() if r["ok"]]
        assert oks[0] == {"ok": True, "face": "carol", "swap": "on", "paused": False, "mappings": {}}
    finally:
        rec.close()


def test_unknown_face_source_is_hidden_again(controller, client):
    """A 'Face: X' source for a face the daemon has not loaded: warning, the active face stays."""
    ctl, state = controller
    client.create_input(SCENE, "Face: stranger", "image_source", {}, False)
    try:
        client.trigger_hot_key_by_name(show_hotkey("Face: stranger"))
        assert wait_for(lambda: visible_faces(client) == [state.active], 2) is not None
        assert state.active == "alice"
        assert ctl.connected.is_set()
    finally:
        client.remove_input("Face: stranger")


def test_state_changes_from_elsewhere_show_in_obs(controller, client):
    ctl, state = controller
    state.set_face("bob")  # what `vcam ctl face bob` does
    assert wait_for(lambda: visible_faces(client) == ["bob"], 2) is not None
    state.set_swap("off")
    assert wait_for(lambda: visible(client)[SWAP_SOURCE] is False, 2) is not None
    state.set_swap("on")
    assert wait_for(lambda: visible(client)[SWAP_SOURCE] is True, 2) is not None


def test_status_text_source(controller, client):
    ctl, state = controller
    state.publish_status(Status(fps_out=29.5, latency_p50_ms=41.0))
    state.set_face("carol")

    def text():
        return client.get_input_settings("FastSwap Status").input_settings.get("text", "")

    # The time of the update is part of the text: a frozen time means vcam is gone.
    assert (
        wait_for(lambda: re.fullmatch(r"face: carol  swap: on  29\.5 fps  41 ms  \(at \d\d:\d\d:\d\d\)", text()), 3) is not None
    ), text()
    first = text()
    assert wait_for(lambda: text() != first, 3) is not None  # the time moves on while vcam runs
    ctl.stop()  # a clean exit says so
    assert re.fullmatch(r"vcam stopped \(at \d\d:\d\d:\d\d\)", text()), text()


# --- failures --------------------------------------------------------------------------------


@pytest.mark.slow
def test_wrong_password_one_clear_error_video_keeps_running(obs_server, scene, caplog):
    caplog.set_level(logging.DEBUG)
    state = make_state()
    bad = "not-the-password-" + obs_server.password[:4]
    ctl = ObsController(obs_cfg(obs_server, password=bad), state, auth_retry=0.2)
    with Frames(state) as frames:
        ctl.start()
        time.sleep(1.0)  # several attempts
        assert frames.advancing()
        ctl.stop()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert f"OBS at 127.0.0.1:{obs_server.port} rejected the websocket password" in errors[0].getMessage()
    assert "Tools -> WebSocket Server Settings" in errors[0].getMessage()
    assert not ctl.connected.is_set() and ctl.connections == 0
    assert bad not in caplog.text


def test_password_never_logged(obs_server, scene, caplog, capsys, monkeypatch):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("VCAM_TEST_OBS_PW", obs_server.password)
    cfg = obs_cfg(obs_server, password="", password_env="VCAM_TEST_OBS_PW")
    state = make_state()
    ctl = ObsController(cfg, state)
    ctl.start()
    assert ctl.connected.wait(10)
    c = connect(cfg)
    c.trigger_hot_key_by_name(show_hotkey("Face: bob"))
    assert wait_for(lambda: state.active == "bob", 2) is not None
    c.disconnect()
    ctl.stop()
    assert obs_check(cfg)[0]
    assert logging.getLogger("obsws_python").getEffectiveLevel() >= logging.WARNING
    out = capsys.readouterr()
    assert any(r.name.startswith("vcam") for r in caplog.records)  # something was logged at all
    for text in (caplog.text, out.out, out.err, *(str(r.args) for r in caplog.records)):
        assert obs_server.password not in text


@pytest.mark.slow
def test_obs_killed_and_restarted(tmp_path, face_images, caplog, monkeypatch):
    _need_obs()
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="vcam.control.obs")  # a failure shows why a connection ended
    hook_calls = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hook_calls.append(args))
    inst = ObsInstance(tmp_path)
    inst.start()
    try:
        cfg = obs_cfg(inst)
        c = connect(cfg)
        report = setup_scene(c, face_images, scene=SCENE)
        c.disconnect()
        # The crash comes after OBS saved the scene (else the restart finds only what it saved by
        # then: one face of three, three times in one day's busy suites).
        assert inst.wait_saved([n for n in report.created if n.startswith(FACE_PREFIX)], 20), report.created
        state = make_state()
        ctl = ObsController(cfg, state, retry_min=0.2, retry_max=1.0)
        with Frames(state) as frames:
            ctl.start()
            assert ctl.connected.wait(10)
            inst.kill()
            assert wait_for(lambda: not ctl.connected.is_set(), 5) is not None
            assert frames.advancing(0.5)
            n = frames.count
            state.set_face("carol")  # control still works locally while OBS is gone
            assert wait_for(lambda: frames.last_face == "carol", 1) is not None
            inst.start()
            assert wait_for(lambda: ctl.connected.is_set(), 15) is not None, ctl.last_error
            assert ctl.connections == 2
            c = connect(cfg)
            try:
                # State mirrored after reconnect. A fresh OBS under load can drop the first connection
                # again (seen once in CI, and once in a local suite run: there the reconnect after the
                # drop came only at the end of 15 s, each request of a just-started OBS answered slowly
                # on 2 busy cores); the controller then reconnects by itself: give it the time.
                assert wait_for(lambda: visible_faces(c) == ["carol"], 30) is not None, (
                    ctl.last_error,
                    ctl.connections,
                    state.active,
                    visible(c),  # what OBS shows instead
                    f"OBS running: {inst.running}",  # a restarted OBS that went away (seen once): why
                    inst.log_path.read_text(errors="replace")[-3000:] if inst.log_path.exists() else "no OBS log",
                )
                c.trigger_hot_key_by_name(show_hotkey("Face: bob"))
                assert wait_for(lambda: state.active == "bob", 2) is not None
                assert wait_for(lambda: visible_faces(c) == ["bob"], 2) is not None
            finally:
                c.disconnect()
            assert frames.count > n
            ctl.stop()
        assert hook_calls == []
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        msgs = [r.getMessage() for r in caplog.records if r.name.startswith("vcam")]
        assert "lost the connection to OBS; reconnecting in the background" in msgs
    finally:
        inst.close()


# --- end to end: the daemon on the demo clip, driven from OBS ----------------------------------


@pytest.mark.slow
def test_daemon_follows_obs_hotkeys_and_custom_events(obs_server, scene, client, tmp_path):
    from vcam.runtime.daemon import Daemon

    for it in client.get_scene_item_list(SCENE).scene_items:  # anything but "only bob visible"
        if it["sourceName"].startswith(FACE_PREFIX):
            client.set_scene_item_enabled(SCENE, it["sceneItemId"], it["sourceName"] != "Face: bob")
    state = RuntimeState(solid_faces(("alice", "bob")), active="bob")
    out = CapturingOutput()
    daemon = Daemon(demo_daemon_config(tmp_path / "vcam.sock", obs=obs_cfg(obs_server)), state=state, output=out)
    daemon.start()
    try:
        assert daemon.ready.wait(60) and daemon.summary.error is None, daemon.summary.error
        # Connected once OBS mirrors the daemon's state (bob) onto the face sources.
        assert wait_for(lambda: visible_faces(client) == ["bob"], 10) is not None, visible(client)
        for name, other in (("alice", "bob"), ("bob", "alice")):
            client.trigger_hot_key_by_name(show_hotkey(face_source_name(name)))
            assert wait_for(lambda: state.active == name, 0.5) is not None, f"{name}: not active within 500 ms"
            assert wait_for(lambda: visible_faces(client) == [name], 2) is not None
            n = out.frames
            assert wait_for(lambda: out.frames > n + 2 and colour_pixels(out.last, name) > 200, 10) is not None
            assert colour_pixels(out.last, other) < 20
        client.broadcast_custom_event({"eventData": {"vcam": {"swap": "off"}}})
        n = out.frames
        assert wait_for(lambda: out.frames > n + 2 and colour_pixels(out.last, "bob") < 20, 10) is not None
        client.broadcast_custom_event({"eventData": {"vcam": {"face": "nobody", "swap": "on"}}})
        n = out.frames
        assert wait_for(lambda: out.frames > n + 5, 10) is not None  # still publishing
        assert state.active == "bob"
        assert daemon.summary.error is None
    finally:
        daemon.stop()
    assert out.closed


def test_cli_obs_setup_and_status(obs_server, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.detections import DetectParams
    from vcam.stages.faces import FaceBank

    faces_dir = tmp_path / "faces"
    bank = FaceBank(faces_dir)
    det = RetinaFaceDetector(DetectParams(score=0.5))
    for photo in ("astronaut.jpg", "grace_hopper.jpg"):
        bank.add(Path(vcam.__file__).parent / "assets" / photo, detector=det)
    names = bank.names()
    monkeypatch.setenv("VCAM_OBS_PASSWORD", obs_server.password)
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(f"[obs]\nenabled = true\nport = {obs_server.port}\nscene = 'CLI Faces'\n[faces]\ndir = '{faces_dir}'\n")
    runner = CliRunner()
    res = runner.invoke(obs_app, ["status", "--config", str(cfg_file)])
    assert res.exit_code == 8 and "scene 'CLI Faces' is missing; run `vcam obs setup`" in res.output
    closed = tmp_path / "closed.toml"
    closed.write_text(f"[obs]\nenabled = true\nport = {free_port()}\n")
    res = runner.invoke(obs_app, ["status", "--config", str(closed)])  # hints keep their [table] names
    assert res.exit_code == 8 and "or fix [obs] host/port" in res.output, res.output
    (faces_dir / "broken").mkdir()
    (faces_dir / "broken" / "meta.json").write_text('{"name": "broken"}')  # one damaged face: the rest still set up
    res = runner.invoke(obs_app, ["setup", "--config", str(cfg_file)])
    assert res.exit_code == 0, res.output
    assert "scene 'CLI Faces' created" in res.output
    assert "Docks -> Custom Browser Docks..." in res.output  # the panel's dock: steps (no daemon runs: no URL yet)
    assert "note: face 'broken' is damaged" in res.output and "vcam faces remove broken" in res.output
    for n in names:
        assert f"Show 'Face: {n}'" in res.output
    res = runner.invoke(obs_app, ["setup", "--config", str(cfg_file)])
    assert res.exit_code == 0 and "scene 'CLI Faces' already there" in res.output
    res = runner.invoke(obs_app, ["status", "--config", str(cfg_file)])
    assert res.exit_code == 0, res.output
    assert f"with faces {', '.join(names)}" in res.output.replace("\n", " ")
    assert obs_server.password not in res.output
    monkeypatch.setenv("VCAM_OBS_PASSWORD", "wrong")
    res = runner.invoke(obs_app, ["setup", "--config", str(cfg_file)])
    assert res.exit_code == 8 and "rejected the websocket password" in res.output


# --- staying in sync (issue 13) ------------------------------------------------------------------


def _solid_loader(name: str) -> SourceFace:
    """A state loader: any name is a face (as the bank would load a face added while running)."""
    img = np.empty((128, 128, 3), np.uint8)
    img[...] = (90, 90, 90)
    return SourceFace(name=name, image=img)


def _shown(client, scene: str) -> tuple[list[str], bool | None]:
    items = visible(client, scene)
    faces = sorted(n[len(FACE_PREFIX) :] for n, on in items.items() if n.startswith(FACE_PREFIX) and on)
    return faces, items.get(SWAP_SOURCE)


def test_setup_rerun_and_a_recreated_scene_keep_obs_and_vcam_agreed(obs_server, client, face_images):
    scene = "Sync Faces"
    setup_scene(client, {n: face_images[n] for n in ("alice", "bob")}, scene=scene)
    state = make_state("bob")
    state.set_loader(_solid_loader)
    ctl = ObsController(obs_cfg(obs_server, scene=scene), state, retry_min=0.2, retry_max=1.0)
    ctl.start()
    try:
        assert ctl.connected.wait(10), ctl.last_error
        assert wait_for(lambda: _shown(client, scene) == (["bob"], True), 3) is not None, _shown(client, scene)
        # `vcam obs setup` again after adding faces, one sorting first: no second face appears.
        more = dict(face_images, aaron=face_images["alice"])
        report = setup_scene(client, more, scene=scene)
        assert "Face: aaron" in report.created
        assert _shown(client, scene) == (["bob"], True)
        client.trigger_hot_key_by_name(show_hotkey("Face: aaron"))  # the new face's hotkey works at once
        assert wait_for(lambda: state.active == "aaron", 2) is not None
        assert wait_for(lambda: _shown(client, scene) == (["aaron"], True), 2) is not None
        state.set_swap("off")
        assert wait_for(lambda: _shown(client, scene) == (["aaron"], False), 2) is not None
        # The scene deleted and made again by setup (which shows its first face, swap on): vcam's
        # state is put back on it.
        client.remove_scene(scene)
        setup_scene(client, more, scene=scene)
        assert wait_for(lambda: _shown(client, scene) == (["aaron"], False), 3) is not None, _shown(client, scene)
        assert state.active == "aaron" and state.swap_enabled is False
        # Two faces shown behind vcam's back (no event reaches it for an item it does not know):
        # the periodic check heals it.
        for it in client.get_scene_item_list(scene).scene_items:
            if it["sourceName"] in ("Face: alice", "Face: carol"):
                client.set_scene_item_enabled(scene, it["sceneItemId"], True)
        # (Their events may reach it too and switch the face meanwhile: wait for the end state.)
        assert wait_for(lambda: _shown(client, scene)[0] == [state.active], 5) is not None, _shown(client, scene)
        assert ctl.connections == 1
    finally:
        ctl.stop()
        client.remove_scene(scene)


def _drop(ctl: ObsController) -> None:
    """Cut the controller's event connection, as a network drop would (it reconnects itself)."""
    ctl._ev.base_client.ws.close()
    assert wait_for(lambda: not ctl.connected.is_set(), 5) is not None


@contextlib.contextmanager
def _away(ctl: ObsController):
    """Once both sides agree (the controller's last sync finished: a drop in the middle of the first
    one leaves no common state to merge from, and vcam's then wins), cut the connection and hold the
    reconnect until the block is done, so what the block changes happens while vcam is away however
    slow the machine."""
    st = ctl.state
    agreed = wait_for(lambda: ctl.mirror.synced == (st.active, st.swap_enabled, st.mappings), 5)
    assert agreed is not None, (ctl.mirror.synced, st.active, st.swap_enabled, st.mappings)
    gate = threading.Event()
    connect = ctl._connect

    def held() -> None:
        gate.wait(30)
        connect()

    ctl._connect = held
    try:
        _drop(ctl)
        yield
    finally:
        gate.set()
        del ctl._connect


def _set_shown(client, scene: str, face: str | None = None, swap: bool | None = None) -> None:
    for it in client.get_scene_item_list(scene).scene_items:
        n = it["sourceName"]
        if face is not None and n.startswith(FACE_PREFIX):
            client.set_scene_item_enabled(scene, it["sceneItemId"], n == face_source_name(face))
        elif swap is not None and n == SWAP_SOURCE:
            client.set_scene_item_enabled(scene, it["sceneItemId"], swap)


@pytest.mark.slow
def test_changes_made_while_disconnected_are_merged_on_reconnect(obs_server, client, face_images):
    """Changed in OBS only: adopted. Changed in vcam only: shown in OBS. Changed on both sides: vcam wins."""
    scene = "Merge Faces"
    setup_scene(client, face_images, scene=scene)
    state = make_state("alice")
    ctl = ObsController(obs_cfg(obs_server, scene=scene), state, retry_min=1.5, retry_max=1.5)
    ctl.start()
    try:
        assert ctl.connected.wait(10), ctl.last_error
        assert wait_for(lambda: _shown(client, scene) == (["alice"], True), 3) is not None
        with _away(ctl):
            _set_shown(client, scene, face="carol", swap=False)  # the user, in OBS, while vcam is away
        assert ctl.connected.wait(10)
        assert wait_for(lambda: state.active == "carol" and state.swap_enabled is False, 3) is not None
        assert wait_for(lambda: _shown(client, scene) == (["carol"], False), 3) is not None
        with _away(ctl):
            state.set_face("bob")  # `vcam ctl face bob` while OBS is away
        assert ctl.connected.wait(10)
        assert wait_for(lambda: _shown(client, scene) == (["bob"], False), 3) is not None
        assert state.active == "bob"
        with _away(ctl):
            _set_shown(client, scene, face="alice")
            state.set_face("carol")
        assert ctl.connected.wait(10)
        assert wait_for(lambda: _shown(client, scene) == (["carol"], False), 3) is not None
        assert state.active == "carol"
    finally:
        ctl.stop()
        client.remove_scene(scene)


def test_a_damaged_face_from_obs_is_answered_and_the_connection_stays(controller, client, obs_server, tmp_path):
    from vcam.stages.faces import FaceBank

    ctl, state = controller
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text('{"name": "broken"}')
    state.set_loader(FaceBank(tmp_path).load)
    rec = EventRecorder(obs_cfg(obs_server))
    try:
        client.broadcast_custom_event({"eventData": {"vcam": {"face": "broken"}}})
        assert wait_for(lambda: any(not r["ok"] for r in rec.replies()), 3) is not None
        bad = [r for r in rec.replies() if not r["ok"]][0]
        assert "face 'broken' is damaged" in bad["error"] and "vcam faces remove broken" in bad["error"]
        client.broadcast_custom_event({"eventData": {"vcam": {"face": "bob"}}})
        assert wait_for(lambda: state.active == "bob", 2) is not None
        assert ctl.connected.is_set() and ctl.connections == 1
    finally:
        rec.close()


def test_hostile_custom_events_are_answered_and_the_listener_survives(controller, client, obs_server, caplog):
    """Keys that obsws-python would turn into class attributes (its listener thread died on the
    first three; ``attrs`` hid the key list): each is answered with an error, and the same
    connection then still follows a good event. A 2 MB face name makes no 2 MB log line."""
    import logging

    caplog.set_level(logging.DEBUG, logger="vcam")
    ctl, state = controller
    listener = ctl._ev.worker
    rec = EventRecorder(obs_cfg(obs_server))
    try:
        client.broadcast_custom_event({"eventData": {"__slots__": 1, "other_tool": 1}})  # not ours: ignored
        for n, key in enumerate(("__slots__", "__qualname__", "__annotations__", "attrs"), 1):
            client.broadcast_custom_event({"eventData": {"vcam": {"face": "bob"}, key: 1}})
            assert wait_for(lambda n=n: len(rec.replies()) >= n, 3) is not None, f"no reply to a {key} event"
            reply = rec.replies()[-1]
            assert reply["ok"] is False and repr(key) in reply["error"], reply
            assert state.active == "alice"
        debug = [r for r in caplog.records if "ignored OBS custom event" in r.getMessage()]
        assert len(debug) == 4 and all(r.levelno == logging.DEBUG for r in debug)
        huge = "x" * 2_000_000
        client.broadcast_custom_event({"eventData": {"vcam": {"face": huge}}})
        assert wait_for(lambda: len(rec.replies()) >= 5, 5) is not None
        assert "unknown face" in rec.replies()[-1]["error"] and len(rec.replies()[-1]["error"]) < 1000
        client.broadcast_custom_event({"eventData": {"vcam": {"face": "carol"}}})
        assert wait_for(lambda: state.active == "carol", 3) is not None
        assert listener.is_alive() and ctl._ev.worker is listener and ctl.connections == 1  # never reconnected
        assert max(len(r.getMessage()) for r in caplog.records) < 1000
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        rec.close()


def test_a_5000_deep_custom_event_is_answered_and_the_listener_lives(controller, client, obs_server):
    """A CustomEvent nested 5,000 deep (json.loads in obsws-python's listener thread raised
    RecursionError and the thread died): answered with an error, the same listener then follows a
    good event, never reconnected."""
    import json
    import uuid

    ctl, state = controller
    listener = ctl._ev.worker
    rec = EventRecorder(obs_cfg(obs_server))
    try:
        deep = '{"vcam": ' + "[" * 5000 + "]" * 5000 + "}"
        raw = '{"op": 6, "d": {"requestType": "BroadcastCustomEvent", "requestId": "%s", "requestData": {"eventData": %s}}}' % (
            uuid.uuid4().hex,
            deep,
        )
        ws = client.base_client.ws
        ws.send(raw)  # by hand: obsws-python's own json.dumps cannot nest 5,000 deep
        answer = json.loads(ws.recv())
        assert answer["d"]["requestStatus"]["result"] is True, answer
        assert wait_for(lambda: rec.replies(), 5) is not None, "no reply to the deep event"
        reply = rec.replies()[-1]
        assert reply["ok"] is False and "nests at most 64 levels deep" in reply["error"], reply
        assert listener.is_alive()
        client.broadcast_custom_event({"eventData": {"vcam": {"face": "carol"}}})
        assert wait_for(lambda: state.active == "carol", 3) is not None
        assert listener.is_alive() and ctl._ev.worker is listener and ctl.connections == 1  # never reconnected
    finally:
        rec.close()


# --- per-person mapping: one scene per mapped person (issue 10) ---------------------------------


def mapping_state(active: str = "alice") -> RuntimeState:
    """make_state() with the map targets 'ann' and 'ben' (obs_harness.with_map_targets)."""
    return with_map_targets(make_state(active))


def chosen(client, scene: str, target: str) -> list[str]:
    """The choices shown in ``target``'s map scene."""
    return sorted(
        c for n, on in visible(client, map_scene_name(scene, target)).items() if on and (c := map_choice(target, n)) is not None
    )


def test_map_scenes_setup_is_idempotent_and_lists_the_hotkeys(client, face_images):
    scene = "Setup Map"
    try:
        report = setup_scene(client, face_images, scene=scene, targets={"ann": "bob", "ben": None})
        assert report.map_scenes == {"Setup Map: ann": True, "Setup Map: ben": True}
        assert chosen(client, scene, "ann") == ["bob"] and chosen(client, scene, "ben") == [DEFAULT_CHOICE]
        names = set(visible(client, "Setup Map: ann"))
        assert names == {map_source_name("ann", n) for n in (*FACES, DEFAULT_CHOICE)}
        hotkeys = set(client.get_hot_key_list().hotkeys)
        for key, label in report.map_hotkeys["Setup Map: ben"]:
            assert key in hotkeys and label.startswith("Show 'Face for ben: ")
        text = "\n".join(report.lines())
        assert "scene 'Setup Map: ann' created" in text
        assert "under the scene 'Setup Map: ann':\n  Show 'Face for ann: alice'" in text
        assert "  Show 'Face for ann: (default)' (no face of their own)" in text
        # Again, with ann shown 'carol' meanwhile: nothing added, the choice left as it is.
        for it in client.get_scene_item_list("Setup Map: ann").scene_items:
            client.set_scene_item_enabled("Setup Map: ann", it["sceneItemId"], it["sourceName"] == "Face for ann: carol")
        again = setup_scene(client, face_images, scene=scene, targets={"ann": "bob", "ben": None})
        assert again.map_scenes == {"Setup Map: ann": False, "Setup Map: ben": False} and again.created == []
        assert chosen(client, scene, "ann") == ["carol"]
        assert len(client.get_scene_item_list("Setup Map: ann").scene_items) == len(FACES) + 1
    finally:
        for name in (scene, "Setup Map: ann", "Setup Map: ben"):
            if name in [s["sceneName"] for s in client.get_scene_list().scenes]:
                client.remove_scene(name)


def test_map_scene_hotkeys_events_and_ctl_switch_a_persons_face(obs_server, client, face_images):
    scene = "Map Faces"
    setup_scene(client, face_images, scene=scene, targets={"ann": "bob", "ben": None})
    state = mapping_state()
    state.set_mapping("ann", "bob")
    ctl = ObsController(obs_cfg(obs_server, scene=scene), state, retry_min=0.2, retry_max=1.0)
    rec = EventRecorder(obs_cfg(obs_server))
    ctl.start()
    try:
        assert ctl.connected.wait(10), ctl.last_error
        with Frames(state) as frames:
            # A hotkey in ann's scene: ann gets carol, radio style; the frame loop sees it.
            client.trigger_hot_key_by_name(show_hotkey(map_source_name("ann", "carol")))
            assert wait_for(lambda: state.mappings == {"ann": "carol"}, 2) is not None
            assert wait_for(lambda: chosen(client, scene, "ann") == ["carol"], 2) is not None
            assert [(m.target.name, m.source.name) for m in state.snapshot().mapping] == [("ann", "carol")]
            # (default): ann follows the default again.
            client.trigger_hot_key_by_name(show_hotkey(map_source_name("ann", DEFAULT_CHOICE)))
            assert wait_for(lambda: state.mappings == {}, 2) is not None
            assert wait_for(lambda: chosen(client, scene, "ann") == [DEFAULT_CHOICE], 2) is not None
            # The eye icon on ben's 'alice', as a user would click it.
            item = client.get_scene_item_id("Map Faces: ben", map_source_name("ben", "alice")).scene_item_id
            client.set_scene_item_enabled("Map Faces: ben", item, True)
            assert wait_for(lambda: state.mappings == {"ben": "alice"}, 2) is not None
            assert wait_for(lambda: chosen(client, scene, "ben") == ["alice"], 2) is not None
            # `vcam ctl map` / `unmap` (the state changed elsewhere) show in OBS.
            state.set_mapping("ann", "bob")
            assert wait_for(lambda: chosen(client, scene, "ann") == ["bob"], 2) is not None
            state.remove_mapping("ben")
            assert wait_for(lambda: chosen(client, scene, "ben") == [DEFAULT_CHOICE], 2) is not None
            # Custom events (Stream Deck) map and unmap; the reply carries the mappings.
            client.broadcast_custom_event({"eventData": {"vcam": {"map": {"target": "ben", "source": "carol"}}}})
            assert wait_for(lambda: state.mappings == {"ann": "bob", "ben": "carol"}, 2) is not None
            assert wait_for(lambda: chosen(client, scene, "ben") == ["carol"], 2) is not None
            client.broadcast_custom_event({"eventData": {"vcam": {"unmap": "ann"}}})
            assert wait_for(lambda: chosen(client, scene, "ann") == [DEFAULT_CHOICE], 2) is not None
            assert wait_for(lambda: len(rec.replies()) >= 2, 2) is not None
            assert rec.replies()[-1] == {"ok": True, "face": "alice", "swap": "on", "paused": False, "mappings": {"ben": "carol"}}
            client.broadcast_custom_event({"eventData": {"vcam": {"map": {"target": "ann", "source": "nobody"}}}})
            assert wait_for(lambda: any(not r["ok"] for r in rec.replies()), 2) is not None
            bad = [r for r in rec.replies() if not r["ok"]][0]
            assert bad["error"].startswith("unknown face 'nobody'") and bad["mappings"] == {"ben": "carol"}
            # The main scene still switches the active face, apart from the mappings. (The eye
            # icon: 'Face: bob' is in the module's scene too, so its hotkey name is not this one's.)
            client.set_scene_item_enabled(scene, client.get_scene_item_id(scene, face_source_name("bob")).scene_item_id, True)
            assert wait_for(lambda: state.active == "bob", 2) is not None
            assert state.mappings == {"ben": "carol"} and chosen(client, scene, "ben") == ["carol"]
            assert frames.advancing()
        assert ctl.connected.is_set() and ctl.connections == 1
    finally:
        rec.close()
        ctl.stop()
        for name in (scene, "Map Faces: ann", "Map Faces: ben"):
            client.remove_scene(name)


def test_a_map_scene_without_mapping_enabled_answers_and_shows_the_state(obs_server, client, face_images):
    """A run started without [[swap.map]]: showing a person's face in OBS is answered with how to
    turn mapping on, and the scene goes back to '(default)'."""
    scene = "Off Faces"
    setup_scene(client, face_images, scene=scene, targets={"ann": None})
    state = make_state()
    ctl = ObsController(obs_cfg(obs_server, scene=scene), state, retry_min=0.2, retry_max=1.0)
    rec = EventRecorder(obs_cfg(obs_server))
    ctl.start()
    try:
        assert ctl.connected.wait(10), ctl.last_error
        client.trigger_hot_key_by_name(show_hotkey(map_source_name("ann", "bob")))
        assert wait_for(lambda: any(not r["ok"] for r in rec.replies()), 2) is not None
        bad = [r for r in rec.replies() if not r["ok"]][0]
        assert bad["error"].startswith("per-person mapping is off in this run") and "--map TARGET=SOURCE" in bad["error"]
        assert wait_for(lambda: chosen(client, scene, "ann") == [DEFAULT_CHOICE], 2) is not None
        assert state.mappings == {} and ctl.connected.is_set()
    finally:
        rec.close()
        ctl.stop()
        for name in (scene, "Off Faces: ann"):
            client.remove_scene(name)


@pytest.mark.slow
def test_a_mapping_chosen_in_obs_while_vcam_was_away_is_adopted(obs_server, client, face_images):
    scene = "Merge Map"
    setup_scene(client, face_images, scene=scene, targets={"ann": None, "ben": None})
    state = mapping_state()
    state.set_mapping("ben", "alice")
    ctl = ObsController(obs_cfg(obs_server, scene=scene), state, retry_min=1.5, retry_max=1.5)
    ctl.start()
    try:
        assert ctl.connected.wait(10), ctl.last_error
        assert wait_for(lambda: chosen(client, scene, "ben") == ["alice"], 3) is not None
        with _away(ctl):
            for it in client.get_scene_item_list("Merge Map: ann").scene_items:  # the user, in OBS
                client.set_scene_item_enabled("Merge Map: ann", it["sceneItemId"], it["sourceName"] == "Face for ann: carol")
            state.set_mapping("ben", "bob")  # and `vcam ctl map ben bob` meanwhile
            # the echo of the last sync (showing alice for ben) received but not handled before the
            # drop, as a busy machine leaves it: it must not undo the change made while away
            (alice,) = [
                i["sceneItemId"]
                for i in client.get_scene_item_list("Merge Map: ben").scene_items
                if i["sourceName"] == "Face for ben: alice"
            ]
            ctl._queue.put(("item", "Merge Map: ben", alice, True))
            ctl._queue.put(("custom", {"vcam": {"face": "bob"}}))  # a command received then is still carried out
        assert ctl.connected.wait(10)
        assert wait_for(lambda: state.mappings == {"ben": "bob", "ann": "carol"}, 3) is not None, state.mappings
        assert wait_for(lambda: state.active == "bob", 3) is not None, state.active
        assert wait_for(lambda: chosen(client, scene, "ben") == ["bob"], 3) is not None
        assert chosen(client, scene, "ann") == ["carol"]
    finally:
        ctl.stop()
        for name in (scene, "Merge Map: ann", "Merge Map: ben"):
            client.remove_scene(name)


def test_status_text_names_mappings_and_nan_guard_counts(controller, client):
    ctl, state = controller
    state.set_target_loader(lambda name: SourceFace(name=name, image=np.zeros((8, 8, 3), np.uint8), embeddings={"r": np.ones(4)}))
    state.publish_status(Status(fps_out=29.5, latency_p50_ms=41.0, guarded={"inswapper_128": 3, "gfpgan_1.4": 0}))
    state.set_mapping("ann", "carol")

    def text():
        return client.get_input_settings("FastSwap Status").input_settings.get("text", "")

    pattern = r"face: alice  swap: on  29\.5 fps  41 ms  map: ann -> carol  NaN guard: inswapper_128 3  \(at \d\d:\d\d:\d\d\)"
    assert wait_for(lambda: re.fullmatch(pattern, text()), 3) is not None, text()


@pytest.mark.slow
def test_cli_obs_setup_makes_a_scene_per_mapped_person(obs_server, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.detections import DetectParams
    from vcam.stages.faces import FaceBank

    faces_dir = tmp_path / "faces"
    det = RetinaFaceDetector(DetectParams(score=0.5))
    FaceBank(faces_dir).add(Path(vcam.__file__).parent / "assets" / "grace_hopper.jpg", "grace", detector=det)
    monkeypatch.setenv("VCAM_OBS_PASSWORD", obs_server.password)
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(
        f"[obs]\nenabled = true\nport = {obs_server.port}\nscene = 'CLI Map'\n[faces]\ndir = '{faces_dir}'\n"
        '[[swap.map]]\ntarget = "photos/ann.jpg"\nsource = "grace"\n'
    )
    c = connect(obs_cfg(obs_server))
    try:
        res = CliRunner().invoke(obs_app, ["setup", "--config", str(cfg_file)])
        assert res.exit_code == 0, res.output
        assert "scene 'CLI Map: ann' created" in res.output
        assert "under the scene 'CLI Map: ann':" in res.output and "Show 'Face for ann: grace'" in res.output
        assert chosen(c, "CLI Map", "ann") == ["grace"]
        res = CliRunner().invoke(obs_app, ["status", "--config", str(cfg_file)])
        assert res.exit_code == 0 and "map scenes for ann" in res.output, res.output
    finally:
        for name in ("CLI Map", "CLI Map: ann"):
            if name in [s["sceneName"] for s in c.get_scene_list().scenes]:
                c.remove_scene(name)
        c.disconnect()


# --- several streams (issue 12): one control scene each ------------------------------------------


@pytest.mark.slow
def test_each_stream_has_its_own_obs_scene_and_hotkeys(obs_server, client, tmp_path, face_images, monkeypatch):
    """`vcam obs setup` with two [[streams]] creates one scene per stream; in a running two-stream
    daemon a hotkey of stream b's scene switches stream b only, and its frames show it."""
    from typer.testing import CliRunner

    from vcam.config_file import build, parse_streams
    from vcam.runtime.daemon import Daemon

    monkeypatch.setenv("VCAM_OBS_PASSWORD", obs_server.password)
    cfg_file = tmp_path / "streams.toml"
    cfg_file.write_text(
        f'[obs]\nenabled = true\nport = {obs_server.port}\nscene = "Cams"\nstatus_source = "Cams Status"\n'
        '[[streams]]\nname = "a"\ninput = "demo"\noutput = "null"\n'
        '[[streams]]\nname = "b"\ninput = "demo"\noutput = "null"\n'
    )
    monkeypatch.setattr("vcam.cli.control.bank_images", lambda d: dict(face_images))
    res = CliRunner().invoke(obs_app, ["setup", "--config", str(cfg_file)])
    assert res.exit_code == 0, res.output
    assert "scene 'Cams (a)' created" in res.output and "scene 'Cams (b)' created" in res.output, res.output
    base = demo_daemon_config(tmp_path / "vcam.sock", obs=obs_cfg(obs_server, scene="Cams", status_source="Cams Status"))
    cfg = base.replace(streams=parse_streams([{"name": n, "input": "demo", "output": "null"} for n in "ab"], "test"))
    cfg = cfg.replace(capture=build({"capture": {"width": 320, "height": 240}}).capture)
    state = RuntimeState(solid_faces(("alice", "bob")), active="bob")
    outs = {"a": CapturingOutput(), "b": CapturingOutput()}
    daemon = Daemon(cfg, state=state, outputs=outs)
    daemon.start()
    try:
        assert daemon.ready.wait(60) and daemon.summary.error is None, daemon.summary.error
        sa, sb = (st.state for st in daemon.streams)
        assert wait_for(lambda: visible_faces_in(client, "Cams (b)") == ["bob"], 10) is not None
        item = next(
            it["sceneItemId"]
            for it in client.get_scene_item_list("Cams (b)").scene_items
            if it["sourceName"] == face_source_name("alice")
        )
        client.set_scene_item_enabled("Cams (b)", item, True)  # what the scene's hotkey does
        assert wait_for(lambda: sb.active == "alice", 2) is not None, (sa.active, sb.active)
        assert sa.active == "bob"
        n = outs["b"].frames
        assert wait_for(lambda: outs["b"].frames > n + 2 and colour_pixels(outs["b"].last, "alice") > 200, 10) is not None
        assert colour_pixels(outs["a"].last, "bob") > 200 and colour_pixels(outs["a"].last, "alice") < 20
        # OBS custom events (a Stream Deck): {"stream": NAME} picks one stream, without it every stream.
        client.broadcast_custom_event({"eventData": {"vcam": {"stream": "a", "face": "alice"}}})
        assert wait_for(lambda: sa.active == "alice", 2) is not None and sb.active == "alice"
        client.broadcast_custom_event({"eventData": {"vcam": {"stream": "b", "face": "bob"}}})
        assert wait_for(lambda: sb.active == "bob", 2) is not None
        assert sa.active == "alice"
        client.broadcast_custom_event({"eventData": {"vcam": {"swap": "off"}}})
        assert wait_for(lambda: not sa.swap_enabled and not sb.swap_enabled, 2) is not None
    finally:
        daemon.stop()


# --- audio sync: OBS's audio sync offset follows vcam's video delay ---------------------------


def audio_input(client, name: str, offset: int) -> None:
    """An audio input ``name`` in OBS (a PulseAudio capture: under Xvfb it captures nothing, but it
    has the audio flag the sync offset needs) whose own offset is ``offset`` ms."""
    if name not in {i["inputName"] for i in client.get_input_list().inputs}:
        scene = client.get_current_program_scene().current_program_scene_name
        client.create_input(scene, name, "pulse_input_capture", {}, True)
    client.set_input_audio_sync_offset(name, offset)


def offset_of(client, name: str) -> int:
    return int(client.get_input_audio_sync_offset(name).input_audio_sync_offset)


def test_audio_sync_follows_the_video_delay_and_restores_the_offsets(obs_server, scene, client, caplog):
    """The offset read back is the figure vcam reports (within 5 ms); a figure moving by less than
    the step leaves it; a bigger move is followed, never sooner than the interval after the last
    setting; the panel's switch (the audio_sync command) puts the input's own offset back and takes
    it again; an input OBS lacks is one warning; at stop the own offset is back."""
    from vcam.control.local import apply_control
    from vcam.control.obs_audio import INTERVAL_S, STEP_MS, ObsAudio

    audio_input(client, "Mic/Aux", 7)
    state = make_state()
    state.offer("audio_sync", True)
    state.publish_status(Status(frames_out=100, fps_in=30.0, latency_p50_ms=53.3, av_delay_ms=86.6))
    ctl = ObsController(obs_cfg(obs_server), state, retry_min=0.2, audio=ObsAudio(["Mic/Aux", "No Such Mic"]))
    caplog.set_level(logging.WARNING, logger="vcam.control.obs_audio")
    ctl.start()
    try:
        assert ctl.connected.wait(10), ctl.last_error
        assert wait_for(lambda: offset_of(client, "Mic/Aux") != 7, 2) is not None
        first = time.monotonic()
        # the figure is kept once every input was asked (the second, which OBS refuses, comes after)
        assert wait_for(lambda: ctl.audio.figure_ms is not None, 2) is not None
        assert abs(offset_of(client, "Mic/Aux") - state.read_status().av_delay_ms) <= 5
        assert ctl.audio.figure_ms == pytest.approx(86.6) and ctl.audio.originals["Mic/Aux"] == 7
        # Jitter below the step never moves it, even after the interval.
        state.publish_status(Status(frames_out=200, fps_in=30.0, av_delay_ms=86.6 + STEP_MS * 0.75))
        time.sleep(INTERVAL_S + 1.0)
        assert offset_of(client, "Mic/Aux") == 87
        # A change of load: followed, within 5 ms, at least the interval after the last setting.
        state.publish_status(Status(frames_out=300, fps_in=30.0, av_delay_ms=141.2))
        assert wait_for(lambda: offset_of(client, "Mic/Aux") == 141, INTERVAL_S + 1.0) is not None
        assert time.monotonic() - first >= INTERVAL_S
        state.publish_status(Status(frames_out=400, fps_in=30.0, av_delay_ms=60.0))
        t0 = time.monotonic()
        assert wait_for(lambda: offset_of(client, "Mic/Aux") == 60, INTERVAL_S + 1.0) is not None
        assert time.monotonic() - t0 >= INTERVAL_S - 1.0  # the last setting was at most a second before t0
        # The switch: off puts the input's own offset back, on takes it again.
        assert apply_control(state, {"audio_sync": "toggle"})["settings"] == {"audio_sync": False}
        assert wait_for(lambda: offset_of(client, "Mic/Aux") == 7, 2) is not None
        apply_control(state, {"audio_sync": True})
        assert wait_for(lambda: offset_of(client, "Mic/Aux") == 60, 2) is not None
        refused = [r for r in caplog.records if "No Such Mic" in r.getMessage()]
        assert len(refused) == 1 and "No source was found" in refused[0].getMessage()
    finally:
        ctl.stop()
    assert offset_of(client, "Mic/Aux") == 7


def test_audio_sync_command_is_refused_where_the_run_does_not_offer_it(controller, obs_server, client):
    """No [obs] audio_sync: the command is answered with what turns it on."""
    rec = EventRecorder(obs_cfg(obs_server))
    try:
        client.broadcast_custom_event({"eventData": {"vcam": {"audio_sync": "on"}}})
        said = wait_for(lambda: any("audio sync is not available" in r.get("error", "") for r in rec.replies()), 2)
        assert said is not None, rec.replies()
    finally:
        rec.close()


@pytest.mark.slow
def test_daemon_audio_sync_follows_load_and_is_restored_at_exit(obs_server, scene, client, tmp_path):
    """The real daemon on the demo clip: OBS's offset is the delay vcam reports (within 5 ms); a
    heavier load (60 ms more per frame, through the round hook) moves the delay and the offset
    follows it; at exit the input's own offset is back."""
    from vcam.runtime.daemon import Daemon

    audio_input(client, "Mic/Aux", -20)
    load = {"s": 0.0}

    def hook(mark) -> None:
        if mark.phase == "begun" and load["s"]:
            time.sleep(load["s"])

    cfg = demo_daemon_config(tmp_path / "vcam.sock", obs=obs_cfg(obs_server, audio_sync=["Mic/Aux"]))
    daemon = Daemon(cfg, state=RuntimeState(solid_faces(("alice",)), active="alice"), output=CapturingOutput(), hook=hook)
    daemon.start()
    try:
        assert daemon.ready.wait(60) and daemon.summary.error is None, daemon.summary.error
        state = daemon.streams[0].state
        assert state.settings == {"audio_sync": True, "mouth_mask": False, "mirror": False, "record": False, "camera": -1}

        def agreed() -> bool:
            return abs(offset_of(client, "Mic/Aux") - state.read_status().av_delay_ms) <= 5

        assert wait_for(lambda: offset_of(client, "Mic/Aux") != -20, 10) is not None
        assert wait_for(agreed, 5) is not None, (offset_of(client, "Mic/Aux"), state.read_status().av_delay_ms)
        light = offset_of(client, "Mic/Aux")
        load["s"] = 0.06
        assert wait_for(lambda: offset_of(client, "Mic/Aux") >= light + 40, 10) is not None
        assert wait_for(agreed, 5) is not None, (offset_of(client, "Mic/Aux"), state.read_status().av_delay_ms)
        load["s"] = 0.0
        assert wait_for(lambda: offset_of(client, "Mic/Aux") <= light + 20, 10) is not None
    finally:
        daemon.stop()
    assert daemon.summary.error is None
    assert offset_of(client, "Mic/Aux") == -20


# --- the desk's settings and docs/obs.md's recipes, as custom events through OBS ----------------


def doc_recipes() -> list[dict]:
    """The request data lines of docs/obs.md's Stream Deck and Streamer.bot recipes."""

    text = (Path(__file__).resolve().parents[2] / "docs" / "obs.md").read_text()
    section = text.split("## 10. Stream Deck and Streamer.bot recipes", 1)[1].split("\n## ", 1)[0]
    return [json.loads(line.strip()) for line in section.splitlines() if line.strip().startswith('{"eventData"')]


def offer_every_setting(state: RuntimeState) -> RuntimeState:
    from vcam.control.commands import SETTINGS

    for s in SETTINGS:
        if s.kind == "choice":  # the cameras: the recipe's number among them
            state.offer(s.key, 0, choices=lambda refresh: [(0, "cam a"), (2, "cam b")])
        else:
            state.offer(s.key, 0.8 if s.kind == "amount" else s.key != "mirror")
    return state


def test_the_recipes_of_docs_obs_work_through_obs(obs_server, scene, client):
    """Each recipe line of docs/obs.md, broadcast through a real OBS, is answered ok, and its reply
    (face, swap, pause, the settings) is what the same command over `vcam ctl`'s path gives a twin
    state; so every desk setting works as an OBS custom event. The controller serves stream 'side'
    (the recipe naming it), which also answers the commands naming no stream."""
    from vcam.control.commands import SETTINGS
    from vcam.control.local import handle_command

    recipes = doc_recipes()
    assert len(recipes) >= 10
    sent = {k for r in recipes for k in r["eventData"]["vcam"]}
    assert {s.key for s in SETTINGS} <= sent  # every setting has a recipe
    state, twin = offer_every_setting(make_state()), offer_every_setting(make_state())
    ctl = ObsController(obs_cfg(obs_server), state, retry_min=0.2, stream="side")
    rec = EventRecorder(obs_cfg(obs_server))
    ctl.start()
    try:
        assert ctl.connected.wait(10), ctl.last_error
        for data in recipes:
            n = len(rec.replies())
            client.broadcast_custom_event(data)  # a connection of its own, as a Stream Deck has (the
            # controller's is its thread's: a request from here could interleave with its replies)
            assert wait_for(lambda n=n: len(rec.replies()) > n, 2) is not None, data
            got = rec.replies()[n]
            cmd = {k: v for k, v in data["eventData"]["vcam"].items() if k != "stream"}
            want = handle_command(twin, cmd)
            assert got["ok"] and want["ok"], (data, got)
            assert {k: got[k] for k in ("face", "swap", "paused", "settings", "choices")} == json.loads(
                json.dumps({k: want[k] for k in ("face", "swap", "paused", "settings", "choices")})
            ), data
        assert state.settings == twin.settings and state.snapshot().settings == twin.settings
        assert state.settings["enhancer_amount"] == 1.0 and state.settings["mirror"] is True
        assert state.settings["camera"] == 2 and state.settings["before_after"] is False
    finally:
        rec.close()
        ctl.stop()


def test_setup_starts_again_when_its_scene_vanishes_under_it(monkeypatch):
    """A scene the user removed a moment before is still listed and read while OBS tears it down,
    then goes in the middle of the setup (a busy run once failed so): the setup starts again and
    creates it; any other refusal is raised as it was."""
    from obsws_python.error import OBSSDKRequestError

    from vcam.control import obs_scene

    calls = []

    def setup(client, faces, *, scene, **options):
        calls.append(scene)
        if len(calls) == 1:
            raise OBSSDKRequestError("GetSceneItemId", 600, f"No source was found by the name of `{scene}`.")
        return obs_scene.SetupReport(scene=scene)

    monkeypatch.setattr(obs_scene, "_setup_scene", setup)
    assert obs_scene.setup_scene(None, {}, scene="S").scene == "S" and calls == ["S", "S"]

    def refused(client, faces, *, scene, **options):
        raise OBSSDKRequestError("CreateInput", 601, "a resource already exists")

    monkeypatch.setattr(obs_scene, "_setup_scene", refused)
    with pytest.raises(OBSSDKRequestError):
        obs_scene.setup_scene(None, {}, scene="S")
