"""The engine and its compiled-artifact loader meet only at the seam: the torch engine never
imports the loader, and both implement the protocols in vcam.engines. (No cycles and no long
modules anywhere, this layer included: tests/ground/test_layers.py.)"""

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


def test_the_torch_engine_is_handed_its_loader_and_never_imports_compiled():
    graph = engine_imports()
    assert not {"vcam.engines.compiled", "vcam.engines.artifacts"} & graph["vcam.engines.torch"]
    assert "vcam.engines.compiled" not in graph["vcam.engines"]  # the registry names it as a string


def test_the_loader_and_the_engine_meet_the_seam_protocols():
    from vcam.engines import FACTORIES, CompiledArtifacts
    from vcam.engines.compiled import CompiledLoader, torch_engine

    assert FACTORIES["torch"] == "vcam.engines.compiled:torch_engine" and callable(torch_engine)
    for member in [m for m in dir(CompiledArtifacts) if not m.startswith("_")]:
        assert hasattr(CompiledLoader, member), member
