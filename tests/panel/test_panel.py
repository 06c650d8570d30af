"""The panel's parts without a browser: the preview's shrinking and its tap, the bind rule, the
token file, and the guard's rules over real HTTP against a served panel (the browser test in
test_panel_browser.py drives the whole page against a real daemon)."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
import pytest
from conftest import WINDOWS, vcam_cli

from vcam.errors import ConfigError
from vcam.kernels.convert import from_bgr_cv, to_bgr_cv
from vcam.panel.access import (
    ONCE_TTL,
    OnceCodes,
    allowed_hosts,
    base_of,
    check_bind,
    load_pairing_key,
    new_token,
    once_code,
    once_url,
    read_panel_file,
    remove_panel_file,
    write_panel_file,
)
from vcam.panel.preview import PreviewTap, encode, shrink
from vcam.state import RuntimeState
from vcam.types import PixelFormat, SourceFace


def picture(w: int = 1280, h: int = 720) -> np.ndarray:
    """Smooth colour ramps (nearest-neighbour sampling of them stays close to an area resize)."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=2).astype(np.uint8)


@pytest.mark.parametrize("fmt", [PixelFormat.BGR, PixelFormat.I420, PixelFormat.NV12, PixelFormat.RGB])
def test_shrink_keeps_the_picture_in_each_output_format(fmt):
    bgr = picture()
    data = bgr if fmt is PixelFormat.BGR else bgr[:, :, ::-1].copy() if fmt is PixelFormat.RGB else from_bgr_cv(bgr, fmt)
    small, w, h = shrink(data, fmt, 320)
    assert (w, h) == (320, 180)
    back = to_bgr_cv(small, fmt, w, h)
    want = bgr[::4, ::4][:180, :320]
    assert np.abs(back.astype(int) - want.astype(int)).mean() < 4
    jpeg = encode(small, fmt, w, h, 320)
    assert jpeg[:2] == b"\xff\xd8" and len(jpeg) < 40_000
    assert shrink(np.zeros(100, np.uint8), PixelFormat.MJPEG) is None


def test_the_tap_takes_nothing_until_watched_and_drops_a_frame_overwritten_meanwhile():
    tap = PreviewTap(fps=1000)
    data = from_bgr_cv(picture(640, 480), PixelFormat.I420)
    tap.offer("s1", data, PixelFormat.I420)
    assert tap.offered == 0 and tap._job is None
    tap.start()
    try:
        tap.watch("s1")
        begun = [10]
        tap.offer("s1", data, PixelFormat.I420, lambda: begun[0], 1)
        assert _until(lambda: tap.frames.get("s1")) and tap.frames["s1"][0] == 1
        calls = iter([20, 22])  # two frames begun before the encoder got to it: more than the slack of 1
        tap._next["s1"] = 0.0
        tap.offer("s1", data, PixelFormat.I420, lambda: next(calls), 1)
        assert _until(lambda: tap.stale == 1) and tap.frames["s1"][0] == 1
        tap.unwatch("s1")
        tap._next["s1"] = 0.0
        tap.offer("s1", data, PixelFormat.I420)
        assert tap.offered == 2
    finally:
        tap.stop()


def _until(fn, timeout: float = 5.0):
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.01)
    return False


def test_only_loopback_is_served_without_tls(tmp_path):
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, "", "")
    with pytest.raises(ConfigError, match=r"not loopback") as info:
        check_bind("0.0.0.0", "", "")
    assert "tls_cert" in info.value.hint
    with pytest.raises(ConfigError, match=r"is not a file"):
        check_bind("192.168.1.5", str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    (tmp_path / "cert.pem").write_text("x")
    (tmp_path / "key.pem").write_text("x")
    check_bind("192.168.1.5", str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert allowed_hosts("127.0.0.1", 8765) == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert allowed_hosts("cam.lan", 443) == {"cam.lan:443", "cam.lan"}
    assert {"127.0.0.1:443", f"{socket.gethostname()}:443"} <= allowed_hosts("0.0.0.0", 443)


def test_the_panel_file_is_private_and_removed_only_by_its_writer(tmp_path):
    path = tmp_path / "vcam.sock.panel"
    token = new_token()
    assert len(token) >= 40 and new_token() != token and new_token(token) == token and new_token("short") != "short"
    write_panel_file(path, "http://127.0.0.1:1/#token=" + token, token)
    if not WINDOWS:  # no file modes there: the file is private as the user's profile folder it is in
        assert path.stat().st_mode & 0o777 == 0o600
    assert read_panel_file(path)["token"] == token
    other = json.loads(path.read_text()) | {"pid": os.getpid() + 1}
    path.write_text(json.dumps(other))
    remove_panel_file(path)
    assert path.exists()  # another daemon's
    write_panel_file(path, "u", token)
    remove_panel_file(path)
    assert not path.exists()


@pytest.mark.skipif(WINDOWS, reason="uids and mode bits: not on Windows (the file is as private as the profile folder it is in)")
def test_vcam_panel_refuses_a_panel_file_it_does_not_own(tmp_path):
    """A panel file another user planted (their uid, readable by others, a link, or in a folder
    others can write): `vcam panel` says so in one line and prints no URL."""
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "vcam.sock.panel"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[control]\nsocket = '{folder / 'vcam.sock'}'\n")
    planted = "http://127.0.0.1:9/#token=" + "a" * 43
    write_panel_file(path, planted, "a" * 43)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match=r"not this user's own panel file: others may read or change it \(mode 0644\)"):
        read_panel_file(path)
    res = vcam_cli("panel", "--config", str(cfg))
    assert res.returncode != 0 and "not this user's own panel file" in res.stderr and planted not in res.stdout + res.stderr
    os.chmod(path, 0o600)
    os.chmod(folder, 0o777)
    with pytest.raises(ConfigError, match=r"its folder is not private"):
        read_panel_file(path)
    os.chmod(folder, 0o700)
    if os.getuid() == 0:  # root can hand the file to another uid
        os.chown(path, 4242, 4242)
        with pytest.raises(ConfigError, match=r"it belongs to uid 4242"):
            read_panel_file(path)
        os.chown(path, 0, 0)
    path.rename(folder / "elsewhere")
    path.symlink_to(folder / "elsewhere")
    with pytest.raises(ConfigError, match=r"it is a symbolic link"):
        read_panel_file(path)
    remove_panel_file(path)  # never follows or removes someone else's
    assert path.is_symlink()


def test_the_pairing_key_is_kept_private_and_a_foreign_one_is_replaced(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "vcam.sock.panelkey"
    key = load_pairing_key(path)
    assert len(key) >= 40 and load_pairing_key(path) == key and load_pairing_key(None) != key
    if not WINDOWS:
        assert path.stat().st_mode & 0o777 == 0o600
        os.chmod(path, 0o644)  # readable by others: not trusted, a new one is made (private again)
        assert load_pairing_key(path) != key and path.stat().st_mode & 0o777 == 0o600


# --- the guard, over HTTP -----------------------------------------------------------------------------


class Backend:
    """The daemon as the panel sees it, with two faces and no people (the browser test has a real one)."""

    def __init__(self, faces_dir: Path) -> None:
        img = np.zeros((128, 128, 3), np.uint8)
        self.states = {"s1": RuntimeState({n: SourceFace(n, img) for n in ("alice", "bob")}, active="alice")}
        self.faces_dir = faces_dir

    def info(self):
        return {"device": "cpu", "models": []}

    def people(self, stream):
        return []

    def map_person(self, stream, track, source):
        raise ConfigError("per-person mapping is off in this run")

    def add_face(self, photo, name, pick=None):
        self.picked = pick
        raise ConfigError("not here")

    def remove_face(self, name):
        raise ConfigError("not here")

    def published(self, stream):
        return 7


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vcam.panel.server import PanelServer

    srv = PanelServer(Backend(tmp_path_factory.mktemp("faces")), token=new_token(), port=0)
    srv.start()
    yield srv
    srv.stop()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def call(srv, path, *, method="GET", body=None, headers=None):
    req = urllib.request.Request(srv.base_url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.build_opener(_NoRedirect).open(req, timeout=10) as res:
            return res.status, dict(res.headers), res.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_guard_asks_for_the_token_on_every_request(served):
    """The API answers only with the token in the X-Vcam-Token header: no cookie is set or taken
    (cookies are not kept apart by port). The page shell is served without it and holds no secret."""
    token = {"X-Vcam-Token": served.token}
    for path in ("/api/state", "/api/session", "/api/faces/alice/thumb", "/api/preview", "/nowhere"):
        assert call(served, path)[0] == 401, path
    for path in ("/", "/static/panel.js", "/static/panel.css", "/favicon.ico"):
        status, headers, body = call(served, path)
        assert status == 200 and served.token.encode() not in body and "set-cookie" not in {k.lower() for k in headers}, path
        assert headers["cross-origin-resource-policy"] == "same-origin" and headers["x-frame-options"] == "DENY", path
    assert call(served, "/favicon.ico")[1]["content-type"].startswith("image/svg+xml")
    # The URL of older runs (?token=): sent on to '#' (a browser keeps that part to itself), no cookie.
    status, headers, _ = call(served, f"/?token={served.token}")
    assert status == 303 and headers["location"] == "/#" + urlencode({"token": served.token})
    assert "set-cookie" not in {k.lower() for k in headers} and call(served, "/?token=wrong")[0] == 401
    assert call(served, "/api/state", headers={"Cookie": f"vcam_panel_{served.port}={served.token}"})[0] == 401
    status, headers, body = call(served, "/api/state", headers=token)
    assert status == 200 and json.loads(body)["streams"][0]["face"] == "alice"
    assert "access-control-allow-origin" not in {k.lower() for k in headers}
    assert headers["cache-control"] == "no-store" and "script-src 'self'" in headers["content-security-policy"]
    assert (
        headers["cross-origin-resource-policy"] == "same-origin"
        and "frame-ancestors 'none'" in headers["content-security-policy"]
    )
    assert call(served, "/api/faces/alice/thumb", headers=token)[2][:4] == b"\x89PNG"
    assert call(served, "/", method="PUT", headers=token)[0] == 405


HOLD = """import socket, sys
held = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(int(sys.argv[2]))]
print("held", flush=True)
sys.stdin.read()
"""


STEAL = """import json, sys, urllib.error, urllib.request
base, code, token = sys.argv[1:4]
for path, body, headers in (("/api/once", json.dumps({"code": code}).encode(), {"Content-Type": "application/json"}),
                            ("/api/state", None, {"X-Vcam-Token": token}), ("/", None, {})):
    try:
        print(urllib.request.urlopen(urllib.request.Request(base + path, data=body, headers=headers), timeout=10).status)
    except urllib.error.HTTPError as exc:
        print(exc.code)
"""


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0,
    reason="another local user's process: needs root to start one (and uids: not on Windows)",
)
def test_another_local_users_connections_fill_their_own_share_not_the_owners(tmp_path, caplog):
    """On loopback (Linux) the connection cap counts per address and user: another user holding
    every connection it may still leaves the owner's page loading, and is named in one line. That
    user's requests are refused even with a link's code or the token."""
    import shutil
    import subprocess

    from vcam.panel.server import PanelServer
    from vcam.platform import transport

    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")  # one another user may run
    if python is None:
        pytest.skip("no system python3 for another user's process")
    with socket.create_server(("127.0.0.1", 0)) as probe, socket.create_connection(probe.getsockname()) as c:
        if transport.tcp_peer_uid(probe.accept()[0].getsockname(), c.getsockname()) != 0:
            pytest.skip("this OS does not name a loopback peer's user (the cap stays per address)")
    srv = PanelServer(Backend(tmp_path / "faces"), token=new_token(), port=0)
    srv.counts.per_peer, srv.counts.first_request_s = 4, 120.0  # small, and no idle timeout in the test
    srv.start()
    other = subprocess.Popen(
        [python, "-c", HOLD, str(srv.port), "10"],
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=65534,  # nobody
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        assert _until(lambda: sum(srv.counts.refusing.values()) >= 6, 20), srv.counts
        assert srv.counts.open == {("127.0.0.1", 65534): 4}
        for _ in range(8):  # the owner's page: more requests than the other user's whole share
            assert call(srv, "/api/state", headers={"X-Vcam-Token": srv.token})[0] == 200
        refused = [r.getMessage() for r in caplog.records if "refusing connections" in r.getMessage()]
        assert len(refused) == 1 and "127.0.0.1, user uid 65534" in refused[0], refused
    finally:
        if other.stdin is not None:
            other.stdin.close()
        other.wait(30)
    # That user with a link's code (read in a process list) and the token: refused all the same.
    try:
        steal = subprocess.run(
            [python, "-c", STEAL, srv.base_url, srv.url.split("#once=")[1], srv.token],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            user=65534,
        )
        assert steal.returncode == 0 and steal.stdout.split() == ["403", "403", "403"], steal.stdout + steal.stderr
        assert call(srv, "/api/state", headers={"X-Vcam-Token": srv.token})[0] == 200  # the owner's: answered
    finally:
        srv.stop()


def test_a_restarted_daemon_hands_its_token_only_to_a_page_proving_the_pairing_key(served):
    """An open page holds the pairing key (from /api/session, with the token) in memory. The server
    proves the key first; only then does the page prove it, and gets this run's token."""
    import hashlib
    import hmac

    key = json.loads(call(served, "/api/session", headers={"X-Vcam-Token": served.token})[2])["key"]
    post = {"Content-Type": "application/json"}
    mine = "n" * 32
    status, _, body = call(served, "/api/hello", method="POST", body=json.dumps({"nonce": mine}).encode(), headers=post)
    hello = json.loads(body)
    mac = lambda text: hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()  # noqa: E731
    assert status == 200 and hello["proof"] == mac(f"vcam-server|{mine}|{hello['nonce']}") and served.token not in body.decode()
    wrong = {"nonce": hello["nonce"], "proof": mac(f"vcam-page|{hello['nonce']}|other")}
    assert call(served, "/api/resume", method="POST", body=json.dumps(wrong).encode(), headers=post)[0] == 403
    right = {"nonce": hello["nonce"], "proof": mac(f"vcam-page|{hello['nonce']}|{mine}")}  # the nonce was used up
    assert call(served, "/api/resume", method="POST", body=json.dumps(right).encode(), headers=post)[0] == 403
    hello = json.loads(call(served, "/api/hello", method="POST", body=json.dumps({"nonce": mine}).encode(), headers=post)[2])
    right = {"nonce": hello["nonce"], "proof": mac(f"vcam-page|{hello['nonce']}|{mine}")}
    status, _, body = call(served, "/api/resume", method="POST", body=json.dumps(right).encode(), headers=post)
    assert status == 200 and json.loads(body)["token"] == served.token
    evil = {**post, "Origin": "http://127.0.0.1:1"}
    assert call(served, "/api/hello", method="POST", body=json.dumps({"nonce": mine}).encode(), headers=evil)[0] == 403


def test_a_one_time_code_is_taken_once_within_its_time_and_only_for_its_token():
    token = new_token()
    codes = OnceCodes(token)
    now = 1_800_000_000.0
    code = once_code(token, now)
    assert token not in code and len(code) < 80
    assert codes.redeem(code, now + 1) is None  # good, and used up
    assert codes.redeem(code, now + 2) == "used"
    assert codes.redeem(once_code(token, now), now + ONCE_TTL) is None  # the last second still counts
    assert codes.redeem(once_code(token, now), now + ONCE_TTL + 1) == "expired"
    assert codes.redeem(once_code(token, now + 3), now) is None  # made by a clock a little ahead
    assert codes.redeem(once_code(token, now + 60), now) == "expired"  # far ahead: refused
    assert codes.redeem(once_code(new_token(), now), now) == "wrong"  # another run's token
    # keep_token: the next run has the same token; a code made before it started was an earlier run's
    assert OnceCodes(token, started=now + 30).redeem(once_code(token, now + 10), now + 40) == "wrong"
    assert OnceCodes(token, started=now + 30).redeem(once_code(token, now + 30), now + 40) is None
    stamp, nonce, mac = code.split(".")
    bads = (f"{int(stamp) + 1}.{nonce}.{mac}", f"{stamp}.x{nonce}.{mac}", f"{stamp}.{nonce}", "", None, 5, "a.b.c", "9" * 300)
    for bad in bads:
        assert codes.redeem(bad, now) == "wrong", bad
    # Used nonces are forgotten once their codes expired (a late replay is refused as expired).
    assert codes.redeem(code, now + ONCE_TTL + 10) == "expired" and not codes._taken
    assert set(OnceCodes.WHY) == {"used", "expired", "wrong"} and "`vcam panel`" in OnceCodes.HINT
    url = once_url("http://127.0.0.1:8765/#token=" + token, token, now)
    assert url.startswith("http://127.0.0.1:8765/#once=") and token not in url
    assert base_of(url) == base_of("http://127.0.0.1:8765/?token=x") == "http://127.0.0.1:8765"


def test_a_printed_link_is_traded_once_for_the_token(served):
    """POST /api/once (no token needed): this run's code gives the token once; again, expired or
    another run's, a 403 in the page's words saying `vcam panel` prints a fresh link."""
    post = {"Content-Type": "application/json"}
    code = served.url.split("#once=", 1)[1]
    assert served.token not in served.url and served.url.startswith(served.base_url + "/#once=")
    status, _, body = call(served, "/api/once", method="POST", body=json.dumps({"code": code}).encode(), headers=post)
    assert status == 200 and json.loads(body)["token"] == served.token
    for again, why in (
        (code, "already used"),
        (once_code(served.token, time.time() - ONCE_TTL - 5), "expired"),
        (once_code(new_token(), time.time()), "not for this run"),
    ):
        status, _, body = call(served, "/api/once", method="POST", body=json.dumps({"code": again}).encode(), headers=post)
        reply = json.loads(body)
        assert status == 403 and why in reply["error"] and "`vcam panel`" in reply["hint"] and served.token not in body.decode()
    fresh = {"code": once_code(served.token, time.time())}
    evil = {**post, "Origin": "http://127.0.0.1:1"}  # another port's page: refused before the code is looked at
    assert call(served, "/api/once", method="POST", body=json.dumps(fresh).encode(), headers=evil)[0] == 403
    assert call(served, "/api/once", method="POST", body=json.dumps(fresh).encode(), headers=post)[0] == 200


def test_the_websocket_needs_the_panels_origin_and_the_token_first(served):
    """No CORS for WebSockets: one from another origin (another port) is refused at the handshake;
    one without this run's token as its first message is closed with 4401 (the page then proves
    the pairing key); with it, states come."""
    import struct

    import websocket

    url = served.base_url.replace("http", "ws", 1) + "/api/ws"
    for origin in ("http://127.0.0.1:1", None):
        with pytest.raises(websocket.WebSocketBadStatusException, match="403"):
            websocket.create_connection(url, origin=origin, suppress_origin=origin is None, timeout=10)
    ws = websocket.create_connection(url, origin=served.base_url, timeout=10)
    try:
        ws.send(json.dumps({"token": "wrong"}))
        opcode, data = ws.recv_data(control_frame=True)
        assert opcode == websocket.ABNF.OPCODE_CLOSE and struct.unpack(">H", data[:2])[0] == 4401
    finally:
        ws.close()
    ws = websocket.create_connection(url, origin=served.base_url, timeout=10)
    try:
        ws.send(json.dumps({"token": served.token}))
        state = json.loads(ws.recv())
        assert state["streams"][0]["name"] == "s1"
    finally:
        ws.close()


def test_changes_need_the_header_and_a_same_origin(served):
    token = {"X-Vcam-Token": served.token, "Content-Type": "application/json"}
    cookie = {"Cookie": f"vcam_panel_{served.port}={served.token}"}
    assert call(served, "/api/command", method="POST", body=b'{"face": "bob"}', headers=cookie)[0] == 403
    evil = {**token, "Origin": "http://evil.test"}
    assert call(served, "/api/command", method="POST", body=b'{"face": "bob"}', headers=evil)[0] == 403
    assert call(served, "/api/command", method="POST", body=b'{"face": "bob"}', headers={**token, "Host": "evil.test"})[0] == 403
    assert served.backend.states["s1"].active == "alice"
    own = {**token, "Origin": served.base_url}
    status, _, body = call(served, "/api/command", method="POST", body=b'{"face": "bob"}', headers=own)
    reply = json.loads(body)
    assert status == 200 and reply["face"] == "bob" and reply["published"] == {"s1": 7}
    status, _, body = call(served, "/api/command", method="POST", body=b'{"face": "nobody"}', headers=token)
    assert status == 400 and json.loads(body)["error"] == "unknown face 'nobody'"
    status, _, body = call(served, "/api/command", method="POST", body=b"{not json", headers=token)
    assert status == 400 and "JSON" in json.loads(body)["error"]
    status, _, body = call(served, "/api/people", method="POST", body=b'{"track": 1, "source": "bob"}', headers=token)
    assert status == 400 and "mapping is off" in json.loads(body)["error"]


def test_the_pause_button_and_its_command(served):
    """The page's pause button posts ``{"pause": ...}`` through the command path of `vcam ctl`; the
    state the page gets says ``paused``, and its health notes say so once the frame loop has."""
    from vcam.state import Status

    token = {"X-Vcam-Token": served.token, "Content-Type": "application/json"}
    cookie = {"X-Vcam-Token": served.token}
    state = served.backend.states["s1"]
    page = call(served, "/", headers=cookie)[2].decode()
    script = call(served, "/static/panel.js", headers=cookie)[2].decode()
    assert 'id="pause"' in page and "command({ pause: !st.paused })" in script
    try:
        status, _, body = call(served, "/api/command", method="POST", body=b'{"pause": true}', headers=token)
        assert status == 200 and json.loads(body)["paused"] is True and state.paused
        state.publish_status(Status(paused=True))  # what the frame loop publishes once the camera is closed
        shown = json.loads(call(served, "/api/state", headers=cookie)[2])["streams"][0]
        assert shown["paused"] is True and "paused (camera closed)" in shown["notes"]
        status, _, body = call(served, "/api/command", method="POST", body=b'{"pause": "yes"}', headers=token)
        assert status == 400 and "'pause' must be true, false or toggle" in json.loads(body)["error"]
        status, _, body = call(served, "/api/command", method="POST", body=b'{"pause": false}', headers=token)
        assert status == 200 and json.loads(body)["paused"] is False and not state.paused
    finally:
        state.set_paused(False)
        state.publish_status(Status())


@pytest.mark.slow
def test_panel_flag_and_command_say_what_to_do(tmp_path):
    from conftest import demo_run

    res = vcam_cli("run", "--input", "demo", "--panel", "soon")
    assert res.returncode != 0 and "--panel: expected a port number or 'off'" in res.stderr
    res = vcam_cli("panel")
    assert res.returncode != 0 and "no running vcam serves a panel" in res.stderr
    res = vcam_cli(*[a for a in demo_run("--panel", "off") if a != "--quiet"])
    assert res.returncode == 0 and "panel:" not in res.stdout + res.stderr, res.stderr
    # keep_token: a live daemon's next token is the same, and neither run prints it (a one-time link
    # each). In process, with an output of the test's: a live run, which holds the socket and the panel file.
    from obs_harness import CapturingOutput, demo_daemon_config

    from vcam import config_file
    from vcam.runtime.daemon import Daemon

    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[panel]\nport = 0\nkeep_token = true\n[control]\nsocket = '{tmp_path / 'run' / 'vcam.sock'}'\n")
    live = demo_daemon_config(tmp_path / "run" / "vcam.sock").replace(panel=config_file.load(cfg).panel)
    tokens: list[str] = []
    printed: list[str] = []
    for _ in range(2):
        lines: list[str] = []
        assert Daemon(live, output=CapturingOutput(), panel=True, announce=lines.append).run(max_frames=3).frames_out == 3
        tokens.append((read_panel_file(live.panel_file) or {}).get("token", ""))
        printed += [ln for ln in lines if ln.startswith("panel: ")]
    assert len(tokens) == 2 and len(tokens[0]) >= 32 and tokens[0] == tokens[1]
    assert len(printed) == 2 and printed[0] != printed[1] and all("#once=" in ln and tokens[0] not in ln for ln in printed)
    kept = read_panel_file(live.panel_file)
    assert kept is not None and kept["token"] == tokens[0] and kept["url"].endswith("/") and "#" not in kept["url"]
    # The pairing key an open page proves to a restarted daemon: kept beside the panel file, private.
    key_file = live.panel_file.with_name(live.panel_file.name + "key")
    assert key_file.is_file() and load_pairing_key(key_file) == json.loads(key_file.read_text())["key"]
    if not WINDOWS:
        assert key_file.stat().st_mode & 0o777 == 0o600
    # A conversion (no camera, no virtual camera) serves its own panel and leaves the panel file alone.
    res = vcam_cli(*[a for a in demo_run("--config", str(cfg)) if a != "--quiet"])
    assert res.returncode == 0 and [ln for ln in res.stderr.splitlines() if ln.startswith("panel: ")], res.stderr
    assert tokens[0] not in res.stderr and read_panel_file(live.panel_file) == kept


def test_obs_setup_prints_the_dock_steps_with_the_running_url(tmp_path):
    from vcam.cli.control import dock_lines
    from vcam.config_file import build

    cfg = build({"control": {"socket": str(tmp_path / "vcam.sock")}})
    lines = dock_lines(cfg)
    assert "Docks -> Custom Browser Docks" in lines[0] and "`vcam panel` prints a link" in lines[1]
    token = new_token()
    write_panel_file(cfg.panel_file, "http://127.0.0.1:9/", token)
    lines = dock_lines(cfg)
    code = lines[1].strip().split("http://127.0.0.1:9/#once=", 1)[1]  # a one-time link, never the token
    assert token not in "\n".join(lines) and OnceCodes(token).redeem(code, time.time()) is None
    assert "within 2 minutes" in lines[2] and "follows every `vcam run`" in lines[3] and "keep_token" in lines[3]
    off = build({"control": {"socket": str(tmp_path / "vcam.sock")}, "panel": {"enabled": False}})
    assert "panel is off" in dock_lines(off)[0]


@pytest.mark.slow
def test_obs_setup_prints_the_dock_steps_without_obs(tmp_path):
    """The panel's dock needs no OBS connection: `vcam obs setup` with OBS not running still prints
    its steps, then the error."""
    from obs_harness import free_port

    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[obs]\nport = {free_port()}\n[control]\nsocket = '{tmp_path / 'run' / 'vcam.sock'}'\n")
    res = vcam_cli("obs", "setup", "--config", str(cfg), timeout=120)
    assert res.returncode != 0 and "Docks -> Custom Browser Docks" in res.stdout, res.stdout + res.stderr
    assert "error:" in res.stderr


def test_a_panel_that_cannot_start_says_so(tmp_path):
    from vcam.panel.server import PanelServer

    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("not a key")
    srv = PanelServer(
        Backend(tmp_path),
        token=new_token(),
        host="0.0.0.0",
        port=0,
        tls_cert=str(tmp_path / "cert.pem"),
        tls_key=str(tmp_path / "key.pem"),
    )
    with pytest.raises(ConfigError, match=r"the panel did not start"):
        srv.start()
    with socket.socket() as s:  # the port was let go
        s.bind(("0.0.0.0", srv.port))


def _held_port(port: int) -> socket.socket | None:
    """A socket listening on 127.0.0.1:``port``, or None when something else already does."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    s.listen(1)
    return s


def test_the_default_port_taken_the_panel_says_which_it_took():
    """Another vcam's panel on 8765 (held here, or by a real one): a second run serves its own on a
    free port and says which in one line; a port the user chose is not moved (the panel stays off)."""
    from conftest import demo_run

    from vcam.config import PanelConfig

    default = PanelConfig().port
    held = _held_port(default)
    try:
        res = vcam_cli(*[a for a in demo_run("--panel", str(default)) if a != "--quiet"])
    finally:
        if held is not None:
            held.close()
    assert res.returncode == 0, res.stderr
    moved = [ln for ln in res.stderr.splitlines() if f"port {default} is in use" in ln]
    assert len(moved) == 1, res.stderr
    port = int(moved[0].rsplit("on port ", 1)[1])
    assert port != default and f"panel: http://127.0.0.1:{port}/#once=" in res.stderr
    with socket.socket() as s:  # a port of the user's choice, taken
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        chosen = s.getsockname()[1]
        res = vcam_cli(*[a for a in demo_run("--panel", str(chosen)) if a != "--quiet"])
    assert res.returncode == 0, res.stderr
    assert f"panel disabled: the panel cannot listen on 127.0.0.1:{chosen}" in res.stderr and "panel: http" not in res.stderr


def test_vcam_panel_prints_a_live_daemons_url_from_its_private_panel_file(tmp_path):
    """A live daemon (an output of the test's: the daemon cannot tell it from a camera) writes its
    panel file, private, and `vcam panel` prints the URL from it while the daemon runs."""
    import threading

    from obs_harness import CapturingOutput, demo_daemon_config

    from vcam import config_file
    from vcam.panel.access import read_panel_file
    from vcam.runtime.daemon import Daemon

    sock = tmp_path / "run" / "vcam.sock"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f"[panel]\nport = 0\n[control]\nsocket = '{sock}'\n")
    live = demo_daemon_config(sock).replace(panel=config_file.load(cfg).panel)
    lines: list[str] = []
    d = Daemon(live, output=CapturingOutput(), panel=True, announce=lines.append)
    t = threading.Thread(target=d.run, kwargs={"duration": 120}, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not [ln for ln in lines if ln.startswith("panel: ")]:
            time.sleep(0.05)
        urls = [ln.split("panel: ", 1)[1].strip() for ln in lines if ln.startswith("panel: ")]
        assert urls, lines
        kept = read_panel_file(live.panel_file)
        assert kept is not None and kept["token"] not in urls[0] and urls[0].startswith(kept["url"] + "#once=")
        if not WINDOWS:
            assert live.panel_file.stat().st_mode & 0o777 == 0o600
        res = vcam_cli("panel", "--config", str(cfg), timeout=60)
        fresh = res.stdout.strip()  # a fresh link each time: another one-time code, never the token
        assert res.returncode == 0 and fresh.startswith(kept["url"] + "#once=") and fresh != urls[0], res.stderr
        codes = OnceCodes(kept["token"])
        assert codes.redeem(urls[0].split("#once=")[1], time.time()) is None
        assert codes.redeem(fresh.split("#once=")[1], time.time()) is None and kept["token"] not in res.stdout
    finally:
        d.request_stop()
        t.join(30)
    assert not t.is_alive()


def test_the_desk_settings_are_offered_and_changed_through_the_command_path(served):
    """The page gets the table of controls and, per stream, the settings this run offers; each
    offered setting changes over ``/api/command`` (the path of `vcam ctl`), a bad value or one the
    run does not offer is a 400 with the fix."""
    from vcam.control.commands import SETTINGS

    token = {"X-Vcam-Token": served.token, "Content-Type": "application/json"}
    header = {"X-Vcam-Token": served.token}  # what the page's script adds (never a cookie)
    state = served.backend.states["s1"]
    page = call(served, "/", headers=header)[2].decode()
    assert 'id="controls"' in page
    shown = json.loads(call(served, "/api/state", headers=header)[2])
    assert [c["key"] for c in shown["controls"]] == [s.key for s in SETTINGS]
    assert shown["streams"][0]["settings"] == {}
    for s in SETTINGS:
        on = {"switch": "toggle", "amount": 0.5, "choice": 1}[s.kind]
        status, _, body = call(served, "/api/command", method="POST", body=json.dumps({s.key: on}).encode(), headers=token)
        assert status == 400 and json.loads(body)["hint"] == s.hint
        if s.kind == "choice":  # the values the run lists (the cameras), shown to the page
            state.offer(s.key, 0, choices=lambda refresh: [(0, "cam a"), (1, "cam b")])
        else:
            state.offer(s.key, False if s.kind == "switch" else 1.0)
        status, _, body = call(served, "/api/command", method="POST", body=json.dumps({s.key: on}).encode(), headers=token)
        want = {"switch": True, "amount": 0.5, "choice": 1}[s.kind]
        assert status == 200 and json.loads(body)["settings"][s.key] == want and state.settings[s.key] == want
        status, _, body = call(served, "/api/command", method="POST", body=json.dumps({s.key: 7}).encode(), headers=token)
        assert status == 400 and state.settings[s.key] == want
    shown = json.loads(call(served, "/api/state", headers=header)[2])["streams"][0]
    assert shown["settings"] == state.settings and shown["choices"] == {"camera": [[0, "cam a"], [1, "cam b"]]}


def test_an_upload_passes_pick_for_a_group_photo_and_refuses_a_bad_one(served):
    """Issue 40: `POST /api/faces?...&pick=K` is `vcam faces add --pick K` (face K of a group
    photo, from the left); a pick that is no face number is one error naming the form."""
    headers = {"X-Vcam-Token": served.token}
    status, _, body = call(served, "/api/faces?filename=g.jpg&pick=first", method="POST", body=b"x", headers=headers)
    assert status == 400 and b"is not a face number" in body and b"pick=K" in body
    status, _, body = call(served, "/api/faces?filename=g.jpg&pick=2", method="POST", body=b"x", headers=headers)
    assert b"not here" in body and served.backend.picked == 2


def test_errors_reach_the_page_in_its_own_words():
    """Issue 41: a hint naming a command or flag is for the CLI; the panel's commands and uploads
    carry the page's wording instead (the CLI's own replies keep theirs)."""
    from vcam.control.local import handle_command
    from vcam.errors import FaceError
    from vcam.panel.server import _upload_error
    from vcam.stages.faces import choose_face
    from vcam.types import Detection

    empty = RuntimeState({})
    assert "`vcam faces add PHOTO`" in handle_command(empty, {"face": "grace"})["hint"]
    assert handle_command(empty, {"face": "grace"}, page=True)["hint"] == "add a photo below"
    two = [Detection(np.array([x, 0, x + 50, 50], np.float32), np.zeros((5, 2), np.float32), 0.9) for x in (100, 0)]
    for pick in (None, 3):
        with pytest.raises(FaceError, match="--pick") as info:
            choose_face(two, "/tmp/vcam-upload-x/group.jpg", pick)
        reply = _upload_error(info.value, Path("/tmp/vcam-upload-x/group.jpg"), "group.jpg")
        assert reply["error"] == "2 faces found in group.jpg" and "--" not in reply["hint"], reply
        assert [f["box"][0] for f in reply["faces"]] == [0.0, 100.0]  # left to right, for the page's picker


def test_before_after_keeps_input_frames_only_shortly_before_a_preview_frame_is_due():
    """The frame loop keeps an input frame for before/after only when the next preview frame is due
    within the frames' time in flight (a few frames a second, not every frame); the published frame
    of a kept number is taken with its before frame; one whose input was not kept (kept too late)
    waits for a later frame, and the lead grows."""
    from vcam.panel.preview import MIN_LEAD
    from vcam.types import PixelFormat

    tap = PreviewTap(fps=5)  # no encoder thread: the jobs are looked at as the frame loop leaves them
    frame = np.zeros((48, 64, 3), np.uint8)
    assert not tap.wants_before("s1")  # nobody watches
    tap.watch("s1")
    assert tap.wants_before("s1")  # a preview frame is due now
    tap.keep_before("s1", 1, frame, PixelFormat.BGR)
    tap.offer("s1", frame, PixelFormat.BGR, seq=1)
    assert tap._job is not None and tap._job[5] is not None and tap._job[5][0] == 1
    assert tap._lead["s1"] == MIN_LEAD  # frame 1 was published right after it was kept
    tap._job, tap._busy = None, False
    assert not tap.wants_before("s1")  # the next one is due in 0.2 s: frames begun now are not kept
    tap._next["s1"] = time.perf_counter()  # due now
    assert tap.wants_before("s1")
    tap.keep_before("s1", 5, frame, PixelFormat.BGR)
    offered = tap.offered
    tap.offer("s1", frame, PixelFormat.BGR, seq=4)  # its input was begun before the lead: not kept
    assert tap._job is None and tap.offered == offered and tap._lead["s1"] == 2 * MIN_LEAD
    tap.offer("s1", frame, PixelFormat.BGR, seq=5)  # the next frame, kept
    assert tap._job is not None and tap._job[5][0] == 5 and tap.offered == offered + 1
    tap._job, tap._busy = None, False
    tap._next["s1"] = 0.0
    tap.offer("s1", frame, PixelFormat.BGR, seq=-1)  # a card (no input frame): taken alone at once
    assert tap._job is not None and tap._job[5] is None


@pytest.mark.slow
def test_the_panel_benchmark_reads_the_preview_and_the_state_through_the_printed_link(tmp_path):
    """`python -m benchmarks.panel` (the panel's cost, issue 31/42) trades the daemon's printed
    one-time link for the token, as a page does, and its reader gets preview frames and pushed
    states (it broke silently once when the printed link stopped carrying the token)."""
    from benchmarks import panel as bench

    res = bench.main(["--seconds", "2", "--rounds", "1", "--json", str(tmp_path / "panel.json")])
    summary = res["summary"]
    assert summary["on"]["preview_frames"] > 0 and summary["on"]["pushed_states"] > 0, summary["on"]
    assert summary["off"]["preview_frames"] == summary["off"]["pushed_states"] == 0
    assert summary["on"]["fps"] > 0 and (tmp_path / "panel.json").is_file()
