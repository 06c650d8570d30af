"""``vcam run``, ``vcam check``, ``vcam devices`` and ``vcam config``."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from vcam.cli.common import ConfigOpt, app, console, fail, load_config, out
from vcam.errors import ConfigError, ModelError, VcamError


def _parse_maps(values: list[str]) -> list[dict]:
    out = []
    for v in values:
        target, sep, source = v.partition("=")
        if not sep or not target.strip() or not source.strip():
            fail(
                ConfigError(
                    f"--map: expected TARGET=SOURCE, got {v!r}", hint="e.g. --map alice=grace (bank names or photo paths)"
                )
            )
        out.append({"target": target.strip(), "source": source.strip()})
    return out


STREAM_FORM = "INPUT=OUTPUT[,name=NAME][,face=FACE][,max_latency=33ms]"


def parse_stream_flags(values: list[str]) -> list[dict]:
    """``--stream`` values -> ``[[streams]]`` rows. ``INPUT=OUTPUT`` splits at the first '='; the
    options are the trailing ``,key=value`` parts whose key is a stream key (so a path may hold
    commas)."""
    from vcam.config import STREAM_KEYS

    rows = []
    for v in values:
        opts: dict[str, str] = {}
        head = v
        while True:
            base, sep, tail = head.rpartition(",")
            key, eq, val = tail.partition("=")
            if not sep or not eq or key.strip() not in STREAM_KEYS or key.strip() in ("input", "output"):
                break
            opts[key.strip()] = val.strip()
            head = base
        inp, sep, outp = head.partition("=")
        if not sep or not inp.strip() or not outp.strip():
            fail(
                ConfigError(
                    f"--stream: expected {STREAM_FORM}, got {v!r}",
                    hint="e.g. --stream webcam:0=vcam --stream demo=file:out.mp4,name=demo",
                )
            )
        rows.append({"input": inp.strip(), "output": outp.strip(), **opts})
    return rows


def _print_summaries(daemon: Any, summary: Any, several: bool) -> None:
    """The run's summary lines: one per stream and the total with several, and each output."""
    if several:
        for name, s in daemon.summaries.items():
            console.print(escape(f"[{name}] {s.line()}"), highlight=False, soft_wrap=True)
            if s.error:
                console.print(escape(f"[{name}] error: {s.error}"), highlight=False, soft_wrap=True)
        total = sum(s.frames_out for s in daemon.summaries.values())
        secs = max((s.seconds for s in daemon.summaries.values()), default=0.0)
        console.print(
            f"all {len(daemon.summaries)} streams: {total} frames published ({total / secs if secs else 0:.1f} fps in all)",
            highlight=False,
        )
    else:
        console.print(summary.line(), highlight=False, soft_wrap=True)
    for name, s in daemon.summaries.items():
        if s.output:
            console.print(escape(f"{f'[{name}] ' if several else ''}output: {s.output}"), highlight=False, soft_wrap=True)


@app.command()
def run(
    input: Optional[str] = typer.Option(None, "--input", "-i", help="webcam[:N] | PATH (video or image) | demo | pattern"),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="vcam | file:PATH | window | null | obs-source"),
    face: Optional[str] = typer.Option(None, "--face", "-f", help="Source face: a face-bank NAME or a photo PATH."),
    pick: Optional[int] = typer.Option(
        None, "--pick", "-k", min=1, help="Which face of a --face photo holding several (1 = leftmost)."
    ),
    swapper: Optional[str] = typer.Option(None, "--swapper", "--model", help="classic (default) or a swapper model name."),
    detector: Optional[str] = typer.Option(
        None, "--detector", help="retinaface_mnet025 (built in, default) or a detector model name."
    ),
    fp16: Optional[bool] = typer.Option(None, "--fp16/--fp32", help="FP16 inference (GPU only)."),
    fp32_swapper: bool = typer.Option(False, "--fp32-swapper", help="The swapper alone in FP32 (FP16 artefacts)."),
    mask: Optional[str] = typer.Option(None, "--mask", help="Paste masks, e.g. box,face,mouth,eyes,occlusion,region."),
    map_: Optional[list[str]] = typer.Option(
        None, "--map", help="TARGET=SOURCE: the person TARGET (bank name or photo) gets face SOURCE; repeatable."
    ),
    stream: Optional[list[str]] = typer.Option(
        None, "--stream", help=f"Several streams in one daemon, one flag each: {STREAM_FORM} (models shared, faces batched)."
    ),
    upscale: Optional[str] = typer.Option(None, "--upscale", help="Frame enhancer model, e.g. real_esrgan_x2 ('' : off)."),
    max_latency: Optional[str] = typer.Option(
        None, "--max-latency", help="Drop frames older than this at publish, e.g. 33ms (0: off)."
    ),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda"),
    backend: Optional[str] = typer.Option(None, "--backend", help="auto | tensorrt | torch | onnxruntime"),
    decode: Optional[str] = typer.Option(None, "--decode", help="Where MJPG input is decoded: auto | gpu | cpu."),
    compile: Optional[str] = typer.Option(
        None,
        "--compile",
        help="Compiled swap network: auto (load; on a GPU build what is missing in the background) | background | load | "
        "build (before swapping) | off.",
    ),
    frames: Optional[int] = typer.Option(None, "--frames", min=1, help="Stop after this many input frames."),
    duration: Optional[str] = typer.Option(None, "--duration", help="Stop after this long, e.g. 10s."),
    no_loop: bool = typer.Option(False, "--no-loop", help="Play video files and the demo clip once."),
    fast: bool = typer.Option(False, "--fast", help="Files, images, demo: every frame, as fast as the pipeline goes."),
    realtime: bool = typer.Option(False, "--realtime", help="Files, images, demo: at their frame rate, newest frame wins."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", help="No live status line, conversion progress or panel link (`vcam panel` prints one)."
    ),
    panel: Optional[str] = typer.Option(
        None, "--panel", help="The control panel's port (0: any free port), or 'off' (default: \\[panel], on at 8765)."
    ),
    chroma: Optional[str] = typer.Option(
        None, "--chroma", help="File output: 420 (default, plays everywhere; odd sizes padded) or 444 (exact size)."
    ),
    download: Optional[bool] = typer.Option(
        None, "--download/--no-download", help="Download missing models without asking (default: ask on a terminal)."
    ),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Run the face-swap daemon: capture, swap, publish. Ctrl-C stops cleanly (twice: force)."""
    from vcam.runtime.startup import import_ahead

    import_ahead()  # the load's libraries, from the start on
    # Each flag names the config key it overrides; a flag left out keeps the file's value.
    flags = {
        ("capture", "input"): ("--input", input),
        ("capture", "loop"): ("--no-loop", False if no_loop else None),
        ("capture", "pacing"): ("--fast" if fast else "--realtime", "fast" if fast else ("realtime" if realtime else None)),
        ("output", "target"): ("--output", output),
        ("swap", "source"): ("--face", face),
        ("swap", "pick"): ("--pick", pick),
        ("swap", "swapper"): ("--swapper", swapper),
        ("detect", "model"): ("--detector", detector),
        ("pipeline", "fp16"): ("--fp16", fp16),
        ("swap", "fp32"): ("--fp32-swapper", True if fp32_swapper else None),
        ("mask", "types"): ("--mask", mask),
        ("swap", "map"): ("--map", _parse_maps(map_) if map_ else None),
        ("upscale", "model"): ("--upscale", upscale),
        ("pipeline", "max_latency"): ("--max-latency", max_latency),
        ("pipeline", "device"): ("--device", device),
        ("pipeline", "backend"): ("--backend", backend),
        ("capture", "decode"): ("--decode", decode),
        ("pipeline", "compile"): ("--compile", compile),
        ("models", "allow_download"): ("--download", download),
        ("output", "chroma"): ("--chroma", chroma),
        **_panel_flags(panel),
    }
    _refuse_contradictions(fast=fast, realtime=realtime, streams=bool(stream), pair=input is not None or output is not None)
    _serve(_config(config, flags, stream), frames, _duration(duration), quiet=quiet, download=download)


def _refuse_contradictions(*, fast: bool, realtime: bool, streams: bool, pair: bool) -> None:
    """One line for flags that contradict each other: ``--fast`` with ``--realtime``, ``--stream``
    with ``--input``/``--output`` (``pair``)."""
    if fast and realtime:
        fail(ConfigError("--fast and --realtime contradict each other", hint="pass one of them"))
    if streams and pair:
        fail(ConfigError("--stream replaces --input and --output", hint="give every input/output pair as a --stream"))


def _config(path: Path | None, flags: dict[tuple[str, str], tuple[str, Any]], stream: list[str] | None) -> Any:
    """The config file at ``path`` with the flags given (``(table, key) -> (flag, value)``, None:
    left out) and the ``--stream`` rows over it."""
    overrides: dict[str, dict] = {}
    labels = {}
    for (table, key), (flag, value) in flags.items():
        if value is not None:
            overrides.setdefault(table, {})[key] = value
            labels[(table, key)] = flag
    cfg = load_config(path, overrides, labels)
    if stream:
        from vcam.config_file import parse_streams

        try:
            cfg = cfg.replace(streams=parse_streams(parse_stream_flags(stream), "--stream"))
        except VcamError as err:
            fail(err)
    return cfg


def _duration(text: str | None) -> float | None:
    """``--duration`` in seconds (None: no limit)."""
    from vcam.config import Duration

    try:
        return float(Duration.parse(text)) if text else None
    except ValueError:
        fail(
            ConfigError(f"--duration: expected a duration like '10s', got {text!r}", hint="e.g. --duration 10s or --duration 2m")
        )


def _panel_flags(panel: str | None) -> dict[tuple[str, str], tuple[str, Any]]:
    """``--panel PORT|off`` as the config keys it overrides (none when it is left out)."""
    if panel is None:
        return {}
    value = panel.strip().lower()
    if value == "off":
        return {("panel", "enabled"): ("--panel", False)}
    if value.isdigit() and int(value) <= 65535:
        return {("panel", "enabled"): ("--panel", True), ("panel", "port"): ("--panel", int(value))}
    fail(ConfigError(f"--panel: expected a port number or 'off', got {panel!r}", hint="e.g. --panel 8765 or --panel off"))


def _serve(cfg: Any, frames: int | None, duration: float | None, *, quiet: bool, download: bool | None) -> None:
    """The daemon of ``cfg`` run to its end (asking once, on a terminal, before a first download of
    missing models), its summary printed; the process's exit code from how it ended."""
    from vcam.runtime.daemon import Daemon

    status_line = _StatusLine(enabled=not quiet)
    several = len(cfg.streams) > 1
    for attempt in (1, 2):
        daemon = Daemon(
            cfg,
            on_status=None if several else status_line.update,
            on_stream_status=status_line.update_stream if several else None,
            panel=True,
            announce=None if quiet else _announce,  # quiet: `vcam panel` still prints the URL
        )
        status_line.summaries = lambda d=daemon: d.summaries
        try:
            with status_line:
                summary = daemon.run(max_frames=frames, duration=duration)
                # Stopped by a signal and finished: only the summary is left. A second signal now
                # would land in vcam.__main__'s early handler wherever the code is (inside an
                # import's callbacks its SystemExit is printed as ignored, with a traceback).
                if daemon.signalled:
                    _ignore_stop_signals()
            break
        except ModelError as err:
            # First use of a neural model: ask before downloading (only on a terminal, only once).
            ask = attempt == 1 and download is None and sys.stdin.isatty() and err.message.startswith("missing model files")
            if ask and typer.confirm(f"{err.message}. Download them now?", default=False, err=True):
                cfg = cfg.replace(models=replace(cfg.models, allow_download=True))
                continue
            fail(err)
        except VcamError as err:
            fail(err)
        except BaseException:
            # A second Ctrl-C: leave now, so no native thread still loading a model can abort the
            # exit (the second signal left the file outputs playable). Its SystemExit may come out
            # as another error: raised inside threading's own locking (a thread being started) it
            # was RuntimeError("release unlocked lock"), a traceback and exit 1 in a busy suite.
            if daemon.force_exit:
                _ignore_stop_signals()
                _leave(130)
            raise
    _print_summaries(daemon, summary, several)
    if summary.models:
        console.print(f"models: {summary.models}", highlight=False, soft_wrap=True)
    # A conversion stopped by Ctrl-C before its end: 130, as for any interrupted command (its file
    # is kept as NAME.partial.mp4, never under the name asked for).
    code = 130 if daemon.force_exit or any(s.interrupted for s in daemon.summaries.values()) else 0
    # Stopped while the models loaded: leave without unwinding under the load. A forced exit whose
    # SystemExit was swallowed on its way out (raised inside a callback) leaves the same way: once
    # in a busy full suite such a run went on to the interpreter's end and aborted there
    # ("terminate called without an active exception": a native thread of the load still running).
    if daemon.load_in_flight or daemon.force_exit:
        _leave(code)
    if code:
        raise typer.Exit(code)


def _leave(code: int) -> None:
    """End the process now (``os._exit``), what was printed flushed: no unwinding under a native load."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _announce(line: str) -> None:
    """One line for the user from the daemon (the panel's URL), printed once on stderr."""
    console.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command("panel")
def panel_cmd(
    open_: bool = typer.Option(False, "--open", help="Open it in the default browser instead of printing it."),
    config: Optional[Path] = ConfigOpt,
) -> None:
    """Print a fresh link to the running daemon's control panel (it opens the panel once, within 2
    minutes; it never holds the token), or open it."""
    import time

    from vcam.panel.access import once_url, read_panel_file
    from vcam.platform import process

    cfg = load_config(config)
    try:
        data = read_panel_file(cfg.panel_file)
    except VcamError as exc:
        fail(exc)
    pid = data.get("pid") if data else None
    alive = isinstance(pid, int) and process.alive(pid)
    if data is None or not alive:
        fail(
            VcamError(
                f"no running vcam serves a panel (nothing at {cfg.panel_file})",
                hint="start `vcam run` (the panel is on unless [panel] enabled = false or --panel off)",
            )
        )
    url = once_url(data["url"], str(data.get("token", "")), time.time())
    if open_:
        import webbrowser

        if not webbrowser.open(url):
            fail(VcamError("no browser could be opened here", hint="run `vcam panel` and open the URL it prints"))
        return
    out.print(url, highlight=False, markup=False, soft_wrap=True)


def _ignore_stop_signals() -> None:
    """The stop signals ignored from here on (the stop is under way)."""
    from vcam.platform import signals

    signals.ignore()


class _StatusLine:
    """One live line: fps in/out, latency p50/p99, drops, faces, active face. A conversion (every
    frame of a file, to its end) adds a progress bar on a terminal (frames done / total, fps, ETA)
    and prints a plain progress line every ``plain_every`` seconds elsewhere; ``enabled`` False
    (``--quiet``) shows neither."""

    def __init__(self, enabled: bool, plain_every: float = 5.0) -> None:
        self.quiet = not enabled
        self.enabled = enabled and console.is_terminal
        self.plain_every = plain_every
        self.summaries: Any = lambda: {}
        self._live = None
        self._lines: dict[str, str] = {}
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._last_plain = 0.0
        self._text = ""  # the status text last shown under the bar

    def __enter__(self):
        if self.enabled:
            from rich.live import Live

            self._live = Live("starting...", console=console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            # The bar ends where the run did; a conversion over before the first status update
            # still shows its bar, at the run's own rate.
            summaries = self.summaries() or {}
            for name in list(self._tasks) or ([""] if len(summaries) == 1 else list(summaries)):
                s = summaries.get(name) if name else next(iter(summaries.values()), None)
                if s is not None and s.frames_total is not None:
                    fps = s.frames_out / s.seconds if s.seconds > 0 else 0.0
                    self._bar(name, s.frames_total, s.frames_out, fps)
            if self._progress is not None:
                self._show(self._text)
            self._live.__exit__(*exc)

    def update(self, status, active: str | None, swap: bool) -> None:
        self._advance("", status)
        self._show(format_status(status, active, swap))

    def update_stream(self, name: str, status, active: str | None, swap: bool) -> None:
        """Several streams: one line each, named."""
        self._advance(name, status)
        self._lines[name] = f"[bold]{escape(name)}[/] " + format_status(status, active, swap)
        self._show("\n".join(self._lines.values()), self._lines[name])

    def _advance(self, name: str, status) -> None:
        """A conversion's progress: the bar on a terminal, a plain line now and then elsewhere."""
        if self.quiet:
            return
        summaries = self.summaries()
        summary = summaries.get(name) if name else next(iter(summaries.values()), None)
        total = summary.frames_total if summary is not None else None
        if total is None:
            return
        done = status.frames_out
        if self.enabled:
            self._bar(name, total, done, status.fps_out)
            return
        import time

        now = time.monotonic()
        if now - self._last_plain < self.plain_every:
            return
        self._last_plain = now
        fps = status.fps_out
        eta = f"{(total - done) / fps:.0f} s" if fps > 0 else "unknown"
        label = f"[{name}] " if name else ""
        console.print(
            escape(
                f"{label}converting: {done} of {total} input frames ({100 * done / max(total, 1):.0f}%), {fps:.1f} fps, ETA {eta}"
            ),
            highlight=False,
            soft_wrap=True,
        )

    def _bar(self, name: str, total: int, done: int, fps: float) -> None:
        """The terminal's progress bar: one task a converted stream."""
        if self._progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("frames {task.fields[fps]:.1f} fps  ETA"),
                TimeRemainingColumn(),
                console=console,
                auto_refresh=False,
            )
        if name not in self._tasks:
            self._tasks[name] = self._progress.add_task(name or "converting", total=total, fps=0.0)
        self._progress.update(self._tasks[name], completed=done, total=total, fps=fps)

    def _show(self, text: str, line: str | None = None) -> None:
        if self._live is not None:
            self._text = text
            if self._progress is not None:
                from rich.console import Group

                self._live.update(Group(self._progress, text))
            else:
                self._live.update(text)
        elif not console.is_terminal:  # a log line: the text without its markup
            from rich.text import Text

            logging.getLogger("vcam.status").info("%s", Text.from_markup(line or text).plain)


def format_status(status, active: str | None, swap: bool) -> str:
    from vcam.status import status_suffix

    budget = " [bold red]OVER LATENCY BUDGET[/]" if status.over_budget else ""
    face = active or "none (pass-through)"
    return (
        f"in {status.fps_in:5.1f} fps | out {status.fps_out:5.1f} fps | latency p50 {status.latency_p50_ms:5.1f} ms "
        f"p99 {status.latency_p99_ms:5.1f} ms | dropped {status.dropped_capture}+{status.dropped_latency} | "
        f"faces {status.faces} | face {escape(face)}{'' if swap else ' (swap off)'}{escape(status_suffix(status))}{budget}"
    )


@app.command()
def check(config: Optional[Path] = ConfigOpt) -> None:
    """Check dependencies, GPU, virtual camera, cameras, models and OBS; print the fix for each failure."""
    from vcam.runtime.check import run_checks

    cfg = load_config(config)
    failed = 0
    for item in run_checks(cfg):
        mark = {"ok": "[green]PASS[/]", "fail": "[red]FAIL[/]", "info": "[cyan]INFO[/]", "warn": "[yellow]WARN[/]"}[item.level]
        fix = f" -> {item.fix}" if item.fix else ""
        out.print(f"{mark} {escape(item.name)}: {escape(item.detail + fix)}", highlight=False, soft_wrap=True)
        failed += item.level == "fail"
    raise typer.Exit(1 if failed else 0)


@app.command()
def devices() -> None:
    """List cameras and virtual cameras (Windows and macOS: opens camera indices 0-3 to find them)."""
    from vcam.devices import list_video_devices

    devs = list_video_devices(probe=True)
    if not devs:
        out.print("no video devices found")
        return
    for d in devs:
        kind = "virtual camera" if d.is_loopback else "camera"
        out.print(f"{d.path}\t{kind}\t{d.name}", highlight=False, markup=False)


@app.command("config")
def show_config(config: Optional[Path] = ConfigOpt) -> None:
    """Print the effective configuration (file + defaults) as TOML."""
    import dataclasses

    cfg = load_config(config)
    if cfg.source_path:
        out.print(f"# from {cfg.source_path}", highlight=False)
    from vcam.config import SECTIONS
    from vcam.config_file import toml_value

    tables = []
    for table in SECTIONS:
        sec = getattr(cfg, table)
        subs = [(f"{table}.{f.name}", getattr(sec, f.name)) for f in dataclasses.fields(sec)]
        tables += subs if all(dataclasses.is_dataclass(v) for _, v in subs) else [(table, sec)]  # [engines.swapper]
    for table, sec in tables:
        out.print(f"[{table}]", highlight=False, markup=False)
        for f in dataclasses.fields(sec):
            v = getattr(sec, f.name)
            if f.name in ("password", "token") and v:
                v = "***"
            out.print(f"{f.name} = {toml_value(v)}", highlight=False, markup=False)
        out.print("")
    for st in cfg.streams:
        out.print("[[streams]]", highlight=False, markup=False)
        for f in dataclasses.fields(st):
            out.print(f"{f.name} = {toml_value(getattr(st, f.name))}", highlight=False, markup=False)
        out.print("")
