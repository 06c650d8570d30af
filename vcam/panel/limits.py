"""How many connections the panel holds, and for how long: its uvicorn protocol (:func:`protocol`).

Every open connection is a file descriptor of the daemon's process, which the control socket, the
OBS connection, the camera and the log share (1,024 by default): another local user holding
connections to the panel's port (no token is needed to connect) must not starve them. So:

- at most ``per_peer`` connections from one peer (an address; see below) and ``total`` in all; one more is closed as
  soon as it is accepted (its descriptor is freed on the loop's next tick), and one tick accepts at
  most ``ACCEPT_BATCH`` connections;
- a connection that has not sent a whole request within ``first_request_s`` is closed (idle and
  half-open ones, or headers sent a byte at a time); between requests uvicorn's keep-alive timeout
  closes an idle one;
- one WARNING line per episode (from the first refused connection until that peer holds none
  over its cap), naming the address and, on Linux, the user holding it.

On loopback every local user's address is 127.0.0.1: where the OS names the user at the other end
(Linux, :func:`~vcam.platform.transport.tcp_peer_uid`, one kernel lookup a connection) a peer is
that address *and* that user, so another user's flood fills its own share and the owner's page
still loads. Elsewhere (Windows, macOS) the cap is per address and shared with the other local
users while one of them holds it: the page may then be refused, but the daemon, its control socket
and OBS go on.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any

from vcam.platform import transport

log = logging.getLogger("vcam.panel")

PER_PEER = 64  # eight tabs or docks hold two long requests each
TOTAL = 256
FIRST_REQUEST_S = 10.0
# How many connections the event loop accepts in one tick (asyncio's server backlog): the refused
# ones of a tick are closed only on the next, so a flood holds at most this many descriptors above
# the caps. uvicorn's default (2,048) let a burst of 1,100 connections take 1,100 descriptors at once
# and run the process out of them. The kernel's queue is then made long again (the server does):
# with a queue of 64, a burst outpacing the loop waits on TCP's 1 s SYN retry.
ACCEPT_BATCH = 64


Peer = tuple[str, int | None]  # an address, and the user at the other end where the OS tells


@dataclass
class Counts:
    """Open connections per peer (:data:`Peer`), and the peers in a refusing episode (one server's)."""

    per_peer: int = PER_PEER
    total: int = TOTAL
    first_request_s: float = FIRST_REQUEST_S
    open: dict[Peer, int] = field(default_factory=dict)
    refusing: dict[Peer, int] = field(default_factory=dict)  # peer -> connections refused this episode

    def admit(self, peer: Peer) -> bool:
        if self.open.get(peer, 0) >= self.per_peer or sum(self.open.values()) >= self.total:
            return False
        self.open[peer] = self.open.get(peer, 0) + 1
        return True

    def release(self, peer: Peer) -> None:
        left = self.open.get(peer, 0) - 1
        if left > 0:
            self.open[peer] = left
        else:
            self.open.pop(peer, None)
        if peer in self.refusing and left < self.per_peer // 2:
            log.debug("panel: %s is under its connection cap again (%d refused)", _named(peer), self.refusing.pop(peer))


def quiet_accept_errors(loop: Any) -> None:
    """The panel's event loop logs its failed accepts (out of descriptors: asyncio logs each with a
    traceback, over and over while it lasts) as one WARNING line per minute, not one per try."""
    last = [0.0]

    def handler(loop_: Any, context: dict) -> None:
        if "accept" not in str(context.get("message", "")):
            loop_.default_exception_handler(context)
            return
        now = loop_.time()
        if now - last[0] >= 60.0:
            last[0] = now
            log.warning("panel: cannot accept connections: %s (the process is out of descriptors?)", context.get("exception"))

    loop.set_exception_handler(handler)


def _peer(transport_: Any) -> Peer:
    """Whom a connection counts against: its address, and on loopback the user holding its other
    end where the OS tells (see the module docstring)."""
    local, peer = transport_.get_extra_info("sockname"), transport_.get_extra_info("peername")
    address = str(peer[0]) if peer else "?"
    try:
        loopback = ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        loopback = False
    return address, transport.tcp_peer_uid(local, peer) if loopback and local else None


def _named(peer: Peer) -> str:
    return peer[0] + (f", user uid {peer[1]}" if peer[1] is not None else "")


def protocol(counts: Counts) -> type:
    """uvicorn's h11 protocol, with :class:`Counts`'s caps and the first-request timeout."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class CappedH11(H11Protocol):
        _peer: Peer | None = None
        _first_timer: Any = None

        def connection_made(self, transport_) -> None:  # type: ignore[override]
            peer = _peer(transport_)
            if not counts.admit(peer):
                if peer not in counts.refusing:
                    counts.refusing[peer] = 0
                    log.warning(
                        "panel: refusing connections from %s: %d open already (at most %d from one peer, %d in all)",
                        _named(peer),
                        counts.open.get(peer, 0),
                        counts.per_peer,
                        counts.total,
                    )
                counts.refusing[peer] += 1
                transport_.abort()  # the descriptor is freed now; connection_lost follows
                return
            self._peer = peer
            super().connection_made(transport_)
            self._first_timer = self.loop.call_later(counts.first_request_s, self._no_request)

        def handle_websocket_upgrade(self, event) -> None:
            # The connection goes on as a WebSocket (another protocol object): it keeps its place
            # under the cap until that one is lost.
            peer, self._peer = self._peer, None
            if self._first_timer is not None:
                self._first_timer.cancel()
                self._first_timer = None
            super().handle_websocket_upgrade(event)
            ws = self.transport.get_protocol()
            lost = ws.connection_lost

            def released(exc) -> None:
                if peer is not None:
                    counts.release(peer)
                lost(exc)

            ws.connection_lost = released  # type: ignore[method-assign]

        def _no_request(self) -> None:
            self._first_timer = None
            if self.cycle is None and self.transport is not None:  # no whole request yet
                self.transport.abort()

        def connection_lost(self, exc) -> None:  # type: ignore[override]
            if self._peer is None:
                return  # refused in connection_made
            counts.release(self._peer)
            self._peer = None
            if self._first_timer is not None:
                self._first_timer.cancel()
                self._first_timer = None
            super().connection_lost(exc)

    return CappedH11
