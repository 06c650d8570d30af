"""``python -m vcam`` as in a fresh virtual environment that holds only what fastswap-cam declares.

The machine running the tests has much more installed (torch brings filelock, for one), which hid
undeclared imports. :func:`sitecustomize_dir` writes a ``sitecustomize.py`` that, put first on a
child's ``PYTHONPATH``, swaps Python's path finder for one that does not see the top-level modules
of any installed distribution outside the declared set: the requirements in pyproject.toml (those
of the ``extras`` a command needs), followed through the installed distributions' own requirements
(markers honoured, extras followed), plus what ``python -m venv`` puts in every venv (pip,
setuptools). Such a module is then missing exactly as in a fresh venv: ``import`` raises
ModuleNotFoundError, ``importlib.util.find_spec`` returns None, importlib.metadata does not list it.
The children of that child (PYTHONPATH is inherited) see the same. ``tools/fresh-venv`` does it for
real with a new venv."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata as md
import inspect
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: What ``python -m venv`` installs in every environment.
SEED = ("pip", "setuptools")


def pythonpath_ignored() -> str | None:
    """Why a child's PYTHONPATH would not be read (so the blocker could not load), or None. The
    embeddable Windows CPython of the Wine run (tools/windows-tests) starts from a ``._pth`` file,
    which makes it ignore PYTHONPATH; a Windows install from python.org reads it."""
    if any(Path(sys.executable).parent.glob("*._pth")):
        return "PYTHONPATH: ignored by the embeddable Windows CPython of the Wine run (its ._pth file)"
    return None


def declared(pyproject: Path = ROOT / "pyproject.toml", extras: Iterable[str] = ()) -> list[Requirement]:
    """fastswap-cam's requirements as pyproject.toml declares them (the checkout's, not whatever
    metadata an older install left), with those of ``extras``."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def _applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    env = default_environment()
    return any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""})


def reachable(requirements: Iterable[Requirement]) -> set[str]:
    """Canonical names of the installed distributions that ``requirements`` bring, recursively."""
    seen: set[str] = {canonicalize_name("fastswap-cam"), *map(canonicalize_name, SEED)}
    todo: list[tuple[Requirement, set[str]]] = [(r, {""}) for r in requirements]
    visited: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, parent_extras = todo.pop()
        if not _applies(req, parent_extras):
            continue
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in visited:
            continue
        visited.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:  # not here: not importable here either
            continue
        seen.add(name)
        todo += [(Requirement(line), set(req.extras)) for line in dist.requires or ()]
    return seen


def _top_levels(dist: md.Distribution) -> set[str]:
    """The top-level modules a distribution installs: its top_level.txt, else its files' first parts."""
    declared = set((dist.read_text("top_level.txt") or "").split())
    if declared:
        return declared
    names = set()
    for f in dist.files or ():
        first = f.parts[0]
        if len(f.parts) > 1 and first != ".." and not first.endswith((".dist-info", ".data")):
            names.add(first)
        elif len(f.parts) == 1 and inspect.getmodulename(first):
            names.add(inspect.getmodulename(first) or "")
    return names - {""}


def hidden_modules(allowed: set[str]) -> set[str]:
    """Top-level modules that only distributions outside ``allowed`` provide (the standard
    library's names never). Every installed distribution is read through Python's own path finder,
    so this holds where the tests themselves run with such a sitecustomize."""
    owners: dict[str, set[str]] = {}
    for dist in importlib.machinery.PathFinder.find_distributions(md.DistributionFinder.Context()):
        for mod in _top_levels(dist):
            owners.setdefault(mod, set()).add(canonicalize_name(dist.metadata["Name"] or ""))
    return {mod for mod, dists in owners.items() if mod not in sys.stdlib_module_names and not dists & allowed}


_SITECUSTOMIZE = '''"""Written by tests/fresh_env.py: the path finder sees only fastswap-cam's declared requirements."""

import importlib.machinery
import re
import sys

HIDDEN = frozenset({hidden!r})
ALLOWED = frozenset({allowed!r})


class DeclaredOnly(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is None and name in HIDDEN:
            return None
        return super().find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in super().find_distributions(*args, **kwargs):
            if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() in ALLOWED:
                yield dist


sys.meta_path[:] = [DeclaredOnly if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
sys.path_importer_cache.clear()
'''


def sitecustomize_dir(folder: Path, *, extras: Iterable[str] = (), pyproject: Path = ROOT / "pyproject.toml") -> Path:
    """``folder`` with the ``sitecustomize.py`` described above (for ``extras``)."""
    allowed = reachable(declared(pyproject, extras))
    folder.mkdir(parents=True, exist_ok=True)
    text = _SITECUSTOMIZE.format(hidden=sorted(hidden_modules(allowed)), allowed=sorted(allowed))
    (folder / "sitecustomize.py").write_text(text)
    return folder


def env_with(folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python children load ``folder``'s sitecustomize (then the checkout)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


#: Run where PYTHONPATH is ignored: puts the blocker's folder and the checkout first on sys.path,
#: loads the blocker, then runs what followed ``-c BOOT``: ``-m MODULE ARGS`` or ``-c CODE ARGS``.
_BOOT = (
    "import runpy, sys; sys.path[:0] = {paths!r}; sys.modules.pop('sitecustomize', None); import sitecustomize; "
    "a = sys.argv[1:]; sys.argv = [a[0]] + a[2:]; "
    "runpy.run_module(a[1], run_name='__main__', alter_sys=True) if a[0] == '-m' else exec(a[1], {{'__name__': '__main__'}})"
)


def python_argv(folder: Path, *args: str) -> list[str]:
    """``python ARGS`` (``-m MODULE ...`` or ``-c CODE ...``) that loads ``folder``'s blocker: through
    PYTHONPATH (:func:`env_with`), or, where the interpreter ignores it (:func:`pythonpath_ignored`;
    ``VCAM_FRESH_BOOT=1`` forces it, to test it anywhere), through a ``-c`` bootstrap."""
    if pythonpath_ignored() is None and not os.environ.get("VCAM_FRESH_BOOT"):
        return [sys.executable, *args]
    return [sys.executable, "-c", _BOOT.format(paths=[str(folder), str(ROOT)]), *args]


def vcam(folder: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    """``python -m vcam ARGS`` with only the declared requirements importable."""
    return subprocess.run(
        python_argv(folder, "-m", "vcam", *args), capture_output=True, text=True, timeout=timeout, env=env_with(folder, env), **kw
    )
