"""Control channels: OBS Studio (:mod:`.obs`) and the local socket (:mod:`.local`).

Both only post changes to :class:`~vcam.state.RuntimeState` through :func:`apply_command`, so a
command means the same thing whichever way it arrives.
"""

from __future__ import annotations

from vcam.errors import ControlError
from vcam.state import RuntimeState


def apply_command(state: RuntimeState, cmd: dict) -> dict:
    """Apply a control command ``{"face": ..., "swap": ..., "pause": ...}`` and the desk's settings
    (:data:`vcam.control.commands.SETTINGS`, e.g. ``{"mirror": "toggle"}``) to ``state``; shared by
    OBS and the local socket. ``pause``: true (the camera closes, a still card goes out), false
    (resume) or "toggle". Returns ``{"face": active, "swap": "on"|"off", "paused": bool, "settings":
    {key: value}, "choices": {key: [(value, label), ...]}}`` (the settings this run offers, the
    values its choice settings may take). Raises FaceError (unknown face) or ControlError
    (bad command)."""
    from vcam.control.commands import BY_KEY, apply_setting

    unknown = set(cmd) - {"face", "swap", "pause", "status", *BY_KEY}
    if unknown:
        raise ControlError(
            f"unknown command key(s): {', '.join(sorted(map(str, unknown)))}",
            hint="use face, swap, pause, status or " + ", ".join(BY_KEY),
        )
    if "face" in cmd:
        face = cmd["face"]
        if not isinstance(face, str) or not face:
            raise ControlError("'face' must be a face name, 'next' or 'prev'")
        state.set_face(face)
    if "swap" in cmd:
        swap = cmd["swap"]
        if not (isinstance(swap, bool) or (isinstance(swap, str) and swap in ("on", "off", "toggle"))):
            raise ControlError(
                f"'swap' must be on, off or toggle, got {swap!r}", hint="or true/false (JSON booleans, not 0 or 1)"
            )
        state.set_swap(swap)
    if "pause" in cmd:
        pause = cmd["pause"]
        if not (isinstance(pause, bool) or pause == "toggle"):
            raise ControlError(f"'pause' must be true, false or toggle, got {pause!r}", hint="JSON booleans, not 0 or 1")
        state.set_paused(pause)
    for key in BY_KEY:
        if key in cmd:
            apply_setting(state, key, cmd[key])
    return {
        "face": state.active,
        "swap": "on" if state.swap_enabled else "off",
        "paused": state.paused,
        "settings": state.settings,
        "choices": state.choices(),
    }


def short(text: object, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut): names that come from
    outside (OBS events, clients) go into log lines only this way, so a 2 MB name is no 4 MB line."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
