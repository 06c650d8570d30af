"""``vcam obs ...`` and ``vcam ctl ...``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from vcam.cli.common import ConfigOpt, app
from vcam.cli.common import fail as _fail
from vcam.cli.common import load_config as _config
from vcam.errors import ControlError, VcamError

obs_app = typer.Typer(
    rich_markup_mode="rich", no_args_is_help=True, help="Set up and check OBS Studio control (obs-websocket 5)."
)
ctl_app = typer.Typer(
    rich_markup_mode="rich", no_args_is_help=True, help="Control a running `vcam run` without OBS (local socket)."
)
app.add_typer(obs_app, name="obs", help="Set up and check OBS control (scene, face sources, hotkeys).")
app.add_typer(
    ctl_app, name="ctl", help="Control a running daemon: face, swap on/off, pause, the desk's settings, map people, status."
)

# Plain text: messages name config tables like "[obs]", which rich markup would swallow.
out = Console(markup=False, highlight=False, soft_wrap=True)
err = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def bank_images(faces_dir: Path) -> dict[str, Path]:
    """Face name -> photo path for every usable face of the bank (empty when there is none); a
    damaged face is named on stderr with its fix and left out."""
    from vcam.stages.faces import FaceBank

    entries, damaged = FaceBank(faces_dir).scan()
    for exc in damaged.values():
        err.print(f"note: {exc} (skipped)")
    return {entry.name: Path(entry.photo) for entry in entries}


def map_targets(cfg) -> dict[str, str]:
    """Mapped person -> the face the config gives them (``[[swap.map]]``), by the names vcam uses."""
    from vcam.stages.mapping import face_name

    return {face_name(e["target"]): face_name(e["source"]) for e in cfg.swap.map}


# --- vcam obs ----------------------------------------------------------------------------------


@obs_app.command("setup")
def obs_setup(
    add_camera_source: bool = typer.Option(
        False, "--add-camera-source", help="Also add a Video Capture Device source for the virtual camera to the current scene."
    ),
    add_obs_source: bool = typer.Option(
        False,
        "--add-obs-source",
        help="Also add the direct OBS source (a Browser Source on vcam's frames) to the current scene; "
        'on by itself with \\[obs] source = true or \\[output] target = "obs-source".',
    ),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Create the "FastSwap Faces" scene (one source per face) and one per mapped person; print the
    hotkeys. With several streams in the config, one "FastSwap Faces (NAME)" scene per stream.
    With the direct OBS source on, add its Browser Source ("FastSwap Source") to the current scene."""
    from urllib.parse import urlencode

    from vcam.control.obs_scene import BROWSER_SOURCE, add_browser_source, connect, setup_scene
    from vcam.runtime.panel import obs_source_address

    cfg = None
    try:
        cfg = _config(config)
        faces = bank_images(cfg.faces_dir)
        if not faces:
            err.print("note: the face bank is empty; add faces with `vcam faces add PHOTO` and run this again")

        def camera_device(label: str) -> str | None:
            if not add_camera_source:
                return None
            from vcam.devices import find_virtual_camera

            cam = find_virtual_camera(label)
            return cam.path if cam is not None else None

        client = connect(cfg.obs)
        reports = []
        try:
            # One control scene per stream when the config runs several ([[streams]]).
            streams = cfg.per_stream()
            for name, scfg in streams:
                obs = cfg.obs.for_stream(name, len(streams))
                reports.append(
                    setup_scene(
                        client,
                        faces,
                        scene=obs.scene,
                        status_source=obs.status_source,
                        add_camera_source=add_camera_source,
                        camera_name=scfg.output.device_name,
                        camera_device=camera_device(scfg.output.device_name),
                        targets=map_targets(cfg),
                    )
                )
                if add_obs_source or cfg.obs_source:
                    url, width, height = obs_source_address(cfg)
                    if len(streams) > 1:
                        url += "&" + urlencode({"stream": name})
                    label = BROWSER_SOURCE if len(streams) == 1 else f"{BROWSER_SOURCE} ({name})"
                    add_browser_source(client, reports[-1], url, width, height, label)
        finally:
            client.disconnect()
    except Exception as exc:
        if not isinstance(exc, VcamError):  # the websocket dropped half-way
            exc = ControlError(
                f"OBS stopped answering during setup ({type(exc).__name__}: {exc})",
                hint="check OBS is still running and try again",
            )
        if cfg is not None:  # the panel's dock needs no OBS connection: its steps all the same
            for line in dock_lines(cfg):
                out.print(line, highlight=False)
        _fail(exc)
    for report in reports:
        for line in report.lines():
            out.print(line, highlight=False)
    if not cfg.obs.enabled:
        out.print("Then set [obs] enabled = true in config.toml so `vcam run` connects.", highlight=False)
    for line in dock_lines(cfg):
        out.print(line, highlight=False)


def dock_lines(cfg) -> list[str]:
    """How to add the control panel as an OBS dock. obs-websocket has no request that adds a dock,
    and OBS rewrites its own settings files on exit, so the steps are printed with the link to paste
    (a fresh one-time link of the running daemon's, never its token; see vcam.panel.access)."""
    import time

    from vcam.panel.access import ONCE_TTL, once_url, read_panel_file

    if not cfg.panel.enabled:
        return ["The control panel is off ([panel] enabled = false): no dock to add."]
    try:
        data = read_panel_file(cfg.panel_file)
    except VcamError as exc:
        return [f"error: {exc.message} ({exc.hint})"]
    url = once_url(data["url"], str(data.get("token", "")), time.time()) if data else None
    lines = [
        "Control panel dock: in OBS, Docks -> Custom Browser Docks..., Dock Name: vcam, URL:",
        f"  {url}" if url else "  (start `vcam run`, then `vcam panel` prints a link to paste)",
        f"  then Apply within {int(ONCE_TTL) // 60} minutes (a link opens the panel once; `vcam panel` prints a fresh one);"
        " the dock can be moved beside the preview.",
        "  An open dock follows every `vcam run` by itself. After OBS restarts, the dock says its link was used:"
        " paste a fresh one from `vcam panel` there"
        + (" (or set [panel] keep_token = true: see README's panel section)." if not cfg.panel.keep_token else "."),
    ]
    return lines


@obs_app.command("status")
def obs_status(config: Optional[Path] = ConfigOpt) -> None:
    """Say whether OBS is reachable and the control scene is set up."""
    from vcam.control.obs_scene import obs_check

    try:
        cfg = _config(config)
    except VcamError as exc:
        _fail(exc)
    ok, message = obs_check(cfg)
    out.print(message, highlight=False, soft_wrap=True)
    if not ok:
        raise typer.Exit(ControlError.exit_code)


# --- vcam ctl ----------------------------------------------------------------------------------


@ctl_app.callback()
def ctl_main(
    stream: Optional[str] = typer.Option(
        None, "--stream", help="A daemon running several streams: act on stream NAME only (default: every stream)."
    ),
) -> None:
    """Control a running `vcam run` without OBS (local socket)."""


def _stream(ctx: typer.Context | None) -> str | None:
    """The ``vcam ctl --stream NAME`` of this command line (None: every stream)."""
    while ctx is not None:
        if "stream" in ctx.params:
            return ctx.params["stream"]
        ctx = ctx.parent
    return None


def _send(config: Optional[Path], cmd: dict, ctx: typer.Context | None = None) -> dict:
    from vcam.control.client import send_command

    stream = _stream(ctx)
    if stream:
        cmd = {**cmd, "stream": stream}
    try:
        cfg = _config(config)
        return send_command(cfg.socket_path, cmd)
    except VcamError as exc:
        _fail(exc)
    raise AssertionError("unreachable")


@ctl_app.command("face")
def ctl_face(
    ctx: typer.Context, name: str = typer.Argument(..., help="A face name, 'next' or 'prev'."), config: Optional[Path] = ConfigOpt
) -> None:
    """Switch the active face."""
    reply = _send(config, {"face": name}, ctx)
    out.print(f"face: {reply['face']}", highlight=False)


@ctl_app.command("swap")
def ctl_swap(
    ctx: typer.Context, value: str = typer.Argument(..., help="on, off or toggle."), config: Optional[Path] = ConfigOpt
) -> None:
    """Turn swapping on or off (off passes the camera through)."""
    if value not in ("on", "off", "toggle"):
        _fail(ControlError(f"swap must be on, off or toggle, got '{value}'"))
    reply = _send(config, {"swap": value}, ctx)
    out.print(f"swap: {reply['swap']}", highlight=False)


@ctl_app.command("pause")
def ctl_pause(ctx: typer.Context, config: Optional[Path] = ConfigOpt) -> None:
    """Pause: the camera is closed (its light goes off) and the virtual camera shows a still card;
    the models stay loaded, so `vcam ctl resume` swaps again within a fraction of a second."""
    _pause_line(_send(config, {"pause": True}, ctx))


@ctl_app.command("resume")
def ctl_resume(ctx: typer.Context, config: Optional[Path] = ConfigOpt) -> None:
    """Resume after `vcam ctl pause`: the camera is opened again and swapped frames go out."""
    _pause_line(_send(config, {"pause": False}, ctx))


def _pause_line(reply: dict) -> None:
    streams = reply.get("streams")
    if isinstance(streams, dict) and len(streams) > 1:
        for name, r in streams.items():
            out.print(f"{name}: {'paused' if r.get('paused') else 'running'}", highlight=False)
    else:
        out.print("paused" if reply.get("paused") else "running", highlight=False)


def _setting_command(setting) -> None:
    """`vcam ctl KEY VALUE` for one row of :data:`vcam.control.commands.SETTINGS` (``audio_sync``
    is ``vcam ctl audio-sync on``)."""
    what = "on, off or toggle" if setting.kind == "switch" else "a number from 0 to 1"

    def command(
        ctx: typer.Context, value: str = typer.Argument(..., help=what.capitalize() + "."), config: Optional[Path] = ConfigOpt
    ) -> None:
        reply = _send(config, {setting.key: value}, ctx)
        streams = reply.get("streams")
        rows = streams.items() if isinstance(streams, dict) and len(streams) > 1 else [("", reply)]
        for name, r in rows:
            held = (r.get("settings") or {}).get(setting.key)
            shown = ("on" if held else "off") if setting.kind == "switch" else f"{held:g}"
            out.print(f"{name + ': ' if name else ''}{setting.key.replace('_', '-')}: {shown}", highlight=False)

    command.__doc__ = setting.help.replace("[", "\\[")  # rich markup would swallow "[obs]"
    ctl_app.command(setting.key.replace("_", "-"))(command)


def _choice_command(setting) -> None:
    """`vcam ctl KEY list` and `vcam ctl KEY set N` for a choice row (the camera)."""
    name = setting.key.replace("_", "-")

    def command(
        ctx: typer.Context,
        action: str = typer.Argument(..., help="list, or set."),
        value: Optional[str] = typer.Argument(None, help=f"With set: the {setting.label}'s number (or name), as list shows it."),
        config: Optional[Path] = ConfigOpt,
    ) -> None:
        if action not in ("list", "set") or (action == "set") != (value is not None):
            _fail(ControlError(f"use `vcam ctl {name} list` or `vcam ctl {name} set N`, got {action!r}"))
        reply = _send(config, {setting.key: "list" if action == "list" else value}, ctx)
        streams = reply.get("streams")
        rows = streams.items() if isinstance(streams, dict) and len(streams) > 1 else [("", reply)]
        for stream, r in rows:
            held = (r.get("settings") or {}).get(setting.key)
            listed = (r.get("choices") or {}).get(setting.key) or []
            prefix = f"{stream}: " if stream else ""
            if action == "list":
                for number, label in listed:
                    mark = "*" if number == held else " "
                    out.print(f"{prefix}{mark} {number:>2}  {label}", highlight=False)
            else:
                label = next((lb for n, lb in listed if n == held), "")
                out.print(f"{prefix}{name}: {held} ({label})", highlight=False)

    command.__doc__ = setting.help.replace("[", "\\[") + " `list` marks the one in use with *."
    ctl_app.command(name)(command)


def _setting_commands() -> None:
    from vcam.control.commands import SETTINGS

    for setting in SETTINGS:
        (_choice_command if setting.kind == "choice" else _setting_command)(setting)


_setting_commands()


def _mapping_lines(mappings: dict) -> list[str]:
    return [f"map: {t} -> {s}" for t, s in mappings.items()] or ["map: none (every face follows the default)"]


@ctl_app.command("map")
def ctl_map(
    ctx: typer.Context,
    target: str = typer.Argument(..., help="The person: a target already mapped, a face-bank name or a photo of them."),
    source: str = typer.Argument(..., help="The face they get: a face-bank name."),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Give one person in frame their own face (needs a run started with --map or swap.map entries)."""
    from vcam.stages.mapping import is_photo_arg

    if is_photo_arg(target) and Path(target).expanduser().is_file():
        target = str(Path(target).expanduser().resolve())  # the daemon runs in another folder
    reply = _send(config, {"map": {"target": target, "source": source}}, ctx)
    for line in _mapping_lines(reply.get("mappings", {})):
        out.print(line, highlight=False)


@ctl_app.command("unmap")
def ctl_unmap(
    ctx: typer.Context,
    target: str = typer.Argument(..., help="A mapped target (see `vcam ctl status`)."),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Drop a person's mapping: they follow the default again (swap.unmatched)."""
    from vcam.stages.mapping import face_name

    reply = _send(config, {"unmap": face_name(target)}, ctx)  # a photo's target goes by its file name
    for line in _mapping_lines(reply.get("mappings", {})):
        out.print(line, highlight=False)


@ctl_app.command("status")
def ctl_status(ctx: typer.Context, config: Optional[Path] = ConfigOpt) -> None:
    """Print the daemon's state, mappings and live numbers as JSON (on stderr also: NaN/Inf guard
    counts, the GPU reading and the stages turned off under load)."""
    from vcam.state import guard_text
    from vcam.status import degraded_text, overloaded_text
    from vcam.telemetry import GpuSample, throttle_warning

    reply = _send(config, {"status": True}, ctx)
    reply.pop("ok", None)
    typer.echo(json.dumps(reply, indent=2))
    status = reply.get("status", {})
    for note in status.get("engines") or []:  # swapper: remote gpu-box:8001 down since 12:01:03
        err.print(f"note: {note}")
    guarded = status.get("guarded")
    if isinstance(guarded, dict) and guard_text(guarded):
        err.print(f"note: {guard_text(guarded)} (faces passed through unswapped: the model produced NaN/Inf)")
    gpu = status.get("gpu")
    if isinstance(gpu, dict):
        sample = GpuSample.from_dict(gpu)
        err.print(f"note: {sample.name + ': ' if sample.name else ''}{sample.text()}")
        if warning := throttle_warning(sample):
            err.print(f"note: {warning}")
    degraded = status.get("degraded")
    if status.get("overloaded"):
        late = status.get("published_late", 0)
        err.print(f"note: {overloaded_text(degraded or [])} ({late} frames published over the latency budget so far)")
    elif isinstance(degraded, list) and degraded:
        err.print(f"note: {degraded_text(degraded)} (turned off under sustained load; back on once there is headroom)")
