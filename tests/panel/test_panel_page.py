"""The panel's page in headless Chromium against the panel's own server in this process (a daemon's
states, a face bank in a temporary folder, faces found by a stand-in detector): the keyboard alone
adds, switches and removes a face with focus kept; the token stays out of the tab's history; a group
photo gets a picker and no command-line hint; the sparkline draws fps out.

Key presses go through chromedriver (CDP ``Input.dispatchKeyEvent``); the file chooser a key opens
is caught over a CDP connection of the test's own (``Page.setInterceptFileChooserDialog``) and
answered with ``DOM.setFileInputFiles``, as a user picking the file would.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
from test_panel import Backend
from test_panel_browser import browser, wait_for

from vcam.panel.access import ONCE_TTL, new_token, once_url
from vcam.panel.server import PanelServer
from vcam.state import Status
from vcam.types import Detection, SourceFace

pytestmark = pytest.mark.slow


class Detector:
    """One face in the middle of a photo; two, side by side, in a photo twice as wide as high."""

    def detect(self, img: np.ndarray) -> list[Detection]:
        from vcam.align import TEMPLATES

        h, w = img.shape[:2]
        halves = [(0, w // 2), (w // 2, w)] if w >= 2 * h else [(0, w)]
        out = []
        for x0, x1 in halves:
            side = min(x1 - x0, h) * 0.6
            cx, cy = (x0 + x1) / 2, h / 2
            box = np.array([cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2], np.float32)
            lms = (TEMPLATES["arcface_128"] * side + box[:2]).astype(np.float32)
            out.append(Detection(box=box, landmarks=lms, score=0.9))
        return out


class BankBackend(Backend):
    """The test_panel Backend with a real face bank: faces added (as `vcam faces add`, the
    stand-in detector finding them) and removed."""

    def add_face(self, photo, name, pick=None):
        from vcam.stages.faces import FaceBank

        entry = FaceBank(self.faces_dir).add(photo, name, pick, detector=Detector())
        for state in self.states.values():
            state.add_face(SourceFace(entry.name, np.zeros((128, 128, 3), np.uint8)), activate=False)
        return entry.name

    def remove_face(self, name):
        from vcam.stages.faces import FaceBank

        FaceBank(self.faces_dir).remove(name)
        for state in self.states.values():
            state.remove_face(name)


class Cdp:
    """A CDP connection of the test's own to the browser's page (events read as they come)."""

    def __init__(self, d, url_start: str) -> None:
        import websocket

        addr = d.capabilities["goog:chromeOptions"]["debuggerAddress"]
        targets = json.loads(urllib.request.urlopen(f"http://{addr}/json", timeout=10).read())
        page = next(t for t in targets if t["type"] == "page" and t["url"].startswith(url_start))
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.n, self.events = 0, []

    def call(self, method: str, params: dict | None = None) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params or {}}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]
            self.events.append(msg)

    def event(self, name: str, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for i, msg in enumerate(self.events):
                if msg.get("method") == name:
                    return self.events.pop(i)["params"]
            self.ws.settimeout(max(0.05, end - time.monotonic()))
            try:
                self.events.append(json.loads(self.ws.recv()))
            except Exception:  # the timeout
                pass
        return None

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def served(tmp_path):
    backend = BankBackend(tmp_path / "faces")
    srv = PanelServer(backend, token=new_token(), port=0)
    srv.start()
    yield srv
    srv.stop()


def photo(path: Path, width: int, height: int) -> Path:
    img = np.full((height, width, 3), 90, np.uint8)
    for x in range(0, width, height):  # a coloured block per face (the picker draws them)
        img[height // 4 : 3 * height // 4, x + height // 4 : x + 3 * height // 4] = (40 + x // 4, 160, 220)  # BGR
    cv2.imwrite(str(path), img)
    return path


def keys(d, *pressed) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(d).send_keys(*pressed).perform()


def shift_tab(d) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(d).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()


def focused(d) -> dict:
    """What has focus: its id, class, the face of its tile, and whether it is the page's body."""
    return d.execute_script(
        """const a = document.activeElement; const t = a && a.closest('.face');
        return {id: a.id, cls: a.className, face: t ? t.dataset.face : null, body: a === document.body,
                label: a.getAttribute('aria-label'), table: a.closest('table') ? a.closest('table').id : null};"""
    )


def tab_to(d, test, back: bool = False, most: int = 40) -> dict:
    """Tab (Shift+Tab with ``back``) until ``test(focused)``; what has focus then."""
    from selenium.webdriver.common.keys import Keys

    for _ in range(most):
        now = focused(d)
        if test(now):
            return now
        if back:
            shift_tab(d)
        else:
            keys(d, Keys.TAB)
    raise AssertionError(f"never reached by keyboard; focus on {focused(d)}")


def opened(srv: PanelServer, width: int, height: int):
    d = browser(width, height)
    d.get(srv.url)
    assert wait_for(lambda: d.execute_script("return window.vcamPanel && window.vcamPanel.updates"), 20)
    return d


def test_add_switch_and_remove_a_face_by_keyboard_alone_with_focus_kept(served, tmp_path):
    from selenium.webdriver.common.keys import Keys

    backend = served.backend
    d = opened(served, 320, 900)
    cdp = Cdp(d, served.base_url)
    try:
        cdp.call("Page.enable")
        cdp.call("DOM.enable")
        cdp.call("Page.setInterceptFileChooserDialog", {"enabled": True})
        d.execute_script("document.activeElement.blur()")
        # Add: Tab to the name field, type it, Shift+Tab to "choose…", Enter: the file chooser opens.
        tab_to(d, lambda f: f["id"] == "face-name")
        keys(d, "keyed")
        tab_to(d, lambda f: f["id"] == "choose", back=True)
        keys(d, Keys.ENTER)
        chooser = cdp.event("Page.fileChooserOpened", 10)
        assert chooser and chooser["mode"] == "selectSingle", chooser
        pic = photo(tmp_path / "portrait.png", 200, 200)
        cdp.call("DOM.setFileInputFiles", {"files": [str(pic)], "backendNodeId": chooser["backendNodeId"]})
        msg = lambda: d.find_element("id", "face-msg").text  # noqa: E731
        assert wait_for(lambda: "added face keyed" in msg(), 20), msg()
        assert (backend.faces_dir / "keyed" / "meta.json").is_file()
        # focus on the new face's tile, not lost to the page
        assert wait_for(lambda: (focused(d)["face"], focused(d)["cls"]) == ("keyed", "pick"), 10), focused(d)

        # Switch: Shift+Tab to bob's tile, Enter; focus stays on it through the rebuild.
        tab_to(d, lambda f: f["face"] == "bob" and f["cls"] == "pick", back=True)
        keys(d, Keys.ENTER)
        assert wait_for(lambda: backend.states["s1"].active == "bob", 10)
        assert wait_for(lambda: "bob" in d.find_element("css selector", "#faces .face.active").get_attribute("data-face"), 10)
        time.sleep(1.2)  # a pushed state or two later
        assert focused(d)["face"] == "bob" and focused(d)["cls"] == "pick", focused(d)

        # Remove: Tab to keyed's ×, Enter: asked, focus on "no"; Escape keeps it, focus back on ×.
        tab_to(d, lambda f: f["face"] == "keyed" and f["cls"] == "remove")
        keys(d, Keys.ENTER)
        assert wait_for(lambda: focused(d)["cls"] == "no" and focused(d)["face"] == "keyed", 5), focused(d)
        keys(d, Keys.ESCAPE)
        assert wait_for(lambda: focused(d)["cls"] == "remove" and focused(d)["face"] == "keyed", 5), focused(d)
        assert (backend.faces_dir / "keyed").is_dir()
        keys(d, Keys.ENTER)
        assert wait_for(lambda: focused(d)["cls"] == "no", 5), focused(d)
        shift_tab(d)
        assert focused(d)["cls"] == "yes", focused(d)
        keys(d, Keys.ENTER)
        assert wait_for(lambda: not (backend.faces_dir / "keyed").exists(), 10)
        assert wait_for(lambda: not d.find_elements("css selector", '#faces .face[data-face="keyed"]'), 10)
        time.sleep(1.2)
        # focus on the face before it (keyed was the last), not on the page
        assert focused(d)["face"] == "bob" and focused(d)["cls"] == "pick", focused(d)
    finally:
        cdp.close()
        d.quit()


def test_the_token_is_in_no_entry_of_the_tabs_history(served):
    """A printed link (``#once=``) is replaced by a new load of ``/``: no entry of the tab's history
    holds the token, neither its URL nor the URL as typed; the URL of older runs (?token=) too."""
    token = served.token
    d = opened(served, 800, 600)
    try:
        for url in (served.url, f"{served.base_url}/?token={token}"):
            d.get(url)
            assert wait_for(lambda: d.execute_script("return window.vcamPanel && window.vcamPanel.updates"), 20)
            assert d.current_url == served.base_url + "/"
            history = d.execute_cdp_cmd("Page.getNavigationHistory", {})["entries"]
            assert any(e["url"] == served.base_url + "/" for e in history), history
            assert all(token not in e["url"] and token not in e.get("userTypedURL", "") for e in history), history
        d.back()  # back to the page of the first URL: the tab's storage still has the token, the page works
        assert wait_for(lambda: d.execute_script("return window.vcamPanel && window.vcamPanel.updates"), 20)
        assert token not in d.current_url
    finally:
        d.quit()


def _visited(profile: Path) -> list[str]:
    """The addresses in the browser profile's list of visited sites (Chromium's History database)."""
    import shutil
    import sqlite3

    shutil.copy(profile / "Default" / "History", profile / "History.copy")  # the browser may hold a lock
    with sqlite3.connect(profile / "History.copy") as db:
        return [row[0] for row in db.execute("SELECT url FROM urls")]


def test_a_printed_link_opens_the_panel_once_and_the_token_is_in_no_history(served, tmp_path):
    """What vcam prints (``served.url``: a one-time code, never the token) opens the panel once. The
    browser's list of visited sites (its History database, which no page can change), the tab's
    history and the page's URL never hold the token; the same link in another tab (someone who read
    that list) is refused in the page's words, saying how to get a new link; an expired one too."""
    token, link = served.token, served.url
    assert token not in link and "#once=" in link
    profile = tmp_path / "profile"
    d = browser(800, 600, f"--user-data-dir={profile}")
    try:
        d.get(link)
        assert wait_for(lambda: d.execute_script("return window.vcamPanel && window.vcamPanel.updates"), 20)
        assert d.current_url == served.base_url + "/"
        assert d.execute_script("return sessionStorage.getItem('vcam-token')") == token  # traded for the code
        assert d.execute_script("return sessionStorage.getItem('vcam-once')") is None
        history = d.execute_cdp_cmd("Page.getNavigationHistory", {})["entries"]
        assert all("once=" not in e["url"] + e.get("userTypedURL", "") for e in history), history
        d.switch_to.new_window("tab")  # a tab of its own (its storage empty): the link a second time
        d.get(link)
        banner = lambda: d.find_element("id", "banner").text  # noqa: E731
        assert wait_for(lambda: "already used" in banner(), 20), banner()
        assert "`vcam panel` for a fresh link" in banner() and d.current_url == served.base_url + "/"
        assert "stale" in d.find_element("tag name", "body").get_attribute("class")  # the rest greyed
        assert not d.execute_script("return window.vcamPanel.updates || sessionStorage.getItem('vcam-token')")
        d.get(once_url(served.base_url, token, time.time() - ONCE_TTL - 5))
        assert wait_for(lambda: "expired" in banner(), 20) and "`vcam panel`" in banner(), banner()
        assert not d.execute_script("return window.vcamPanel.updates")
        d.get(served.url)  # a fresh link in that tab: the panel
        assert wait_for(lambda: d.execute_script("return window.vcamPanel && window.vcamPanel.updates"), 20)
        d.get("about:blank")  # the history is written to disk on a new visit
        visited = wait_for(lambda: [u for u in _visited(profile) if served.base_url in u], 20)
        assert visited and any("#once=" in u for u in visited), visited
        assert all(token not in u for u in _visited(profile)), visited
    finally:
        d.quit()
    assert all(token not in u for u in _visited(profile))


def test_a_page_reloaded_with_an_earlier_runs_pass_says_so_in_its_words(served):
    """A tab reloaded with the token of an earlier run in its storage (vcam restarted, the page
    reloaded before it followed): no plain-text 401, the page itself says what to do."""
    d = opened(served, 320, 700)
    try:
        d.execute_script("sessionStorage.setItem('vcam-token', arguments[0])", new_token())
        d.refresh()
        banner = lambda: d.find_element("id", "banner").text  # noqa: E731
        assert wait_for(lambda: "from an earlier run of vcam" in banner(), 20), d.page_source[:300]
        assert "fresh link from `vcam panel`" in banner() and not d.execute_script("return window.vcamPanel.updates")
    finally:
        d.quit()


def test_with_keep_token_a_dock_reloaded_by_obs_reconnects_without_a_fresh_link(tmp_path):
    """[panel] keep_token: the page keeps the pairing key in its origin's storage. A dock that OBS
    loads again (its stored link long used) after vcam restarted with a new token proves the key,
    after the server proved it, and is live. With keep_token off the page drops the key (at its next
    connection), and the old link is refused in the page's words."""
    backend = BankBackend(tmp_path / "faces")
    key = new_token()
    srv = PanelServer(backend, token=new_token(), port=0, pairing_key=key, remember=True)
    srv.start()
    servers, port, link, profile = [srv], srv.port, srv.url, tmp_path / "profile"
    live = "return window.vcamPanel && window.vcamPanel.updates"
    try:
        d = browser(320, 700, f"--user-data-dir={profile}")  # OBS with the dock, its link pasted
        try:
            d.get(link)
            assert wait_for(lambda: d.execute_script("return localStorage.getItem('vcam-pairing')"), 20) == key
        finally:
            d.quit()  # OBS quits
        srv.stop()
        srv = PanelServer(backend, token=new_token(), port=port, pairing_key=key, remember=True)  # `vcam run` again
        srv.start()
        servers.append(srv)
        d = browser(320, 700, f"--user-data-dir={profile}")  # OBS starts: the dock loads its stored link
        try:
            d.get(link)
            assert wait_for(lambda: d.execute_script(live + " && window.vcamPanel.resumed"), 20)
            assert d.execute_script("return sessionStorage.getItem('vcam-token')") == srv.token
            assert d.current_url == srv.base_url + "/" and not d.find_element("id", "banner").is_displayed()
        finally:
            d.quit()
        srv.stop()
        srv = PanelServer(backend, token=new_token(), port=port, pairing_key=key)  # keep_token off again
        srv.start()
        servers.append(srv)
        d = browser(320, 700, f"--user-data-dir={profile}")
        try:
            d.get(link)
            assert wait_for(lambda: d.execute_script(live), 20)
            assert wait_for(lambda: d.execute_script("return localStorage.getItem('vcam-pairing') === null"), 20)
            d.switch_to.new_window("tab")
            d.get(link)
            banner = lambda: d.find_element("id", "banner").text  # noqa: E731
            assert wait_for(lambda: "not for this run of vcam" in banner(), 20), banner()  # the first run's link
            assert not d.execute_script(live)
        finally:
            d.quit()
    finally:
        for server in servers:
            server.stop()


def test_a_group_photo_gets_a_picker_and_errors_are_in_the_pages_words(served, tmp_path):
    from selenium.webdriver.common.keys import Keys

    d = opened(served, 320, 900)
    try:
        group = photo(tmp_path / "group.png", 400, 200)
        d.find_element("id", "file").send_keys(str(group))
        buttons = wait_for(lambda: d.find_elements("css selector", "#picker .pick-face"), 20)
        assert [b.get_attribute("data-pick") for b in buttons] == ["1", "2"]
        msg = d.find_element("id", "face-msg").text
        assert msg.startswith("2 faces found in group.png") and "--pick" not in msg and "`" not in msg, msg
        drawn = """return [...document.querySelectorAll('#picker img')].map((i) => {
            const c = document.createElement('canvas'); c.width = c.height = 64; const g = c.getContext('2d');
            g.drawImage(i, 0, 0); return [...g.getImageData(32, 32, 1, 1).data].slice(0, 3); })"""
        centres = np.array(d.execute_script(drawn))  # each face cut from the photo: its own block's colour
        assert centres.shape == (2, 3) and np.abs(centres - [[220, 160, 40], [220, 160, 90]]).max() <= 12, centres
        assert focused(d)["cls"] == "pick-face"  # the first face, focused
        assert d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")  # 320 px
        keys(d, Keys.TAB, Keys.ENTER)  # the second face, by keyboard
        assert wait_for(lambda: "added face group" in d.find_element("id", "face-msg").text, 20)
        meta = json.loads((served.backend.faces_dir / "group" / "meta.json").read_text())
        assert meta["pick"] == 2 and meta["box"][0] >= 200  # the right-hand face
        assert not d.find_element("id", "picker").is_displayed()
        # The same photo again: named as the face that exists now (refused before it is read); the
        # page's wording, no command.
        d.find_element("id", "file").send_keys(str(group))
        assert wait_for(lambda: "already exists" in d.find_element("id", "face-msg").text, 20)
        msg = d.find_element("id", "face-msg").text
        assert "× on its tile" in msg and "vcam faces" not in msg and "--" not in msg, msg
        # A face no run can switch to: its hint in the page's words too.
        reply = d.execute_async_script(
            """const done = arguments[0];
            fetch('/api/command', {method: 'POST', headers: {'X-Vcam-Token': window.vcamPanel.token,
              'Content-Type': 'application/json'}, body: JSON.stringify({face: 'nobody'})}).then(r => r.json()).then(done);"""
        )
        assert reply["ok"] is False and "`" not in reply["hint"], reply
    finally:
        d.quit()


def test_the_sparkline_draws_fps_out_with_a_legend(served):
    state = served.backend.states["s1"]
    d = opened(served, 800, 700)
    try:
        for fps in (30.0, 24.0, 30.0):  # a second each: one history point a second
            state.publish_status(Status(fps_out=fps, latency_p50_ms=20.0, latency_p99_ms=40.0))
            time.sleep(1.1)
        n = lambda: len(d.find_element("id", "spark-fps").get_attribute("points").split())  # noqa: E731
        assert wait_for(lambda: n() >= 3, 10), d.find_element("id", "spark-fps").get_attribute("points")
        ys = [float(p.split(",")[1]) for p in d.find_element("id", "spark-fps").get_attribute("points").split()]
        assert min(ys) < 3 and max(ys) > min(ys)  # 30 fps at the top, the dip below it
        legend = d.find_element("css selector", ".legend .fps")
        assert legend.is_displayed() and legend.text == "fps out"
        assert "max 30.0" in d.find_element("id", "spark-fps-max").text
    finally:
        d.quit()


class PeopleBackend(Backend):
    """Two people in view, tom and ann, mapping on (a target loader): what the page maps, mapped."""

    TRACKS = {1: "tom", 2: "ann"}

    def __init__(self, faces_dir: Path) -> None:
        super().__init__(faces_dir)
        emb = {"arcface": np.ones(512, np.float32)}
        self.states["s1"].set_target_loader(lambda t: SourceFace(t, np.zeros((128, 128, 3), np.uint8), embeddings=emb))

    def people(self, stream):
        maps = self.states[stream].mappings
        return [{"track": k, "box": [0, 0, 9, 9], "target": t, "source": maps.get(t)} for k, t in self.TRACKS.items()]

    def map_person(self, stream, track, source):
        return {"ok": True, "mappings": self.states[stream].set_mapping(self.TRACKS[track], source)}


def test_people_mapped_and_unmapped_by_keyboard_with_focus_kept(tmp_path):
    """A person's face chosen with the arrow keys, then each mapping unmapped with Enter: focus stays
    on the row's control through each rebuild, then on the next row's, then on the table's title."""
    from selenium.webdriver.common.keys import Keys

    srv = PanelServer(PeopleBackend(tmp_path / "faces"), token=new_token(), port=0)
    srv.start()
    state = srv.backend.states["s1"]
    d = opened(srv, 320, 900)
    try:
        for who in ("tom", "ann"):
            tab_to(d, lambda f, who=who: f["table"] == "people" and f["label"] == f"face for {who}")
            keys(d, Keys.ARROW_DOWN)  # the first face: alice
            assert wait_for(lambda who=who: state.mappings.get(who) == "alice", 10), state.mappings
            assert wait_for(lambda who=who: d.find_elements("css selector", f'#mappings tr[data-target="{who}"]'), 10)
            time.sleep(1.2)  # rebuilt, and a pushed state later
            assert (focused(d)["table"], focused(d)["label"]) == ("people", f"face for {who}"), focused(d)
        assert d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")  # 320 px
        tab_to(d, lambda f: f["table"] == "mappings" and "unmap" in f["cls"])
        keys(d, Keys.ENTER)  # tom's row (the first) goes: focus on ann's unmap, now first
        assert wait_for(lambda: list(state.mappings) == ["ann"], 10), state.mappings
        time.sleep(1.2)
        assert focused(d)["table"] == "mappings" and "unmap" in focused(d)["cls"], focused(d)
        keys(d, Keys.ENTER)  # the last one: focus on the table's title, not the page
        assert wait_for(lambda: state.mappings == {}, 10), state.mappings
        time.sleep(1.2)
        assert focused(d)["id"] == "mappings-title", focused(d)
    finally:
        d.quit()
        srv.stop()
