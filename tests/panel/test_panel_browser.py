"""The control panel in a real browser (headless Chromium through Selenium) against a real
``vcam run --input demo`` in its own process.

The daemon writes what it publishes to a video file; the face switched by a click, the person mapped
from the page and the face of the first frames are checked in those published frames once the run
has stopped: each change's reply says how many frames had been published when it took effect
(``published``), so "within 2 frames" is counted in frames, not guessed from the clock.

Screenshots of each state go to a temporary folder (the path is printed); with ``VCAM_SCREENSHOTS``
set to a folder, the dock-width and full-width ones are copied there too (docs/img for the README).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import require, terminal_signals

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ASSETS = Path(__file__).resolve().parents[2] / "vcam" / "assets"
COLOURS = {"alice": (0, 0, 255), "bob": (255, 0, 0), "carol": (0, 200, 0)}  # BGR, one solid colour per face


def colour_pixels(frame: np.ndarray, name: str) -> int:
    want = np.array(COLOURS[name], np.int16)
    return int((np.abs(frame.astype(np.int16) - want).max(axis=2) < 45).sum())


def solid_bank_face(root: Path, name: str) -> None:
    """A face-bank folder whose stored crop is one solid colour (the pasted face shows it in frames)."""
    from vcam.align import TEMPLATES

    folder = root / name
    folder.mkdir(parents=True)
    img = np.empty((128, 128, 3), np.uint8)
    img[...] = COLOURS[name]
    cv2.imwrite(str(folder / "photo.png"), img)
    cv2.imwrite(str(folder / "crop_arcface_128.png"), img)
    lms = (TEMPLATES["arcface_128"] * 128).astype(float).tolist()
    meta = {"name": name, "photo": "photo.png", "sha256": f"{name:0<64}", "landmarks": lms, "box": [0, 0, 128, 128]}
    (folder / "meta.json").write_text(json.dumps(meta))


def browser(width: int = 1280, height: int = 900, *args: str):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        require("chromium", f"selenium is not installed ({exc}); pip install selenium")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        require("chromium", "apt-get install chromium chromium-driver")
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", *args):
        opts.add_argument(a)
    opts.binary_location = CHROMIUM
    d = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    d.set_window_size(width, height)
    return d


def wait_for(fn, timeout: float, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            value = fn()
        except Exception:  # the page is still rendering
            value = None
        if value:
            return value
        time.sleep(step)
    return None


class Run:
    """``vcam run`` in its own process, and what the tests learnt from it."""

    def __init__(self, proc: subprocess.Popen, url: str, out: Path, shots: Path, log: Path) -> None:
        self.proc, self.url, self.out, self.shots, self.log = proc, url, out, shots, log
        self.base, self.token = url.split("/?token=")
        self.port = int(self.base.rsplit(":", 1)[1])
        self.checks: list[tuple[int, str]] = []  # (frames published when a change took effect, face from then on)

    def request(self, path: str, *, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as res:
                return res.status, res.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def api(self, path: str):
        status, body = self.request(path, headers={"X-Vcam-Token": self.token})
        assert status == 200, body
        return json.loads(body)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    browser(320, 400).quit()  # skips (or, in CI, fails) here when there is no browser
    from vcam.models import registry, standin
    from vcam.models.download import crc32_text
    from vcam.stages.detect import RetinaFaceDetector
    from vcam.stages.faces import FaceBank

    tmp = tmp_path_factory.mktemp("panel")
    shots = tmp_path_factory.mktemp("panel-screenshots")
    faces, models = tmp / "faces", tmp / "models"
    for name in COLOURS:
        solid_bank_face(faces, name)
    FaceBank(faces).add(ASSETS / "astronaut.jpg", "astronaut", detector=RetinaFaceDetector())
    models.mkdir()
    p = standin.write("arcface_w600k_r50", models, tiny=True)
    (models / registry.get("arcface_w600k_r50").hash_file).write_text(crc32_text(p.read_bytes()))
    out = tmp / "published.mkv"
    (tmp / "run").mkdir(mode=0o700)
    cfg = tmp / "config.toml"
    cfg.write_text(
        f"""
[capture]
input = "demo"
width = 320
height = 240
pacing = "realtime"
[pipeline]
device = "cpu"
backend = "onnxruntime"
max_latency = 0
early_frames = "off"
[swap]
swapper = "classic"
color_match = false
source = "alice"
unmatched = "active"
map_threshold = 0.5
map = [{{ target = "astronaut", source = "bob" }}]
[output]
target = 'file:{out}'
[faces]
dir = '{faces}'
[models]
dir = '{models}'
[control]
socket = '{tmp / "run" / "vcam.sock"}'
[panel]
port = 0
"""
    )
    log = tmp / "vcam.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vcam", "run", "--config", str(cfg)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            preexec_fn=terminal_signals,
        )
    url = wait_for(lambda: next((ln.split("panel: ", 1)[1] for ln in log.read_text().splitlines() if "panel: " in ln), None), 120)
    assert url, log.read_text()
    r = Run(proc, url.strip(), out, shots, log)
    print(f"panel screenshots in {shots}")
    try:
        yield r
    finally:
        r.stop()


def loaded(run: Run, width: int = 1280, height: int = 900, *args: str):
    """A browser showing the panel (entered through the URL with the token) with a state pushed."""
    d = browser(width, height, *args)
    d.get(run.url)
    assert wait_for(lambda: d.execute_script("return window.vcamPanel && window.vcamPanel.updates"), 20), d.page_source[:500]
    return d


def shot(run: Run, d, name: str) -> Path:
    path = run.shots / f"{name}.png"
    d.save_screenshot(str(path))
    return path


# --- who may use it ---------------------------------------------------------------------------------


def test_the_panel_refuses_requests_without_the_token(run):
    status, body = run.request("/")
    assert status == 401 and b"unauthorized" in body
    assert run.request("/?token=wrong")[0] == 401
    assert run.request("/api/state")[0] == 401
    status, _ = run.request("/api/command", method="POST", body=b'{"face": "bob"}')
    assert status == 403
    d = browser(800, 600)
    try:
        d.get(run.base + "/")
        assert "unauthorized" in d.find_element("tag name", "body").text
    finally:
        d.quit()


def test_the_url_with_the_token_sets_a_strict_cookie_and_leaves_the_address_bar(run):
    d = loaded(run)
    try:
        assert d.current_url == run.base + "/"  # the token is gone from the address bar and history
        cookie = d.get_cookie(f"vcam_panel_{run.port}")
        assert cookie["sameSite"] == "Strict" and cookie["httpOnly"]
        assert "vcam-token" in d.page_source and "Faces" in d.page_source
    finally:
        d.quit()
    # This run converts to a file (no camera, no virtual camera): its panel is its own, with no panel
    # file for `vcam panel` (a live daemon's file and `vcam panel`: tests/panel/test_panel.py).
    assert not (run.out.parent / "run" / "vcam.sock.panel").exists()


def test_a_foreign_host_name_is_refused_dns_rebinding(run):
    status, body = run.request(f"/?token={run.token}", headers={"Host": f"rebind.test:{run.port}"})
    assert status == 403 and b"forbidden" in body
    # A name the attacker controls, resolving to 127.0.0.1: the browser sends its own Host header.
    d = browser(800, 600, "--host-resolver-rules=MAP rebind.test 127.0.0.1")
    try:
        d.get(f"http://rebind.test:{run.port}/?token={run.token}")
        assert "forbidden" in d.find_element("tag name", "body").text
    finally:
        d.quit()


def test_a_cross_origin_form_post_changes_nothing(run):
    """A page on another origin posts a form to the panel from the browser that holds the panel's
    cookie: refused (no token header, foreign Origin), and the face stays."""
    before = run.api("/api/state")["streams"][0]["face"]
    other = "carol" if before != "carol" else "bob"
    page = (
        f'<form method="post" action="{run.base}/api/command" enctype="text/plain">'
        f'<input name=\'{{"face": "{other}", "x": "\' value=\'"}}\'></form>'
        "<script>document.forms[0].submit()</script>"
    ).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a):
            pass

    evil = http.server.HTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    d = loaded(run, 800, 600)
    try:
        d.get(f"http://localhost:{evil.server_address[1]}/")
        assert wait_for(lambda: "forbidden" in d.find_element("tag name", "body").text, 10), d.page_source[:300]
    finally:
        d.quit()
        evil.shutdown()
    assert run.api("/api/state")["streams"][0]["face"] == before
    # The cookie alone (a same-site request without the header) changes nothing either.
    cookie = {"Cookie": f"vcam_panel_{run.port}={run.token}", "Content-Type": "application/json"}
    assert run.request("/api/command", method="POST", body=b'{"face": "bob"}', headers=cookie)[0] == 403


def test_an_oversized_upload_is_refused_before_it_is_read(run):
    from vcam.stages.photos import MAX_PHOTO_BYTES

    headers = {"X-Vcam-Token": run.token, "Content-Length": str(MAX_PHOTO_BYTES + 1)}
    status, body = run.request("/api/faces?filename=huge.jpg", method="POST", body=b"x", headers=headers)
    assert status == 413 and b"too large" in body


# --- what it does -----------------------------------------------------------------------------------


def test_faces_mapping_preview_and_health_in_the_page(run):
    d = loaded(run, 320, 1400)  # an OBS dock's width
    try:
        faces = wait_for(lambda: d.find_elements("css selector", "#faces .face"), 10)
        names = [f.get_attribute("data-face") for f in faces]
        assert {"alice", "bob", "carol", "astronaut"} <= set(names)
        active = d.find_element("css selector", "#faces .face.active").get_attribute("data-face")
        assert active == "alice"
        thumbs = "return [...document.querySelectorAll('#faces img')].every(i => i.complete && i.naturalWidth > 0)"
        assert wait_for(lambda: d.execute_script(thumbs), 10)
        shot(run, d, "01-dock-faces")

        # Click a face: the same path as `vcam ctl face`; its reply counts the frames published so far.
        d.find_element("css selector", '#faces .face[data-face="bob"] .pick').click()
        reply = wait_for(lambda: d.execute_script("return window.vcamPanel.lastReply"), 10)
        assert reply["ok"] and reply["face"] == "bob", reply
        run.checks.append((reply["published"]["s1"], "bob"))
        assert wait_for(lambda: d.find_element("css selector", "#faces .face.active").get_attribute("data-face") == "bob", 5)

        # The latency updates, pushed.
        first = d.execute_script("return window.vcamPanel.updates")
        assert wait_for(lambda: d.execute_script("return window.vcamPanel.updates") >= first + 2, 10)
        assert wait_for(lambda: float(d.find_element("id", "latency").text.split("/")[1]) > 0, 10)
        assert wait_for(lambda: len(d.execute_script("return window.vcamPanel.state.streams[0].history")) >= 2, 10)

        # A photo with a face: added to the bank and shown.
        d.execute_script("window.vcamPanel.lastReply = null")
        d.find_element("id", "file").send_keys(str(ASSETS / "grace_hopper.jpg"))
        assert wait_for(lambda: "added face grace_hopper" in d.find_element("id", "face-msg").text, 60), d.find_element(
            "id", "face-msg"
        ).text
        assert wait_for(lambda: d.find_elements("css selector", '#faces .face[data-face="grace_hopper"]'), 10)
        assert (run.out.parent / "faces" / "grace_hopper" / "meta.json").is_file()

        # A photo without a face, dropped on the page (a solid crop fetched from the panel): one message.
        d.execute_script(
            """const blob = await (await fetch('/api/faces/carol/thumb')).blob();
            const dt = new DataTransfer(); dt.items.add(new File([blob], 'blank.png', {type: 'image/png'}));
            document.getElementById('drop').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true}));"""
        )
        msg = wait_for(lambda: (t := d.find_element("id", "face-msg").text) and "no face" in t and t, 30)
        assert msg and msg.startswith("no face found in blank.png") and "/tmp" not in msg, msg
        shot(run, d, "02-dock-upload-refused")

        # Remove a face, confirmed in the page.
        d.find_element("css selector", '#faces .face[data-face="grace_hopper"] .remove').click()
        d.find_element("css selector", '#faces .face[data-face="grace_hopper"] .confirm .yes').click()
        assert wait_for(lambda: not d.find_elements("css selector", '#faces .face[data-face="grace_hopper"]'), 10)
        assert not (run.out.parent / "faces" / "grace_hopper").exists()

        # The person in view: map them to carol.
        row = wait_for(lambda: d.find_element("css selector", "#people tr[data-track]"), 20)
        assert row.find_element("css selector", "select").get_attribute("value") == "bob"
        from selenium.webdriver.support.ui import Select

        d.execute_script("window.vcamPanel.lastReply = null")
        Select(row.find_element("css selector", "select")).select_by_value("carol")
        reply = wait_for(lambda: d.execute_script("return window.vcamPanel.lastReply"), 10)
        assert reply["ok"] and "carol" in reply["mappings"].values(), reply
        run.checks.append((reply["published"]["s1"], "carol"))
        assert wait_for(lambda: d.find_elements("css selector", "#mappings tr[data-target^='person-']"), 10)

        # The preview: off until asked, then frames.
        assert d.find_element("id", "preview").get_attribute("src") in (None, "")
        d.find_element("id", "preview-toggle").click()
        assert (
            wait_for(
                lambda: d.execute_script("const i = document.getElementById('preview'); return i.complete && i.naturalWidth"), 15
            )
            == 320
        )
        time.sleep(1.5)  # a few health pushes with the preview on
        shot(run, d, "03-dock-preview")
        d.execute_script("window.scrollTo(0, 0)")
        dock = shot(run, d, "panel-dock")
        d.set_window_size(1400, 900)
        time.sleep(1.0)
        full = shot(run, d, "panel-full")
        target = os.environ.get("VCAM_SCREENSHOTS")
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copy(dock, Path(target) / "panel-dock.png")
            shutil.copy(full, Path(target) / "panel-full.png")
        d.find_element("id", "preview-toggle").click()
        assert d.find_element("id", "preview").get_attribute("src") in (None, "")
    finally:
        d.quit()


def test_the_published_frames_follow_the_panel(run):
    """Stop the run and read what it published: the clicked face from at most 2 frames after the
    click on, then the face mapped to the person."""
    import av

    assert len(run.checks) == 2, "the page test did not get that far"
    run.stop()
    assert run.proc.returncode == 0, run.log.read_text()[-2000:]
    with av.open(str(run.out)) as container:
        frames = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
    (n_bob, _), (n_carol, _) = run.checks
    assert colour_pixels(frames[0], "alice") > 150  # the face it started with
    assert n_bob + 12 < n_carol <= len(frames)
    # Within 2 frames of the click: frame n+1 may have been in flight; from n+2 on it is bob.
    for i in range(n_bob + 1, n_bob + 12):
        assert colour_pixels(frames[i], "bob") > 150 and colour_pixels(frames[i], "alice") < 20, i
    late = frames[n_carol + 2 : n_carol + 12]
    assert late and all(colour_pixels(f, "carol") > 150 and colour_pixels(f, "bob") < 20 for f in late)


def test_several_streams_have_their_rows_and_a_picker(tmp_path):
    """A daemon with two streams (its states served through the panel's own server): one health row
    each, and a face clicked after picking stream b changes stream b only."""
    from test_panel import Backend

    from vcam.panel.access import new_token
    from vcam.panel.server import PanelServer
    from vcam.state import RuntimeState

    backend = Backend(tmp_path)
    first = backend.states["s1"]
    backend.states = {"a": first, "b": RuntimeState({n: first.face(n) for n in first.names}, active="alice")}
    srv = PanelServer(backend, token=new_token(), port=0)
    srv.start()
    d = browser(400, 1000)
    try:
        d.get(srv.url)
        assert wait_for(lambda: d.execute_script("return window.vcamPanel.updates"), 20)
        assert d.find_element("id", "stream").is_displayed()
        assert wait_for(lambda: len(d.find_elements("css selector", "#streams tbody tr")) == 2, 5)
        from selenium.webdriver.support.ui import Select

        Select(d.find_element("id", "stream")).select_by_value("b")
        d.find_element("css selector", '#faces .face[data-face="bob"] .pick').click()
        assert wait_for(lambda: backend.states["b"].active == "bob", 5)
        assert backend.states["a"].active == "alice"
        # the server has switched the face; the page has its reply a moment later
        assert wait_for(lambda: d.execute_script("return window.vcamPanel.lastReply"), 5)
        reply = d.execute_script("return window.vcamPanel.lastReply")
        assert reply["stream"] == "b" and reply["published"] == {"a": 7, "b": 7}
        # The pause button pauses the stream picked, and says so; clicked again, it resumes.
        assert d.find_element("id", "pause").text == "pause"
        d.find_element("id", "pause").click()
        assert wait_for(lambda: backend.states["b"].paused, 5) and not backend.states["a"].paused
        assert wait_for(lambda: d.find_element("id", "pause").text == "resume", 5)
        assert "paused" in d.find_element("id", "pause").get_attribute("class")
        d.find_element("id", "pause").click()
        assert wait_for(lambda: not backend.states["b"].paused, 5)
        assert wait_for(lambda: d.find_element("id", "pause").text == "pause", 5)
    finally:
        d.quit()
        srv.stop()


def test_the_desk_controls_follow_the_settings_offered(tmp_path):
    """A switch per offered switch setting (clicked: toggled, the label says so) and a slider per
    amount (moved: the amount posted); settings the run does not offer are not drawn."""
    from test_panel import Backend

    from vcam.control.commands import SETTINGS
    from vcam.panel.access import new_token
    from vcam.panel.server import PanelServer

    backend = Backend(tmp_path)
    state = backend.states["s1"]
    srv = PanelServer(backend, token=new_token(), port=0)
    srv.start()
    d = browser(400, 1000)
    try:
        d.get(srv.url)
        assert wait_for(lambda: d.execute_script("return window.vcamPanel.updates"), 20)
        assert not d.find_element("id", "controls-section").is_displayed()  # nothing offered yet
        for s in SETTINGS:
            state.offer(s.key, True if s.kind == "switch" else 0.8)
        assert wait_for(lambda: len(d.find_elements("css selector", "#controls [id^='set-']")) == len(SETTINGS), 5)
        for s in SETTINGS:
            e = d.find_element("id", f"set-{s.key}")
            if s.kind == "switch":
                assert e.text == f"{s.label} on"
                e.click()
                assert wait_for(lambda s=s: state.settings[s.key] is False, 5)
                assert wait_for(lambda s=s, e=e: e.text == f"{s.label} off", 5)
            else:
                d.execute_script("arguments[0].value = '0.35'; arguments[0].dispatchEvent(new Event('change'))", e)
                assert wait_for(lambda s=s: state.settings[s.key] == 0.35, 5)
    finally:
        d.quit()
        srv.stop()
