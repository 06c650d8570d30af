"""The client of the control socket (`vcam ctl`, the tests, the panel): one JSON command, one reply,
with the server's uid checked as the server checks ours (or, over loopback TCP, the daemon's token
sent first: :func:`vcam.platform.transport.connect`); a busy daemon (at its connection limit) and a
missing one are told apart, each with the fix."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vcam.control.local import FOLDER_HINT, RUN_HINT
from vcam.errors import ControlError
from vcam.platform import transport


def send_command(path: str | os.PathLike, cmd: dict, timeout: float = 30.0) -> dict:
    """Send one command to the daemon at ``path`` and return its reply.

    Retries while the daemon is busy (its connection backlog is full, or it answers that it is at
    its connection limit) until ``timeout``. Raises ControlError when nothing listens (with a hint to
    start `vcam run`), when the socket or its server belongs to someone else, on a timeout, when it
    stays busy, or when the daemon answers ``ok: false`` (its error and hint are passed on).
    """
    path = Path(path)
    deadline = time.monotonic() + timeout
    pause = 0.01
    while True:
        reply = _exchange(path, cmd, max(0.1, deadline - time.monotonic()))
        if reply is not None and not reply.get("busy"):
            break
        if time.monotonic() + pause >= deadline:
            if reply is not None:  # it answered: at its connection limit
                raise ControlError(
                    f"the vcam daemon at {path} stayed busy for {timeout:g}s: {reply.get('error', 'at its connection limit')}",
                    hint=BUSY_HINT,
                )
            raise ControlError(f"the vcam daemon at {path} stayed busy for {timeout:g}s", hint="retry in a moment")
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "the daemon refused the command"), hint=reply.get("hint"))
    return reply


BUSY_HINT = "retry in a moment; something holds many connections to its control socket open"


# Connected (so a daemon listens) but no answer: it may be at its connection limit, or stuck.
SILENT_HINT = "the daemon is busy (at its connection limit?) or stuck; retry, or see its log"


def _exchange(path: Path, cmd: dict, timeout: float) -> dict | None:
    """One connection: the reply, or None when the daemon could not take it (a full backlog, or the
    connection closed on us unanswered, which a daemon at its limit does to its idlest client):
    try again."""
    try:
        sock = transport.connect(path, timeout)
    except BlockingIOError:  # EAGAIN: the listen backlog is full
        return None
    except transport.ForeignPeer as exc:
        raise ControlError(f"the control socket {path} is served by uid {exc.uid}, not you", hint=FOLDER_HINT) from None
    except (FileNotFoundError, ConnectionRefusedError):
        raise ControlError(f"no vcam daemon listens on {path}", hint=RUN_HINT) from None
    except PermissionError:
        raise ControlError(
            f"permission denied on {path}",
            hint="the control socket belongs to another user; run `vcam ctl` as the user running `vcam run`",
        ) from None
    except TimeoutError:
        raise ControlError(f"the vcam daemon at {path} did not take the connection", hint=SILENT_HINT) from None
    except OSError as exc:
        raise ControlError(f"cannot reach the vcam daemon at {path}: {exc.strerror or exc}", hint=RUN_HINT) from None
    with sock:
        buf = b""
        try:
            try:
                sock.sendall(json.dumps(cmd).encode() + b"\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed before reading (the daemon stopping, say): a reply may still be there
            while b"\n" not in buf:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                buf += chunk
        except (BrokenPipeError, ConnectionResetError):
            if not buf.strip():
                return None  # closed on us unanswered: try again (until the timeout)
        except TimeoutError:
            raise ControlError(f"the vcam daemon at {path} did not answer within {timeout:g}s", hint=SILENT_HINT) from None
        except OSError as exc:
            raise ControlError(f"control socket {path} failed: {exc.strerror or exc}", hint=RUN_HINT) from None
    if not buf.strip():
        return None  # closed unanswered: the daemon stopping, or making room at its connection limit
    try:
        return json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        raise ControlError(f"the vcam daemon at {path} answered something that is not JSON", hint=RUN_HINT) from None
