"""Regenerate config.toml from the declarations in vcam/config.py: python tools/gen_config_toml.py

An argument writes the text to that file instead (tools/check compares it with the shipped one)."""

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vcam.config import StreamConfig
from vcam.config_file import describe, toml_value

lines = [
    "# FastSwap Cam configuration: every setting with its default.",
    "# vcam reads, in order: --config PATH, $VCAM_CONFIG, or config.toml in the user config dir",
    '# (Linux: ~/.config/vcam/config.toml). CLI flags override the file. Durations: "33ms", "0.5s".',
    "# Unknown keys, wrong types and out-of-range values stop vcam at start with the file, table and key.",
    "",
]
cur = None
for table, key, default, doc in describe():
    if table != cur:
        if cur is not None:
            lines.append("")
        lines.append(f"[{table}]")
        cur = table
    lines.extend(textwrap.wrap(doc, width=100, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False))
    if default == [] and key == "map":  # a list of tables: shown as a commented example (a `map = []`
        # line would make a [[swap.map]] table added below it a TOML error)
        lines += [
            f"# [[{table}.{key}]]",
            '# target = "alice"      # a face-bank name or a photo of the person',
            '# source = "grace"',
        ]
        continue
    lines.append(f"{key} = {toml_value(default)}")
# Several streams: an array of tables at the top level, shown as a commented example (it must come
# after every table: a [[streams]] table ends at the next header).
lines += [
    "",
    "# Several streams in one daemon (`vcam run --stream INPUT=OUTPUT`, repeatable), one [[streams]]",
    "# table each; the models are loaded once and the faces of all streams go through the swapper in",
    "# one batch ([pipeline] batch_deadline). What a stream leaves out comes from [capture], [output],",
    "# [swap] source and [pipeline] max_latency. Keys:",
]
for f in __import__("dataclasses").fields(StreamConfig):
    lines.extend(textwrap.wrap(f"{f.name}: {f.metadata['doc']}", width=100, initial_indent="#   ", subsequent_indent="#     "))
lines += [
    "# [[streams]]",
    '# name = "desk"',
    '# input = "webcam:0"',
    '# output = "vcam:FastSwap Cam"',
    "# [[streams]]",
    '# name = "side"',
    '# input = "webcam:1"',
    '# output = "vcam:FastSwap Cam 2"',
    '# face = "alice"',
    '# max_latency = "50ms"',
]
dest = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "config.toml"
open(dest, "w").write("\n".join(lines) + "\n")
