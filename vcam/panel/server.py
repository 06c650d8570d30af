"""The panel's web server: a Starlette app behind :class:`~vcam.panel.access.Guard`, served by
uvicorn on its own thread (its own event loop) inside the daemon's process.

Routes (the API needs the token in the X-Vcam-Token header, see :mod:`vcam.panel.access`)::

    GET  /                      the page (static/index.html; no token needed, none in it)
    GET  /static/panel.js|css   its script and style (no token needed)
    GET  /favicon.ico           its icon (no token needed)
    GET  /api/session           the pairing key, for the page's memory (see access.Pairing), and whether
                                the page keeps it in its storage too ("remember": [panel] keep_token)
    POST /api/hello, /api/resume   a restarted daemon and an open page prove the key to each other:
                                the page gets this run's token (no token needed: the proofs stand for it)
    POST /api/once              {"code"}: a printed link's one-time code, traded once for the token
                                (access.OnceCodes); a used or expired one gets the page's words (403)
    GET  /api/state             everything the page shows, once (view.PanelView.snapshot)
    GET  /api/events            the same, pushed as Server-Sent Events: every second and on each change
    WS   /api/ws                one connection a page: the token as the first message, then the states
                                (text) and, while asked ({"preview": STREAM|null}), preview JPEGs (binary)
    GET  /api/faces/NAME/thumb  a face's stored crop (PNG)
    GET  /api/preview?stream=S  the published picture, multipart JPEG (preview.PreviewTap): on while open
    GET  /obs/source?key=K[&stream=S]   the direct OBS source: every published frame, full size, multipart
                                JPEG (source.SourceTap); its own key in the query, no token (access)
    POST /api/command           a `vcam ctl` command object, answered as `vcam ctl` is (plus "published")
    POST /api/people            {"stream", "track", "source"}: map a person in view
    POST /api/faces?filename=F&name=N[&pick=K]   the photo as the body: `vcam faces add [--pick K]`
    POST /api/faces/NAME/remove        `vcam faces remove`
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import shutil
import socket
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from vcam.control.local import MAX_LINE, handle_command
from vcam.errors import ConfigError, FaceError, VcamError
from vcam.panel import limits
from vcam.panel.access import Guard, OnceCodes, Pairing, allowed_hosts, check_bind, once_url
from vcam.panel.preview import PreviewTap
from vcam.panel.source import SourceTap
from vcam.panel.view import Backend, PanelView
from vcam.platform import transport
from vcam.stages.photos import MAX_PHOTO_BYTES

log = logging.getLogger(__name__)

PUSH_INTERVAL = 1.0  # seconds between pushed states when nothing changes
STATIC = ("index.html", "panel.js", "panel.css")


class _Hub:
    """Wakes every waiting reader at once (on the server's loop); ``fire`` from any thread."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.count = 0  # fires so far (a reader compares it with the last it acted on)

    def _set(self) -> None:
        self.count += 1
        if self._event is not None:
            self._event.set()
            self._event = asyncio.Event()

    def fire(self) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._set)

    async def wait(self, timeout: float) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


def _ws_protocol() -> str:
    """uvicorn's WebSocket protocol for /api/ws: wsproto (a dependency), else whatever uvicorn finds
    ('auto'); with none at all the page reads its two HTTP streams instead."""
    try:
        import wsproto  # noqa: F401
    except ImportError:
        return "auto"
    return "wsproto"


def _static(name: str) -> str:
    return resources.files("vcam.panel").joinpath("static").joinpath(name).read_text(encoding="utf-8")


def _error(exc: BaseException) -> dict:
    """An error in the page's words (its own hint where the CLI's names a command or flag)."""
    if isinstance(exc, VcamError):
        return {"ok": False, "error": exc.message, "hint": exc.page_hint or exc.hint}
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "hint": "see the daemon's log"}


def _pick(arg: str) -> int | None | JSONResponse:
    """An upload's ``pick=K`` (a group photo's face K, from 1): the number, None when not given, or
    the 400 answer for one that is no face number."""
    if not arg:
        return None
    if arg.isdigit() and int(arg) >= 1:
        return int(arg)
    hint = "pick=K counts the photo's faces from 1, left to right"
    return JSONResponse({"ok": False, "error": f"pick={arg!r} is not a face number", "hint": hint}, 400)


async def _json_body(request) -> Any:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_LINE:
            raise ValueError("the request is too long")
    return json.loads(body or b"null")


async def _json_dict(request) -> dict:
    try:
        body = await _json_body(request)
    except (ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}


class _Passes:
    """The routes that hand a page this run's token (see :mod:`vcam.panel.access`): the pairing key
    for a page that has the token, the proofs of a restarted daemon, and a printed link's code."""

    def __init__(self, token: str, pairing_key: str | None, remember: bool) -> None:
        self.token, self.remember = token, remember
        self.pairing = Pairing(pairing_key or secrets.token_urlsafe(32), token)
        self.once = OnceCodes(token, time.time())

    async def session(self, request):
        return JSONResponse({"key": self.pairing.key.decode(), "remember": self.remember})

    async def hello(self, request):
        body = await _json_dict(request)
        answer = self.pairing.hello(body.get("nonce"), time.monotonic())
        return JSONResponse(answer or {"ok": False, "error": 'expected {"nonce": N}'}, 200 if answer else 400)

    async def resume(self, request):
        body = await _json_dict(request)
        token = self.pairing.resume(body.get("nonce"), body.get("proof"), time.monotonic())
        if token is None:
            return JSONResponse({"ok": False, "error": "the proof is wrong"}, 403)
        return JSONResponse({"ok": True, "token": token})

    async def redeem(self, request):
        body = await _json_dict(request)
        why = self.once.redeem(body.get("code"), time.time())
        if why is not None:
            return JSONResponse({"ok": False, "error": OnceCodes.WHY[why], "hint": OnceCodes.HINT, "why": why}, 403)
        return JSONResponse({"ok": True, "token": self.token})


class PanelServer:
    """Serve the panel for ``backend`` on ``host``:``port`` (0: any free port) until :meth:`stop`.
    ``tap``: the preview frames (the daemon offers its published frames to it). ``or_free_port``:
    when ``port`` is in use (another vcam's panel), take a free one instead; ``moved_from`` then
    names the port asked for. ``source``: the direct OBS source's frames, served at
    ``/obs/source`` to whoever gives ``source_key`` (None: no source). ``remember``: a page keeps
    the pairing key in its origin's storage (a dock reloaded by OBS reconnects; see access)."""

    def __init__(
        self,
        backend: Backend,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        tls_cert: str = "",
        tls_key: str = "",
        tap: PreviewTap | None = None,
        or_free_port: bool = False,
        pairing_key: str | None = None,
        source: SourceTap | None = None,
        source_key: str | None = None,
        remember: bool = False,
    ) -> None:
        check_bind(host, tls_cert, tls_key)
        self.passes = _Passes(token, pairing_key, remember)  # remember: [panel] keep_token
        self.backend, self.token, self.host, self.port = backend, token, host, port
        self.or_free_port = or_free_port
        self.moved_from: int | None = None
        self.tls = (str(Path(tls_cert).expanduser()), str(Path(tls_key).expanduser())) if tls_cert and tls_key else None
        self.tap = tap or PreviewTap()
        self.source: SourceTap | None = source if source_key else None
        self.source_key: str | None = source_key if source is not None else None
        self.view = PanelView(backend)
        self._changes, self._frames, self._source_frames = _Hub(), _Hub(), _Hub()
        self._closing = False
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self.counts = limits.Counts()

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        scheme = "https" if self.tls else "http"
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def url(self) -> str:
        """A fresh link for a browser, with a one-time code (never the token): what `vcam run` prints."""
        return once_url(self.base_url, self.token, time.time())

    def start(self) -> None:
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = transport.server_socket(family)
        try:
            try:
                sock.bind((self.host, self.port))
            except OSError as exc:
                if not (self.or_free_port and self.port and transport.port_taken(exc)):
                    raise
                sock.bind((self.host, 0))
                self.moved_from = self.port
        except OSError as exc:
            sock.close()
            raise ConfigError(
                f"the panel cannot listen on {self.host}:{self.port}: {exc.strerror or exc}",
                hint="set [panel] port (or --panel PORT) to a free port, or --panel off",
            ) from None
        sock.listen(limits.ACCEPT_BATCH)
        self.port = sock.getsockname()[1]
        app = self.guard = Guard(
            self._app(), self.token, allowed_hosts(self.host, self.port), self.port, source_key=self.source_key
        )
        config = uvicorn.Config(
            app,
            http=limits.protocol(self.counts),  # connection caps and the first-request timeout
            backlog=limits.ACCEPT_BATCH,  # connections accepted in one tick (see limits)
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
            ws=_ws_protocol(),
            ssl_certfile=self.tls[0] if self.tls else None,
            ssl_keyfile=self.tls[1] if self.tls else None,
        )
        self._server = uvicorn.Server(config)
        for state in self.backend.states.values():
            state.subscribe(lambda _snap: self._changes.fire())
        self.tap.on_frame = lambda _stream: self._frames.fire()
        self.tap.start()
        if self.source is not None:
            self.source.start(on_frame=lambda _stream: self._source_frames.fire())
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="vcam-panel", daemon=True)
        self._thread.start()
        self._started.wait(10.0)  # the lifespan ran (or serving failed); uvicorn says started just after
        deadline = time.monotonic() + 10.0
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not self._server.started:  # a TLS file it could not load, say (logged)
            self.stop()
            raise ConfigError(
                f"the panel did not start on {self.host}:{self.port}",
                hint="see the log line above; check [panel] tls_cert/tls_key",
            )
        # asyncio listened with the accept batch as the queue too: the kernel's queue can be long (queued
        # connections are no descriptors of ours) while one tick still accepts a batch (see limits).
        # POSIX re-sizes a listening socket's queue; Windows keeps the first size.
        sock.listen(socket.SOMAXCONN)

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        except Exception as exc:  # the panel ends, the daemon goes on
            log.error("the panel stopped serving: %s: %s", type(exc).__name__, exc)
            log.debug("the panel's error", exc_info=True)
        finally:
            self._started.set()
            sock.close()

    def stop(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.should_exit = True
        for hub in (self._changes, self._frames, self._source_frames):
            hub.fire()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self.tap.stop()
        if self.source is not None:
            self.source.stop()

    close = stop

    # -- the app ---------------------------------------------------------------------------------
    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route, WebSocketRoute

        @contextlib.asynccontextmanager
        async def lifespan(app):
            self._changes.loop = self._frames.loop = self._source_frames.loop = asyncio.get_running_loop()
            limits.quiet_accept_errors(self._changes.loop)
            sampler = asyncio.create_task(self._sample())
            self._started.set()
            try:
                yield
            finally:
                sampler.cancel()

        routes = [
            Route("/", self._index),
            Route("/favicon.ico", self._favicon),
            Route("/static/{name}", self._static),
            Route("/api/session", self.passes.session),
            Route("/api/hello", self.passes.hello, methods=["POST"]),
            Route("/api/resume", self.passes.resume, methods=["POST"]),
            Route("/api/once", self.passes.redeem, methods=["POST"]),
            Route("/api/state", self._state),
            Route("/api/events", self._events),
            WebSocketRoute("/api/ws", self._ws),
            Route("/api/faces/{name}/thumb", self._thumb),
            Route("/api/preview", self._preview),
            Route("/obs/source", self._obs_source),
            Route("/api/command", self._command, methods=["POST"]),
            Route("/api/people", self._people, methods=["POST"]),
            Route("/api/faces", self._add_face, methods=["POST"]),
            Route("/api/faces/{name}/remove", self._remove_face, methods=["POST"]),
        ]
        return Starlette(routes=routes, lifespan=lifespan)

    async def _sample(self) -> None:
        while True:
            self.view.sample()
            await asyncio.sleep(1.0)

    async def _index(self, request):

        return HTMLResponse(_static("index.html"))

    async def _favicon(self, request):

        return Response(_static("favicon.svg"), media_type="image/svg+xml")

    async def _static(self, request):

        name = request.path_params["name"]
        if name not in STATIC[1:]:
            return Response("not found\n", 404, media_type="text/plain")
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        return Response(_static(name), media_type=f"{kind}; charset=utf-8")

    async def _state(self, request):

        return JSONResponse(await run_in_threadpool(self.view.snapshot))

    async def _events(self, request):

        async def stream():
            while not self._closing:
                snap = await run_in_threadpool(self.view.snapshot)
                yield f"event: state\ndata: {json.dumps(snap)}\n\n"
                await self._changes.wait(PUSH_INTERVAL)

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    async def _ws(self, ws) -> None:
        """The page's one connection (any number of tabs and docks: a browser's six HTTP/1.1
        connections a host are not spent): states and, while asked, the preview."""
        from starlette.websockets import WebSocketDisconnect

        await ws.accept()
        try:
            first = await asyncio.wait_for(ws.receive_json(), 5.0)
        except (asyncio.TimeoutError, WebSocketDisconnect, ValueError, RecursionError, KeyError):
            return await ws.close(4401)
        if not (isinstance(first, dict) and self.guard.ws_token_ok(first.get("token"))):
            return await ws.close(4401)  # the page then proves the pairing key for this run's token
        want: dict[str, str | None] = {"preview": None}

        async def read() -> None:
            async for msg in ws.iter_json():
                if isinstance(msg, dict) and "preview" in msg:
                    name = msg["preview"]
                    old, want["preview"] = want["preview"], name if name in self.backend.states else None
                    if old != want["preview"]:
                        if old:
                            self.tap.unwatch(old)
                        if want["preview"]:
                            self.tap.watch(want["preview"])
                    self._frames.fire()

        reader = asyncio.create_task(read())
        seen, last_state, changes = 0, 0.0, -1
        try:
            while not self._closing and not reader.done():
                now = time.monotonic()
                if now - last_state >= PUSH_INTERVAL or changes != self._changes.count:
                    last_state, changes = now, self._changes.count
                    await ws.send_text(json.dumps(await run_in_threadpool(self.view.snapshot)))
                name = want["preview"]
                if name:
                    version, jpeg = self.tap.frames.get(name, (0, b""))
                    if jpeg and version != seen:
                        seen = version
                        await ws.send_bytes(jpeg)
                left = max(0.01, PUSH_INTERVAL - (time.monotonic() - last_state))
                waits = [asyncio.ensure_future(hub.wait(left)) for hub in (self._changes, self._frames)]
                await asyncio.wait([*waits, reader], return_when=asyncio.FIRST_COMPLETED)
                for w in waits:
                    w.cancel()
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        finally:
            reader.cancel()
            if want["preview"]:
                self.tap.unwatch(want["preview"])

    async def _thumb(self, request):

        png = await run_in_threadpool(self.view.thumbnail, request.path_params["name"])
        if png is None:
            return Response("no such face\n", 404, media_type="text/plain")
        return Response(png, media_type="image/png")

    async def _preview(self, request):

        names = list(self.backend.states)
        name = request.query_params.get("stream") or names[0]
        if name not in names:
            return Response(f"no stream {name!r}\n", 404, media_type="text/plain")
        tap = self.tap

        async def frames():
            tap.watch(name)
            seen, quiet = 0, 0
            try:
                while not self._closing:
                    version, jpeg = tap.frames.get(name, (0, b""))
                    if jpeg and (version != seen or quiet >= 4):  # a frame again now and then: a closed
                        seen, quiet = version, 0  # reader is noticed even when the picture stands still
                        head = f"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n"
                        yield head.encode() + jpeg + b"\r\n"
                    quiet += 1
                    await self._frames.wait(0.5)
            finally:
                tap.unwatch(name)

        return StreamingResponse(frames(), media_type="multipart/x-mixed-replace; boundary=frame")

    async def _obs_source(self, request):
        """Every published frame, full size, as the parts of one multipart JPEG answer (the Guard
        checked the key). A reader slower than the stream gets the newest frame each time."""
        source, names = self.source, list(self.backend.states)
        name = request.query_params.get("stream") or names[0]
        if source is None or name not in names:
            return Response(f"no stream {name!r}\n", 404, media_type="text/plain")

        parts = source.parts(name, self._source_frames, lambda: self._closing)
        return StreamingResponse(parts, media_type="multipart/x-mixed-replace; boundary=frame")

    # -- changes (POST) ------------------------------------------------------------------------
    def _run_command(self, cmd: Any) -> dict:
        states = self.backend.states
        first = next(iter(states.values()))
        reply = handle_command(first, cmd, states if len(states) > 1 else None, page=True)
        reply["published"] = {name: self.backend.published(name) for name in states}
        return reply

    async def _command(self, request):

        try:
            cmd = await _json_body(request)
        except (ValueError, RecursionError):
            return JSONResponse({"ok": False, "error": "the body must be one JSON command object"}, 400)
        reply = await run_in_threadpool(self._run_command, cmd)
        self._changes.fire()
        return JSONResponse(reply, 200 if reply.get("ok") else 400)

    async def _people(self, request):

        try:
            body = await _json_body(request)
            stream = str(body.get("stream") or next(iter(self.backend.states)))
            track, source = int(body["track"]), str(body["source"])
        except (ValueError, RecursionError, TypeError, KeyError, AttributeError):
            return JSONResponse({"ok": False, "error": 'expected {"stream": S, "track": N, "source": FACE}'}, 400)
        try:
            reply = await run_in_threadpool(self.backend.map_person, stream, track, source)
        except Exception as exc:
            return JSONResponse(_error(exc), 400)
        reply["published"] = {name: self.backend.published(name) for name in self.backend.states}
        self._changes.fire()
        return JSONResponse(reply, 200 if reply.get("ok") else 400)

    async def _add_face(self, request):

        too_big = {
            "ok": False,
            "error": f"the photo is over {MAX_PHOTO_BYTES // (1 << 20)} MiB, too large for a face photo",
            "hint": "scale it down (4000 px on the long side is plenty) and try again",
        }
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_PHOTO_BYTES):
            return JSONResponse(too_big, 413)  # refused before a byte of the body is read
        filename = _safe_filename(request.query_params.get("filename", ""))
        name = request.query_params.get("name") or None
        pick = _pick(request.query_params.get("pick") or "")
        if isinstance(pick, JSONResponse):
            return pick
        folder = Path(tempfile.mkdtemp(prefix="vcam-upload-"))
        try:
            path = folder / filename
            size = 0
            with open(path, "wb") as fh:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_PHOTO_BYTES:
                        return JSONResponse(too_big, 413)
                    fh.write(chunk)
            if size == 0:
                return JSONResponse({"ok": False, "error": "the upload is empty", "hint": "choose a photo file"}, 400)
            try:
                args = (path, name) if pick is None else (path, name, pick)  # a group photo's face K
                added = await run_in_threadpool(self.backend.add_face, *args)
            except Exception as exc:
                if not isinstance(exc, VcamError):
                    log.exception("adding a face from the panel failed")
                return JSONResponse(await run_in_threadpool(_upload_error, exc, path, filename), 400)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._changes.fire()
        return JSONResponse({"ok": True, "face": added})

    async def _remove_face(self, request):

        name = request.path_params["name"]
        try:
            await run_in_threadpool(self.backend.remove_face, name)
        except Exception as exc:
            return JSONResponse(_error(exc), 400)
        self._changes.fire()
        return JSONResponse({"ok": True, "removed": name})


PICKER_FACES = 24  # a group photo's faces shown to choose from, at most


def _upload_error(exc: BaseException, path: Path, filename: str) -> dict:
    """An upload's error for the page: its file name, not the upload's temporary path; a group
    photo's faces for the page's picker (``faces``: box, score and ``crop``, a small JPEG data URL
    cut from the photo as the detector saw it; left to right), which adds one with pick=K."""
    reply = _error(exc)
    reply["error"] = reply["error"].replace(str(path), filename)
    if isinstance(exc, FaceError) and exc.found:
        reply["error"] = f"{len(exc.found)} faces found in {filename}"
        found = exc.found[:PICKER_FACES]
        reply["faces"] = [{**f, "crop": crop} for f, crop in zip(found, _face_crops(path, found), strict=True)]
    return reply


def _face_crops(path: Path, found: list[dict], size: int = 64) -> list[str]:
    """Each face of ``found`` as a ``size``-px square JPEG data URL ("" where none can be cut)."""
    import base64

    import cv2

    from vcam.stages.photos import read_photo

    try:
        img = read_photo(path)  # read and checked once already: the same pixels the detector had
    except VcamError:
        return [""] * len(found)
    h, w = img.shape[:2]
    out = []
    for f in found:
        x1, y1, x2, y2 = f["box"]
        half = max(x2 - x1, y2 - y1) * 0.65
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        crop = img[max(0, int(cy - half)) : min(h, int(cy + half)), max(0, int(cx - half)) : min(w, int(cx + half))]
        if crop.size == 0:
            out.append("")
            continue
        ok, buf = cv2.imencode(".jpg", cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA))
        out.append("data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode() if ok else "")
    return out


def _safe_filename(raw: str) -> str:
    """An uploaded file's name reduced to its last part in safe characters (its stem names the face,
    as `vcam faces add` names it after the file); 'photo.jpg' when nothing usable is left."""
    base = re.split(r"[\\/]", raw)[-1]
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.")[:100]
    if not base:
        return "photo.jpg"
    return base if "." in base else base + ".jpg"
