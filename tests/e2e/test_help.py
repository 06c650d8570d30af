"""Every command's --help keeps the bracketed text of its help: `[panel]`, `[pipeline] max_faces`
(rich reads `[word]` as markup and drops it unless written `\\[word]`)."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from vcam.cli import app

BRACKETED = re.compile(r"\\?\[[^\]\n]*\]")


def commands(cmd, path=()):
    yield list(path), cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):  # a group
        yield from commands(sub, (*path, name))


def test_every_help_keeps_its_brackets():
    seen, missing = 0, []
    for path, cmd in commands(typer.main.get_command(app)):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        wanted = [m.lstrip("\\") for text in texts for m in BRACKETED.findall(text)]
        r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "300", "TERMINAL_WIDTH": "300"})
        assert r.exit_code == 0, (path, r.output)
        shown = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.output).split())
        missing += [f"vcam {' '.join(path)}: {w}" for w in wanted if " ".join(w.split()) not in shown]
        seen += len(wanted)
    assert not missing, "bracketed help text lost (write it as \\[...]):\n" + "\n".join(missing)
    assert seen >= 3  # the ones issue 38 found: --panel's default, bench's [track], engines build's [pipeline]
