"""Reading and writing config.toml: the defaults, the file (``--config``, ``$VCAM_CONFIG`` or the user's),
the CLI's overrides, each value coerced to its declared type with a one-line error naming the key
and the fix (:func:`build`, :func:`load`); and the documented defaults as TOML (:func:`describe`)."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from vcam.config import SECTIONS, Config, Duration, StreamConfig
from vcam.errors import ConfigError
from vcam.platform import folders

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _section_types() -> dict[str, type]:
    hints = get_type_hints(Config)
    return {name: hints[name] for name in SECTIONS}


def default_config_path() -> Path:
    return folders.config_dir() / "config.toml"


def nearest(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(options)}"


def coerce(value: Any, tp: Any, meta: dict, where: str, fix: str | None = None) -> Any:
    """Check ``value`` against the declared type ``tp`` and range; return the typed value."""
    fix = fix or "fix the value or remove the key to use the default"
    origin = get_origin(tp)
    try:
        if tp is Duration:
            out: Any = Duration.parse(value)
        elif origin is Literal:
            choices = get_args(tp)
            if value not in choices:
                raise ValueError("one of " + ", ".join(repr(c) for c in choices))
            out = value
        elif tp is bool:
            if not isinstance(value, bool):
                raise ValueError("true or false")
            out = value
        elif tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError("an integer")
            out = value
        elif tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError("a number")
            out = float(value)
        elif tp is str:
            if not isinstance(value, str):
                raise ValueError("a string")
            out = value
        elif tp is dict:
            if not isinstance(value, dict):
                raise ValueError("a table")
            out = dict(value)
        elif origin is list:
            out = _coerce_list(value, get_args(tp)[0], meta, where)
        else:  # pragma: no cover - a declaration error, not user input
            raise TypeError(f"unsupported config type {tp!r}")
    except ValueError as exc:
        raise ConfigError(f"{where}: expected {exc}, got {value!r}", hint=fix) from None
    lo, hi = meta.get("min"), meta.get("max")
    if isinstance(out, list) and out and all(isinstance(v, float) for v in out):
        for v in out:
            coerce(v, float, meta, where, fix)
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        if (lo is not None and out < lo) or (hi is not None and out > hi):
            rng = f">= {lo:g}" if hi is None else (f"<= {hi:g}" if lo is None else f"between {lo:g} and {hi:g}")
            raise ConfigError(f"{where}: expected a value {rng}, got {value!r}", hint=fix)
    return out


def _coerce_list(value: Any, item: Any, meta: dict, where: str) -> list:
    """A TOML array (or, from a flag, a comma-separated string) of ``item``: numbers, choices, or tables
    with exactly ``meta["keys"]`` as strings."""
    if isinstance(value, str) and item is not dict:
        value = [v.strip() for v in value.split(",") if v.strip()]
        if item is float:
            try:
                value = [float(v) for v in value]
            except ValueError:
                raise ValueError("comma-separated numbers") from None
    if not isinstance(value, list):
        raise ValueError("a list")
    if item is dict:
        keys = tuple(meta.get("keys") or ())
        out = []
        for i, entry in enumerate(value):
            if (
                not isinstance(entry, dict)
                or set(entry) != set(keys)
                or not all(isinstance(entry[k], str) and entry[k] for k in keys)
            ):
                raise ValueError(f"tables with {' and '.join(repr(k) for k in keys)} strings (entry {i + 1}: {entry!r})")
            out.append(dict(entry))
        return out
    if get_origin(item) is Literal:
        choices = get_args(item)
        bad = [v for v in value if v not in choices]
        if bad:
            raise ValueError("a list of " + ", ".join(repr(c) for c in choices) + f" ({bad[0]!r} is not one)")
        return list(dict.fromkeys(value))
    if item is float:
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
            raise ValueError("a list of numbers")
        if meta.get("keys") and len(value) != len(meta["keys"]):
            raise ValueError(f"{len(meta['keys'])} numbers ({', '.join(meta['keys'])})")
        return [float(v) for v in value]
    if item is str:
        if any(not isinstance(v, str) or not v.strip() for v in value):
            raise ValueError('a list of names like ["Mic/Aux"]')
        return list(dict.fromkeys(value))
    raise TypeError(f"unsupported list item type {item!r}")  # pragma: no cover - a declaration error


def build(
    data: dict[str, Any],
    *,
    origin: str = "<defaults>",
    base: Config | None = None,
    labels: dict[tuple[str, str], str] | None = None,
) -> Config:
    """Validate a nested ``{table: {key: value}}`` mapping and merge it over ``base``. ``labels``:
    what the user typed for a key (a command-line flag), named in errors instead of the table and key."""
    base = base or Config()
    types = _section_types()
    sections: dict[str, Any] = {}
    for table, values in data.items():
        if table == "streams":
            sections["streams"] = parse_streams(values, origin)
            continue
        if table not in types:
            raise ConfigError(f"{origin}: unknown table [{table}]{nearest(table, list(types))}", hint="fix or remove the table")
        if not isinstance(values, dict):
            raise ConfigError(f"{origin}: [{table}] must be a table of keys, got {values!r}")
        sections[table] = _table(getattr(base, table), table, values, origin, labels)
    return dataclasses.replace(base, **sections)


def _nested(cls: type) -> bool:
    """A section made of sub-tables (``[engines.swapper]``), not of keys."""
    return all(dataclasses.is_dataclass(t) for t in get_type_hints(cls).values())


def _table(base: Any, table: str, values: dict, origin: str, labels: dict[tuple[str, str], str] | None) -> Any:
    """``values`` validated and merged over the section ``base`` (of table ``table``)."""
    cls = type(base)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    changes = {}
    for key, value in values.items():
        if key not in fields:
            what = f"table [{table}.{key}]" if _nested(cls) else f"key '{key}' in [{table}]"
            raise ConfigError(f"{origin}: unknown {what}{nearest(key, list(fields))}", hint="fix or remove the key")
        if _nested(cls):
            if not isinstance(value, dict):
                raise ConfigError(f"{origin}: [{table}.{key}] must be a table of keys, got {value!r}")
            changes[key] = _table(getattr(base, key), f"{table}.{key}", value, origin, labels)
            continue
        label = (labels or {}).get((table, key))
        where = label or f"{origin}: [{table}] {key}"
        changes[key] = coerce(value, hints[key], dict(fields[key].metadata), where, "fix the flag" if label else None)
    return dataclasses.replace(base, **changes)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}", hint="check the path given to --config") from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a directory: {path}", hint="pass the config.toml file itself") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}", hint="fix the syntax; see the shipped config.toml") from None


def load(
    path: str | os.PathLike | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    labels: dict[tuple[str, str], str] | None = None,
) -> Config:
    """Build the config: defaults ($VCAM_PANEL_PORT replacing the panel port's), then the file
    (explicit, $VCAM_CONFIG or the user one), then overrides (``labels``: the flag each override
    came from, for error messages)."""
    chosen: Path | None = None
    if path:
        chosen = Path(path).expanduser()
    elif os.environ.get("VCAM_CONFIG"):
        chosen = Path(os.environ["VCAM_CONFIG"]).expanduser()
    elif default_config_path().is_file():
        chosen = default_config_path()
    cfg = Config()
    panel_port = os.environ.get("VCAM_PANEL_PORT", "").strip()
    if panel_port:  # the panel port's default for this environment (the tests: 0); the file and flags still win
        if not panel_port.isdigit():
            raise ConfigError(
                f"$VCAM_PANEL_PORT: expected a port number, got {panel_port!r}", hint="e.g. 8766, or 0 for any free port"
            )
        cfg = build({"panel": {"port": int(panel_port)}}, origin="$VCAM_PANEL_PORT", base=cfg)
    if chosen is not None:
        cfg = build(read_toml(chosen), origin=str(chosen), base=cfg)
        cfg = dataclasses.replace(cfg, source_path=str(chosen))
    if overrides:
        cfg = build({k: v for k, v in overrides.items() if v}, origin="command line", base=cfg, labels=labels)
    return cfg


def toml_value(v: Any) -> str:
    """A value as TOML (for `vcam config` and the shipped config.toml)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Duration):
        return f'"{v}"'
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{" + ", ".join(f'"{k}" = {toml_value(x)}' for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def describe() -> list[tuple[str, str, Any, str]]:
    """(table, key, default, doc) for every setting, in declaration order."""
    out = []
    types = _section_types()
    for table, cls in types.items():
        inst = cls()
        subs = (
            [(f"{table}.{f.name}", getattr(inst, f.name)) for f in dataclasses.fields(cls)] if _nested(cls) else [(table, inst)]
        )
        for name, sub in subs:
            for f in dataclasses.fields(sub):
                out.append((name, f.name, getattr(sub, f.name), f.metadata.get("doc", "")))
    return out


_STREAM_NAME = re.compile(r"\A[A-Za-z0-9_.-]{1,32}\Z")


def parse_streams(value: Any, origin: str) -> tuple[StreamConfig, ...]:
    """``[[streams]]`` tables (or parsed ``--stream`` flags) -> validated :class:`StreamConfig` rows
    with names filled in and checked unique."""
    if not isinstance(value, list):
        raise ConfigError(f"{origin}: streams must be [[streams]] tables, got {value!r}", hint="see the shipped config.toml")
    hints = get_type_hints(StreamConfig)
    fields = {f.name: f for f in dataclasses.fields(StreamConfig)}
    out = []
    for i, entry in enumerate(value, 1):
        where = f"{origin}: [[streams]] entry {i}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table, got {entry!r}", hint="see the shipped config.toml")
        for key in entry:
            if key not in fields:
                raise ConfigError(f"{where}: unknown key '{key}'{nearest(key, list(fields))}", hint="fix or remove the key")
        budget = entry.get("max_latency")
        row = {k: coerce(v, hints[k], dict(fields[k].metadata), f"{where} {k}") for k, v in entry.items() if k != "max_latency"}
        for need in ("input", "output"):
            if not str(row.get(need, "")).strip():
                raise ConfigError(f"{where}: '{need}' is missing", hint="every stream needs an input and an output")
        if budget not in (None, ""):  # parsed once, here: the stream's budget in seconds
            try:
                row["max_latency"] = Duration.parse(budget)
            except ValueError:
                raise ConfigError(
                    f"{where} max_latency: expected a duration like '33ms', got {budget!r}", hint="fix the value"
                ) from None
        name = str(row.get("name") or f"s{i}")
        if not _STREAM_NAME.match(name):
            raise ConfigError(f"{where}: stream name {name!r} is not a plain word", hint="use letters, digits, '_', '-', '.'")
        row["name"] = name
        out.append(StreamConfig(**row))
    seen: set[str] = set()
    for st in out:
        if st.name in seen:
            raise ConfigError(f"{origin}: two streams are named {st.name!r}", hint="give each stream its own name")
        seen.add(st.name)
    return tuple(out)
