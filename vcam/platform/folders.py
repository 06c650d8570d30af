"""The user's folders for vcam: config, data, cache, state and the runtime folder of the control
socket. Every answer is computed at each call from the environment, never cached, so a test that
points ``XDG_*`` (POSIX) or ``%LOCALAPPDATA%`` (Windows) at its own folder gets its own folders.

POSIX: exactly what platformdirs answers (``~/.config/vcam``, ``~/.local/share/vcam``,
``~/.cache/vcam``, ``~/.local/state/vcam`` on Linux, each moved by its ``XDG_*`` variable).
Windows: ``%LOCALAPPDATA%\\vcam`` for config, data and state, ``%LOCALAPPDATA%\\vcam\\Cache`` for the
cache. platformdirs resolves that folder through the shell once and caches it, so the variable, which
Windows sets in every session, is read here first; platformdirs answers only when it is unset.
"""

from __future__ import annotations

import ntpath
import os
from pathlib import Path

import platformdirs

from vcam.platform import WINDOWS

APP = "vcam"


def _windows_local(windows: bool) -> Path | None:
    """``%LOCALAPPDATA%\\vcam`` when that variable holds an absolute path, else None."""
    if not windows:
        return None
    base = os.environ.get("LOCALAPPDATA", "").strip()
    return Path(base) / APP if base and ntpath.isabs(base) else None


def config_dir(*, windows: bool = WINDOWS) -> Path:
    """Where ``config.toml`` lives."""
    local = _windows_local(windows)
    if local is not None:
        return local
    return Path(platformdirs.user_config_dir(APP, appauthor=False))


def data_dir(*, windows: bool = WINDOWS) -> Path:
    """Where the user's faces and models live."""
    local = _windows_local(windows)
    if local is not None:
        return local
    return Path(platformdirs.user_data_dir(APP, appauthor=False))


def cache_dir(*, windows: bool = WINDOWS) -> Path:
    """What can be made again: compiled engines, embeddings, serving environments."""
    local = _windows_local(windows)
    if local is not None:
        return local / "Cache"
    return Path(platformdirs.user_cache_dir(APP, appauthor=False))


def state_dir(*, windows: bool = WINDOWS) -> Path:
    local = _windows_local(windows)
    if local is not None:
        return local
    return Path(platformdirs.user_state_dir(APP, appauthor=False))


def runtime_dir(*, windows: bool = WINDOWS) -> Path:
    """The folder of the control socket: ``$XDG_RUNTIME_DIR`` when set to an absolute path, else
    (su, ssh, cron: no runtime dir; Windows) ``run`` in the state folder, under the user's own
    profile; never a guessable shared temp path another user could create first."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        return Path(base)
    return state_dir(windows=windows) / "run"
