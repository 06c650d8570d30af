"""README.md's layout section names every folder and module of vcam/ (the test lists what it misses)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vcam"
ENTRY = re.compile(r"^ {4}(\(ground\)|[a-z_]+/)\s")


def layout_entries() -> dict[str, str]:
    """The layout block as ``{"cli/": text, ..., "(ground)": text}``: an entry's continuation lines
    (indented further) belong to it."""
    text = README_TEXT.split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = ENTRY.match(line)
        if m:
            current = m.group(1)
            entries[current] = line[m.end() :]
        elif current is not None and line.startswith(" " * 8) and line.strip():
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


README_TEXT = (ROOT / "README.md").read_text()


def names_in(folder: Path) -> list[str]:
    """A folder's modules (``.py`` files but ``__init__``) and subfolders, as the layout names them."""
    out = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith("__") and p.name != "__main__.py":
            continue
        if p.is_dir():
            out.append(p.name + "/")
        elif p.suffix == ".py":
            out.append(p.stem)
    return out


def named(name: str, text: str) -> bool:
    """``name`` appears in ``text`` as a word of its own (``cuda`` is not named by ``cuda_status``)."""
    return re.search(rf"(?<![\w/]){re.escape(name)}(?!\w)", text) is not None


def test_the_layout_names_every_folder_and_module():
    entries = layout_entries()
    missing = []
    for folder in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")):
        key = folder.name + "/"
        if key not in entries:
            missing.append(f"vcam/{key} (no entry)")
            continue
        missing += [f"vcam/{key}{n}" for n in names_in(folder) if not named(n, entries[key])]
    ground = entries.get("(ground)", "")
    missing += [f"vcam/{p.name}" for p in sorted(PACKAGE.glob("*.py")) if p.name != "__init__.py" and not named(p.stem, ground)]
    assert not missing, "README.md's layout section does not name:\n" + "\n".join(missing)
