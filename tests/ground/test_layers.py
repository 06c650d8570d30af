"""The package's folders are layers: each module imports only its own layer and the ones below it,
and no group of modules imports itself round in a cycle. Every import counts, function-local ones
and those under ``TYPE_CHECKING`` too, since each says which code a module depends on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "vcam"

# Lowest first. A module's layer is the longest prefix listed here.
LAYERS: list[tuple[str, ...]] = [
    ("vcam.platform",),
    ("vcam", "vcam.types", "vcam.errors", "vcam.config", "vcam.config_file", "vcam.state", "vcam.status", "vcam.align",
     "vcam.devices", "vcam.telemetry"),
    ("vcam.kernels",),
    ("vcam.ops",),
    ("vcam.engines",),
    ("vcam.models",),
    ("vcam.stages",),
    ("vcam.pipeline",),
    ("vcam.control",),
    ("vcam.panel",),
    ("vcam.runtime",),
    ("vcam.cli", "vcam.__main__"),
]  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every ``vcam`` module that ``path`` imports (``from vcam.x import y`` counts as vcam.x.y when
    that is a module, else vcam.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "vcam")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == "vcam":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}: relative import (vcam uses absolute imports)")
    return found


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, layer = len(name), i
    assert layer >= 0, f"{module} is in no layer: add it to LAYERS"
    return layer


GRAPH = {m: imports_of(p) - {m} for m, p in MODULES.items()}


def test_every_module_belongs_to_a_layer():
    assert all(layer_of(m) >= 0 for m in MODULES)


def test_no_module_imports_a_higher_layer():
    upward = sorted(
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]})"
        for m, targets in GRAPH.items()
        for t in targets
        if t in MODULES and layer_of(t) > layer_of(m)
    )
    assert upward == []


def test_no_import_cycles():
    # Tarjan's strongly connected components over the module graph.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in MODULES:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(MODULES):
        if m not in index:
            visit(m)
    # A package's __init__ that re-exports its own submodules is not a cycle of dependencies.
    assert cycles == []


@pytest.mark.parametrize("folder", ["stages", "pipeline"])
def test_stages_and_pipeline_never_read_the_config(folder):
    offenders = sorted(m for m, t in GRAPH.items() if m.startswith(f"vcam.{folder}") and "vcam.config" in t)
    assert offenders == []


def test_no_module_is_over_600_lines():
    long = sorted(f"{m}: {n}" for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600)
    assert long == []


#: What only the platform seams (vcam/platform) may touch: OS modules and calls that some OS lacks.
OS_MODULES = {"fcntl", "msvcrt", "pwd", "grp", "pty", "resource", "termios", "winreg"}
OS_NAMES = {
    ("socket", "AF_UNIX"), ("socket", "SO_PEERCRED"), ("signal", "SIGHUP"), ("signal", "SIGBREAK"),
    ("signal", "pthread_sigmask"), ("os", "getuid"), ("os", "geteuid"), ("os", "O_NOFOLLOW"), ("os", "fchmod"),
    ("os", "killpg"), ("os", "setsid"),
}  # fmt: skip


def os_specific_uses(path: Path) -> list[str]:
    """The OS-specific uses in ``path``: an import of an OS module, ``module.NAME`` (or ``from module
    import NAME``) for a name some OS lacks, a ``start_new_session`` keyword, a string naming /proc."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name.split(".")[0] in OS_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in OS_MODULES:
                found.append(f"{line}: from {node.module} import")
            found += [f"{line}: {node.module}.{a.name}" for a in node.names if (node.module, a.name) in OS_NAMES]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in OS_NAMES:
                found.append(f"{line}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg == "start_new_session":
            found.append(f"{line}: start_new_session=")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc"):
            found.append(f"{line}: {node.value!r}")
        elif isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith("/proc"):
                found.append(f"{line}: f-string {head.value!r}...")
    return found


def test_only_the_platform_seams_use_what_some_os_lacks():
    """fcntl, AF_UNIX, SIGHUP, getuid, O_NOFOLLOW, fchmod, killpg, /proc and the like live in
    vcam/platform (a POSIX and a Windows branch each); everything above asks the seams."""
    offenders = sorted(
        f"{m} line {use}" for m, p in MODULES.items() if not m.startswith("vcam.platform") for use in os_specific_uses(p)
    )
    assert offenders == []


def test_the_os_check_sees_each_kind_of_use(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import fcntl\nimport socket, os, signal\nfrom os import getuid\n"
        "socket.socket(socket.AF_UNIX)\nsignal.SIGHUP\nos.O_NOFOLLOW | os.fchmod(0, 0)\nos.killpg(1, 9)\n"
        "open('/proc/self/stat')\nopen(f'/proc/{1}/stat')\nPopen(x, start_new_session=True)\n"
    )
    uses = os_specific_uses(probe)
    for what in ("import fcntl", "os.getuid", "socket.AF_UNIX", "signal.SIGHUP", "os.O_NOFOLLOW", "os.fchmod",
                 "os.killpg", "'/proc/self/stat'", "f-string '/proc/'", "start_new_session"):  # fmt: skip
        assert any(what in u for u in uses), (what, uses)
