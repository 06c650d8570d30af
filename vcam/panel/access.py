"""Who may use the panel: the bind rule, the per-run token and its file, the pairing key that lets
an open page follow a restarted daemon, and :class:`Guard`, the ASGI middleware in front of every route.

The rules (a shared desktop: any local user, and any web page the user's browser opens, can reach a
port on 127.0.0.1; cookies are not kept apart by port, so a page another user serves on another
port of 127.0.0.1 receives every cookie of 127.0.0.1):

- the panel binds to loopback unless ``[panel] host`` says otherwise, and then only with TLS
  (:func:`check_bind`); a token is required either way;
- a random token per run (``[panel] keep_token`` reuses the last one), written with the address into
  ``<control socket>.panel``, mode 0600, in the socket's private folder (:func:`write_panel_file`);
  `vcam panel` refuses a panel file that is not the user's own (:func:`read_panel_file`);
- what vcam prints or opens for a browser (`vcam run`'s line, `vcam panel`, `vcam obs setup`'s
  dock steps) never holds the token: a browser's list of visited addresses keeps a URL as first
  opened, which no page can change. It holds a one-time code after ``#`` (``/#once=...``, a browser
  never sends that part to a server): ``time.nonce.HMAC(token, "vcam-once|" + time + "|" + nonce)``,
  made by whoever reads the token (the daemon, `vcam panel` from the panel file: no exchange
  between them), accepted within :data:`ONCE_TTL` seconds and once (:class:`OnceCodes` remembers
  the nonces it took until they expire). The page's own script moves it out of the URL, loads
  ``/`` in its place (``location.replace``: no entry of the tab's history holds even the code) and
  trades it at ``POST /api/once`` for the token, kept in the tab's ``sessionStorage`` (kept apart
  by origin, port included). A used, expired or foreign code gets the page's own words saying
  `vcam panel` prints a fresh link. (A URL of older runs with the token, ``/#token=...`` or
  ``/?token=...``, still opens the page: it is the user's own, and vcam no longer prints one);
- no cookie: every API request carries the token in the ``X-Vcam-Token`` header, which only the
  page's own script adds (a form, an ``<img>`` or another origin's script cannot: a cross-origin
  header needs a CORS preflight, never answered). The page shell (``/``, its script, style and
  icon) is served without it: it holds no secret;
- a restarted daemon has a new token. An open page follows it without the token ever going to a
  server that did not prove it is this vcam: the page holds the pairing key (kept in
  ``<control socket>.panelkey``, mode 0600, across runs; given to a page that has the token, kept in
  the page's memory only), and trades proofs with the server (HMAC-SHA256 over nonces of both,
  the server's first: :class:`Pairing`) for the new token. Whoever holds the port while vcam is
  stopped learns nothing from an open page. With ``[panel] keep_token`` the page also keeps the key
  in its origin's ``localStorage``, so a page loaded again (an OBS dock after OBS restarts, its
  stored link long used) proves it the same way; the cost: a program that holds the port while vcam
  is stopped, when such a page loads, serves it a script that reads that storage;
- on loopback, where the OS names the user at the other end (Linux), a request of another user's
  process is refused whatever it carries (:func:`another_users`), so a link's code seen in a
  process list (`vcam panel --open` hands it to the browser on its command line) is of no use to it;
- the Host header must name the panel's own address (127.0.0.1, localhost, ::1 or the configured
  host, with its port): a page on another name that resolves to 127.0.0.1 (DNS rebinding) gets 403;
- a request that changes anything is a POST, and an ``Origin``, when sent, must be the panel's own;
- the direct OBS source (``/obs/source``, :mod:`vcam.panel.source`) is opened by an OBS Browser
  Source, which can send neither a header nor a first message: its URL carries a key of its own in
  the query (``?key=...``), separate from the token, which grants that picture and nothing else
  (no setting, no face, no state). It is kept across runs in ``<control socket>.sourcekey`` (mode
  0600), so the Browser Source's URL, stored in OBS's scene collection, survives restarts;
  removing the file makes a new key (then `vcam obs setup` again). A page of another origin that
  learned it still cannot show the picture in an ``<img>`` (same-origin resource policy) or read it;
- no CORS headers at all; every answer says ``Cache-Control: no-store``, ``Referrer-Policy:
  no-referrer``, ``Cross-Origin-Resource-Policy: same-origin`` (no page of another port shows the
  preview or a thumbnail in an ``<img>``), ``X-Frame-Options: DENY`` and a Content-Security-Policy
  that allows only the panel's own scripts and no framing.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import json
import os
import secrets
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

from vcam.errors import ConfigError
from vcam.platform import files, transport

HEADER = "x-vcam-token"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
SECURITY_HEADERS = [
    (b"cache-control", b"no-store"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"same-origin"),  # no <img> of another port shows the preview
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'; "
        b"form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
]


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, tls_cert: str, tls_key: str) -> None:
    """ConfigError unless the panel may listen on ``host``: loopback always, anything else only with
    a TLS certificate and key (the token would otherwise cross the network in the clear)."""
    if is_loopback(host):
        return
    if not (tls_cert and tls_key):
        raise ConfigError(
            f"[panel] host = {host!r} is not loopback, and the panel is served there only over TLS",
            hint="set [panel] tls_cert and tls_key (PEM files), or leave [panel] host at 127.0.0.1",
        )
    for what, path in (("tls_cert", tls_cert), ("tls_key", tls_key)):
        if not Path(path).expanduser().is_file():
            raise ConfigError(f"[panel] {what} {path} is not a file", hint="point it at a PEM file")


def new_token(previous: str | None = None) -> str:
    """A fresh random token, or ``previous`` when it looks like one of ours (``[panel] keep_token``)."""
    if previous and len(previous) >= 32 and previous.replace("-", "").replace("_", "").isalnum():
        return previous
    return secrets.token_urlsafe(32)


def write_panel_file(path: Path, url: str, token: str, **extra: object) -> None:
    """``{"url", "token", "pid"}`` (and ``extra``: the OBS source's ``source_url``, ``width``,
    ``height``) into ``path``, mode 0600 from creation on, replaced atomically."""
    data = {"url": url, "token": token, "pid": os.getpid(), **extra}
    files.write_private(path, (json.dumps(data) + "\n").encode())


def read_panel_file(path: Path) -> dict | None:
    """The panel file's contents, or None when there is none or it cannot be read. ConfigError when
    it is not this user's own (another user's file, a link, readable by others, or in a folder
    others can write): its URL could send the user's browser, and the token the page keeps, to a
    server someone else runs."""
    data = _read_private_json(path)
    return data if isinstance(data, dict) and isinstance(data.get("url"), str) else None


def _read_private_json(path: Path) -> dict | None:
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | files.NOFOLLOW | files.BINARY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _foreign(path, "it is a symbolic link") from None
        return None
    try:
        st = os.fstat(fd)
        if not files.mine(st):
            raise _foreign(path, f"it belongs to uid {st.st_uid}")
        if files.my_uid() is not None and stat.S_IMODE(st.st_mode) & 0o077:
            raise _foreign(path, f"others may read or change it (mode {stat.S_IMODE(st.st_mode):04o})")
        try:
            files.check_private_folder(path.parent)
        except files.NotPrivate as exc:
            raise _foreign(path, f"its folder is not private ({exc})") from None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = json.loads(fh.read(1 << 16))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def _foreign(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path} is not this user's own {'panel key' if path.name.endswith('key') else 'panel file'}: {why}",
        hint="remove it, and keep [control] socket in a folder only you can write (the default is)",
    )


def remove_panel_file(path: Path) -> None:
    """Remove the panel file if this process wrote it (another daemon's is left alone)."""
    try:
        data = read_panel_file(path)
    except ConfigError:
        return
    if data is not None and data.get("pid") == os.getpid():
        path.unlink(missing_ok=True)


PUBLIC = ("/", "/static/panel.js", "/static/panel.css", "/favicon.ico")  # the page shell: no secret in it
PAIRING = ("/api/hello", "/api/resume", "/api/once")  # the proofs (or a one-time code) stand for the token there
ONCE_TTL = 120.0  # seconds a printed link opens the panel (once)
SOURCE = "/obs/source"  # the direct OBS source: its own key in the query (see the module docstring)


def base_of(url: str) -> str:
    """The panel's address in ``url`` (its scheme, host and port; no path, code or token)."""
    return url.split("#", 1)[0].split("?", 1)[0].rstrip("/")


def once_code(token: str, now: float) -> str:
    """A one-time code for ``token`` made at ``now`` (wall-clock seconds): see the module docstring."""
    stamp, nonce = str(int(now)), secrets.token_urlsafe(12)
    return f"{stamp}.{nonce}.{_once_mac(token, stamp, nonce)}"


def _once_mac(token: str, stamp: str, nonce: str) -> str:
    return hmac.new(token.encode(), f"vcam-once|{stamp}|{nonce}".encode(), "sha256").hexdigest()[:32]


def once_url(base: str, token: str, now: float) -> str:
    """The link a browser opens: the panel at ``base`` with a fresh one-time code (never the token)."""
    return f"{base_of(base)}/#{urlencode({'once': once_code(token, now)})}"


class OnceCodes:
    """The one-time codes this run accepts: made with its token since it ``started`` (with
    ``keep_token`` an earlier run's code has the same token, and its nonce was taken there), at most
    :data:`ONCE_TTL` seconds old (a few seconds ahead allowed: clocks read by two processes), each
    nonce once. Nonces taken
    are kept until their code expires; only a holder of the token can make one, so they are few."""

    AHEAD = 5.0
    WHY = {
        "used": "this link was already used: a link opens the panel once",
        "expired": f"this link has expired: a link opens the panel within {int(ONCE_TTL) // 60} minutes",
        "wrong": "this link is not for this run of vcam (an earlier run's, or cut short)",
    }
    HINT = "run `vcam panel` for a fresh link (`vcam panel --open` opens it)"

    def __init__(self, token: str, started: float = 0.0) -> None:
        self.token, self.started = token, int(started)  # a code from before: an earlier run's (keep_token)
        self._taken: dict[str, float] = {}

    def redeem(self, code: object, now: float) -> str | None:
        """None when ``code`` is good (it is used up then), else why not: a key of :attr:`WHY`."""
        self._taken = {n: t for n, t in self._taken.items() if now - t <= ONCE_TTL + self.AHEAD}
        parts = code.split(".") if isinstance(code, str) and len(code) <= 200 else []
        if len(parts) != 3 or not parts[0].isdigit():
            return "wrong"
        stamp, nonce, mac = parts
        if not hmac.compare_digest(_once_mac(self.token, stamp, nonce).encode(), mac.encode()):
            return "wrong"
        if nonce in self._taken:
            return "used"
        if not -self.AHEAD <= now - int(stamp) <= ONCE_TTL:
            return "expired"
        if int(stamp) < self.started:
            return "wrong"
        self._taken[nonce] = int(stamp)
        return None


class Pairing:
    """The page's way back to a restarted daemon without the token leaving it first.

    ``key``: a secret kept across runs (:func:`load_pairing_key`). ``hello(page_nonce)`` answers a
    server nonce and the server's proof ``HMAC(key, "vcam-server|" + page_nonce + "|" + nonce)``;
    the page checks it before it proves itself with ``HMAC(key, "vcam-page|" + nonce + "|" +
    page_nonce)``, which ``resume`` checks (each server nonce once, within 30 s) before it hands
    out this run's token. At most 64 nonces are waiting at once."""

    TTL = 30.0
    WAITING = 64

    def __init__(self, key: str, token: str) -> None:
        self.key, self.token = key.encode(), token
        self._waiting: dict[str, tuple[str, float]] = {}

    def _mac(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), "sha256").hexdigest()

    def hello(self, page_nonce: object, now: float) -> dict | None:
        if not isinstance(page_nonce, str) or not 16 <= len(page_nonce) <= 128:
            return None
        self._waiting = {n: v for n, v in self._waiting.items() if now - v[1] < self.TTL}
        while len(self._waiting) >= self.WAITING:
            self._waiting.pop(next(iter(self._waiting)))
        nonce = secrets.token_urlsafe(24)
        self._waiting[nonce] = (page_nonce, now)
        return {"nonce": nonce, "proof": self._mac(f"vcam-server|{page_nonce}|{nonce}")}

    def resume(self, nonce: object, proof: object, now: float) -> str | None:
        if not isinstance(nonce, str) or not isinstance(proof, str):
            return None
        waiting = self._waiting.pop(nonce, None)
        if waiting is None or now - waiting[1] >= self.TTL:
            return None
        want = self._mac(f"vcam-page|{nonce}|{waiting[0]}")
        return self.token if hmac.compare_digest(want.encode(), proof.encode()) else None


def source_url(base: str, key: str) -> str:
    """The direct OBS source's URL for a Browser Source (the key in the query: see the module docstring)."""
    return f"{base}/obs/source?{urlencode({'key': key})}"


def load_source_key(path: Path | None) -> str:
    """The OBS source's key kept in ``path`` (as :func:`load_pairing_key` keeps the pairing key)."""
    return load_pairing_key(path)


def load_pairing_key(path: Path | None) -> str:
    """The pairing key kept in ``path`` (made there, mode 0600, when missing or not the user's
    own); a key for this run alone when ``path`` is None or cannot be written."""
    if path is None:
        return secrets.token_urlsafe(32)
    try:
        data = _read_private_json(path)
    except ConfigError:
        data = None
    key = data.get("key") if data else None
    if isinstance(key, str) and len(key) >= 32:
        return key
    key = secrets.token_urlsafe(32)
    try:
        files.write_private(path, (json.dumps({"key": key}) + "\n").encode())
    except OSError:
        pass
    return key


class Guard:
    """ASGI middleware enforcing the module docstring's rules before ``app`` sees a request."""

    def __init__(self, app, token: str, hosts: set[str], port: int, source_key: str | None = None) -> None:
        self.app, self.token, self.hosts = app, token.encode(), {h.lower() for h in hosts}
        self.source_key = source_key.encode() if source_key else None

    def _source_ok(self, given: str | None) -> bool:
        return bool(self.source_key and given) and hmac.compare_digest(str(given).encode(), self.source_key or b"")

    def _ok(self, given: str | bytes | None) -> bool:
        if not given:
            return False
        raw = given.encode() if isinstance(given, str) else given
        return hmac.compare_digest(raw, self.token)

    def ws_token_ok(self, given: object) -> bool:
        """A WebSocket's first message carries the token (a browser cannot add a header to one)."""
        return isinstance(given, str) and self._ok(given)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])  # the last of a repeated header
        host = headers.get(b"host", b"").decode("latin-1").lower()
        foreign = another_users(scope)
        if scope["type"] == "websocket":
            # No CORS for WebSockets: any page may open one here, so its Origin must be the panel's
            # own (a browser always sends it); the token then comes as the first message.
            origin = headers.get(b"origin", b"").decode("latin-1").lower().split("://", 1)[-1]
            if host not in self.hosts or origin not in self.hosts or foreign:
                await receive()  # websocket.connect
                return await send({"type": "websocket.close", "code": 1008})
            return await self.app(scope, receive, send)
        if host not in self.hosts:
            return await _plain(send, 403, "forbidden: this panel answers only at its own address")
        if foreign:
            return await _plain(send, 403, "forbidden: this panel serves only the user who started vcam")
        method, path = scope["method"], scope["path"]
        if method in ("GET", "HEAD"):
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            if path == "/" and "token" in query:  # the URL of older runs: the token moves after '#'
                if not self._ok(query["token"]):
                    return await _plain(send, 401, "unauthorized: the token is wrong (this run's URL: `vcam panel`)")
                return await _plain(send, 303, "", [(b"location", ("/#" + urlencode({"token": query["token"]})).encode())])
            if path == SOURCE:
                if not self._source_ok(query.get("key")):
                    why = "the OBS source is off in this run" if self.source_key is None else "its key is wrong"
                    return await _plain(send, 401, f"unauthorized: {why} (`vcam obs setup` sets the Browser Source's URL)")
            elif path not in PUBLIC and not self._ok(headers.get(HEADER.encode())):
                return await _plain(send, 401, "unauthorized: open the panel with the URL `vcam panel` prints")
        elif method == "POST":
            origin = headers.get(b"origin")
            if origin is not None and origin.decode("latin-1").lower().split("://", 1)[-1] not in self.hosts:
                return await _plain(send, 403, "forbidden: cross-origin request")
            if path not in PAIRING and not self._ok(headers.get(HEADER.encode())):
                return await _plain(send, 403, "forbidden: a change needs the X-Vcam-Token header")
        else:
            return await _plain(send, 405, "method not allowed")

        async def send_secured(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_secured)


def another_users(scope: dict) -> bool:
    """Whether the request comes from another local user's process (a loopback peer whose user the
    OS names, Linux: neither this process's nor root's). Such a request is refused whatever it
    carries: a code, token or key it read somewhere (a process list, a history) is of no use to it.
    False where the OS cannot tell (Windows, macOS) and for peers on other machines."""
    client, server = scope.get("client"), scope.get("server")
    if not client or not server or not is_loopback(str(client[0])):
        return False
    uid, me = transport.tcp_peer_uid(tuple(server), tuple(client)), files.my_uid()
    return uid is not None and me is not None and uid not in (me, 0)


def allowed_hosts(host: str, port: int) -> set[str]:
    """The Host header values the panel answers to at ``host``:``port``: the loopback names on
    loopback; else ``host`` itself, and for a wildcard address (0.0.0.0, ::) the loopback names and
    this machine's own names (anything else a browser calls it is a name someone else points here)."""
    import socket

    names = set(LOOPBACK_NAMES) if is_loopback(host) else {host}
    if host in ("0.0.0.0", "::", ""):
        names |= set(LOOPBACK_NAMES) | {socket.gethostname(), socket.getfqdn()}
    out = {f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names}
    if port in (80, 443):  # a browser leaves the default port out of Host and Origin
        out |= {f"[{n}]" if ":" in n else n for n in names}
    return out


async def _plain(send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = (text + "\n").encode() if text else b""
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra or []) + SECURITY_HEADERS})
    await send({"type": "http.response.body", "body": body})
