"""The desk's settings: one table that the panel, `vcam ctl` and OBS custom events all read.

Each :class:`Setting` is a JSON key of the control protocol (``{"mirror": "toggle"}`` over the
local socket, ``{"vcam": {"mirror": "toggle"}}`` as an OBS custom event), a `vcam ctl KEY VALUE`
command and a control in the panel, so a new setting is one row here plus what the frame loop does
with it. A run offers the settings it can honour (:meth:`vcam.state.RuntimeState.offer`, at start-up
from the config); a setting it does not offer is refused with the row's ``hint``, which says what
turns it on.

Kinds: ``switch`` takes true/false or "on"/"off"/"toggle" and holds a bool; ``amount`` takes a
number from 0 to 1 (not a boolean) and holds a float; ``choice`` takes one of the values the run
lists for it (:meth:`vcam.state.RuntimeState.choices`, e.g. the cameras' numbers; a number given
as text is read as one, a label as its value) and holds it, or "list", which lists them again and changes nothing
(every reply carries ``choices``: key -> [[value, label], ...]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vcam.errors import ControlError
from vcam.state import RuntimeState


@dataclass(frozen=True)
class Setting:
    """One row of the table: ``key`` (the protocol's, the panel's and `vcam ctl`'s), ``kind``,
    ``label`` (the panel's), ``help`` (one line: what it does) and ``hint`` (what offers it in a run
    that does not)."""

    key: str
    kind: Literal["switch", "amount", "choice"]
    label: str
    help: str
    hint: str


_RESTART = " and restart `vcam run`"
SETTINGS: tuple[Setting, ...] = (
    Setting(
        "enhancer",
        "switch",
        "enhancer",
        "Run the face enhancer ([swap] enhancer) over the swapped faces (off: faster, softer).",
        "set [swap] enhancer (e.g. 'gfpgan_1.4')" + _RESTART,
    ),
    Setting(
        "enhancer_amount",
        "amount",
        "amount",
        "How much of the enhanced face is blended in, 0 to 1 ([swap] enhancer_amount).",
        "set [swap] enhancer (e.g. 'gfpgan_1.4')" + _RESTART,
    ),
    Setting(
        "mouth_mask",
        "switch",
        "mouth",
        "Keep the person's own mouth (the 'mouth' mask: lips as they speak, teeth, tongue).",
        "set [mask] types to more than 'box' (e.g. ['box', 'face'])" + _RESTART,
    ),
    Setting(
        "occlusion_mask",
        "switch",
        "occlusion",
        "Keep hands, glasses and microphones in front of the face (the 'occlusion' mask's model).",
        "add 'occlusion' to [mask] types (it loads the occluder model)" + _RESTART,
    ),
    Setting(
        "mirror",
        "switch",
        "mirror",
        "Flip the published picture left to right (the panel's preview too).",
        "mirror needs a running `vcam run`",
    ),
    Setting(
        "record",
        "switch",
        "record",
        "Record the published picture to a new file in [output] record_dir while on (off: the file is finished).",
        "recording is for a live `vcam run` (a file conversion writes a file already)",
    ),
    Setting(
        "camera",
        "choice",
        "camera",
        "Switch the stream's camera live (N as `vcam devices` lists it; 'list' lists them again).",
        "camera selection is for a live `vcam run` (a file converted keeps its input)",
    ),
    Setting(
        "before_after",
        "switch",
        "before/after",
        "Show the camera as it came beside the swapped picture in the panel's preview (never in the output).",
        "the before/after view is the panel's: start `vcam run` with the panel on ([panel] enabled = true)",
    ),
    Setting(
        "audio_sync",
        "switch",
        "audio sync",
        "Keep OBS's audio sync offset of the [obs] audio_sync inputs at the video's delay (off: their own offset back).",
        "list OBS audio inputs in [obs] audio_sync (with [obs] enabled = true) and restart `vcam run`",
    ),
)

BY_KEY = {s.key: s for s in SETTINGS}
SWITCH_WORDS = ("on", "off", "toggle")
LIST = "list"


def parse(setting: Setting, value: object, current: object, choices: Sequence[tuple[object, str]] = ()) -> object:
    """``value`` as ``setting`` holds it (``current``: its value now, for "toggle"; ``choices``: a
    choice setting's values); ControlError naming what is accepted otherwise."""
    if setting.kind == "choice":
        return _choice(setting, value, choices)
    if setting.kind == "switch":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value in SWITCH_WORDS:
            return not bool(current) if value == "toggle" else value == "on"
        raise ControlError(
            f"'{setting.key}' must be on, off or toggle, got {value!r}", hint="or true/false (JSON booleans, not 0 or 1)"
        )
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ControlError(f"'{setting.key}' must be a number from 0 to 1, got {value!r}", hint="e.g. 0.5")
    return float(value)


def _choice(setting: Setting, value: object, choices: Sequence[tuple[object, str]]) -> object:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    elif isinstance(value, str):  # a choice by its label ("demo": the run's own input, no number to type)
        value = next((v for v, label in choices if label == value), value)
    values = [v for v, _ in choices]
    if isinstance(value, bool) or value not in values:
        listed = ", ".join(f"{v} ({label})" for v, label in choices) or "none found"
        raise ControlError(f"no {setting.label} {value!r} in this run", hint=f"choose one of: {listed}")
    return value


def apply_setting(state: RuntimeState, key: str, value: object) -> object:
    """Set ``key`` of ``state`` to ``value`` (parsed by its row); returns the value held ("list" for
    a choice setting: its values listed again, nothing changed). Raises ControlError for a value the
    row refuses or a setting this run does not offer, and what the setting's change raises (a
    camera that cannot be opened: InputError), the setting unchanged."""
    setting = BY_KEY[key]
    offered = state.settings
    if key not in offered:
        raise ControlError(f"{setting.label} is not available in this run", hint=setting.hint)
    if setting.kind == "choice" and value == LIST:
        state.refresh_choices(key)
        return offered[key]
    return state.set_setting(key, parse(setting, value, offered[key], state.choices().get(key, [])))
