"""The engines layer has no import cycle: every import between its modules counts, the ones made
inside functions and for type checking too (the registry's lazy "module:attr" strings do not)."""

from __future__ import annotations

import ast
from pathlib import Path

import vcam.engines

ROOT = Path(vcam.engines.__file__).parent


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def engine_imports() -> dict[str, set[str]]:
    """Each module of vcam.engines -> the modules of vcam.engines it imports anywhere."""
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        seen: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # "from pkg import mod" imports the submodule; "from pkg import name" the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            seen.update(t for t in targets if t in files and t != name)
        graph[name] = seen
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_engines_layer_has_no_import_cycle():
    graph = engine_imports()
    assert "vcam.engines.torch" in graph and "vcam.engines.compiled" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_torch_engine_is_handed_its_loader_and_never_imports_compiled():
    graph = engine_imports()
    assert not {"vcam.engines.compiled", "vcam.engines.artifacts"} & graph["vcam.engines.torch"]
    assert "vcam.engines.compiled" not in graph["vcam.engines"]  # the registry names it as a string


def test_no_engines_module_is_over_600_lines():
    long = {p.name: n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_the_loader_and_the_engine_meet_the_seam_protocols():
    from vcam.engines import FACTORIES, CompiledArtifacts
    from vcam.engines.compiled import CompiledLoader, torch_engine

    assert FACTORIES["torch"] == "vcam.engines.compiled:torch_engine" and callable(torch_engine)
    for member in [m for m in dir(CompiledArtifacts) if not m.startswith("_")]:
        assert hasattr(CompiledLoader, member), member
