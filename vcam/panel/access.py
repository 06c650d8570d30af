"""Who may use the panel: the bind rule, the per-run token and its file, and :class:`Guard`, the ASGI
middleware in front of every route.

The rules (a shared desktop: any local user, and any web page the user's browser opens, can reach a
port on 127.0.0.1):

- the panel binds to loopback unless ``[panel] host`` says otherwise, and then only with TLS
  (:func:`check_bind`); a token is required either way;
- a random token per run (``[panel] keep_token`` reuses the last one), written with the URL into
  ``<control socket>.panel``, mode 0600, in the socket's private folder (:func:`write_panel_file`);
- every request carries the token: ``?token=`` once (answered with a SameSite=Strict, HttpOnly cookie
  and a redirect to the same path without it, so the token leaves the address bar and the history),
  then the cookie; a request without it is 401;
- the Host header must name the panel's own address (127.0.0.1, localhost, ::1 or the configured
  host, with its port): a page on another name that resolves to 127.0.0.1 (DNS rebinding) gets 403;
- a request that changes anything is a POST carrying the token in the ``X-Vcam-Token`` header (a
  form cannot set a header, and a cross-origin script cannot without a CORS preflight, which is
  never answered), and an ``Origin``, when sent, must be the panel's own: a cross-origin form post
  is 403 even when a browser attaches the cookie;
- no CORS headers at all; every answer says ``Cache-Control: no-store``, ``Referrer-Policy:
  no-referrer`` and a Content-Security-Policy that allows only the panel's own scripts.
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
from vcam.platform import files

COOKIE = "vcam_panel"  # + "_PORT": cookies are not kept apart by port, two panels must not share one
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


def write_panel_file(path: Path, url: str, token: str) -> None:
    """``{"url", "token", "pid"}`` into ``path``, mode 0600 from creation on, replaced atomically."""
    files.write_private(path, (json.dumps({"url": url, "token": token, "pid": os.getpid()}) + "\n").encode())


def read_panel_file(path: Path) -> dict | None:
    """The panel file's contents, or None when there is none or it cannot be read. ConfigError when
    it is not this user's own (another user's file, a link, readable by others, or in a folder
    others can write): its URL could send the user's browser, and the token the page keeps, to a
    server someone else runs."""
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
    return data if isinstance(data, dict) and isinstance(data.get("url"), str) else None


def _foreign(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path} is not this user's own panel file: {why}",
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


def url_with_token(base: str, token: str) -> str:
    return f"{base}/?{urlencode({'token': token})}"


class Guard:
    """ASGI middleware enforcing the module docstring's rules before ``app`` sees a request."""

    def __init__(self, app, token: str, hosts: set[str], port: int) -> None:
        self.app, self.token, self.hosts = app, token.encode(), {h.lower() for h in hosts}
        self.cookie = f"{COOKIE}_{port}"

    def _ok(self, given: str | bytes | None) -> bool:
        if not given:
            return False
        raw = given.encode() if isinstance(given, str) else given
        return hmac.compare_digest(raw, self.token)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])  # the last of a repeated header
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if host not in self.hosts:
            return await _plain(send, 403, "forbidden: this panel answers only at its own address")
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        cookie = _cookie(headers.get(b"cookie", b""), self.cookie)
        method = scope["method"]
        if method in ("GET", "HEAD") and "token" in query:
            if not self._ok(query["token"]):
                return await _plain(send, 401, "unauthorized: the token is wrong (this run's URL: `vcam panel`)")
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            location = scope["path"] + (f"?{rest}" if rest else "")
            cookie_line = f"{self.cookie}={self.token.decode()}; Path=/; HttpOnly; SameSite=Strict"
            return await _plain(send, 303, "", [(b"location", location.encode()), (b"set-cookie", cookie_line.encode())])
        if method in ("GET", "HEAD"):
            if not self._ok(cookie) and not self._ok(headers.get(HEADER.encode())):
                return await _plain(send, 401, "unauthorized: open the panel with the URL `vcam panel` prints")
        elif method == "POST":
            origin = headers.get(b"origin")
            if origin is not None and origin.decode("latin-1").lower().split("://", 1)[-1] not in self.hosts:
                return await _plain(send, 403, "forbidden: cross-origin request")
            if not self._ok(headers.get(HEADER.encode())):
                return await _plain(send, 403, "forbidden: a change needs the X-Vcam-Token header")
        else:
            return await _plain(send, 405, "method not allowed")

        async def send_secured(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_secured)


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


def _cookie(raw: bytes, name: str) -> str | None:
    for part in raw.decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


async def _plain(send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = (text + "\n").encode() if text else b""
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra or []) + SECURITY_HEADERS})
    await send({"type": "http.response.body", "body": body})
