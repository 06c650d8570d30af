"""Does a storm of control clients slow the video? (issue 13)

    python -m benchmarks.control [--clients 500] [--rounds 3] [--json bench_control.json]

Runs the daemon on the 320x240 demo clip at its 30 fps (classic swap, CPU, a null output that
stamps each published frame) and, a few times, lets ``--clients`` `vcam ctl`-style clients (the real
:func:`vcam.control.client.send_command`, threads of one separate process, all released at once)
send status, face and swap commands. It prints, per mode, the publish-gap p99 before and during each
storm and how many clients got their answer:

- ``server in the daemon``: the daemon's own control socket serves them (the product);
- ``server in another process``: the same clients against a control server outside the daemon,
  which then serves nothing: what the clients' CPU load alone costs the frame loop on this machine
  (the baseline the first mode is compared with).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import demo_daemon, write_report

CLIENTS = r"""
import json, sys, threading
from vcam.control.client import send_command
from vcam.errors import ControlError
path, n = sys.argv[1], int(sys.argv[2])
out = [None] * n
go = threading.Barrier(n)
def client(i):
    go.wait()
    cmd = [{"status": True}, {"face": "next"}, {"swap": "toggle"}][i % 3]
    try:
        out[i] = "ok" if send_command(path, cmd, timeout=60)["ok"] else "refused"
    except ControlError as exc:
        out[i] = "busy" if "busy" in str(exc) else "error"
threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(out))
"""

SERVER = r"""
import sys, time
from vcam.control.local import ControlServer
from vcam.state import RuntimeState
from vcam.types import SourceFace
import numpy as np
faces = {n: SourceFace(name=n, image=np.zeros((128, 128, 3), np.uint8)) for n in ("alice", "bob")}
with ControlServer(sys.argv[1], RuntimeState(faces, active="alice")):
    time.sleep(float(sys.argv[2]))
"""


def _storms(external: bool, clients: int, rounds: int, root: Path) -> dict:
    sock = root / ("ext" if external else "own") / "vcam.sock"
    server = None
    if external:
        sock.parent.mkdir(mode=0o700)
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(sock), str(30 + 10 * rounds)])
        while not sock.exists():
            time.sleep(0.05)
    daemon, out = demo_daemon(sock, control=not external, max_latency=0)
    daemon.start()
    rows, pooled_before, pooled_during = [], [], []
    try:
        if not daemon.ready.wait(60):
            raise RuntimeError(f"the daemon did not start: {daemon.summary.error}")
        time.sleep(2.0)
        for _ in range(rounds):
            t0 = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-c", CLIENTS, str(sock), str(clients)], capture_output=True, text=True, check=True
            )
            t1 = time.perf_counter()
            answers = json.loads(p.stdout)
            st = np.array(out.stamps)
            before, during = np.diff(st[(st > t0 - 1.5) & (st < t0)]), np.diff(st[(st >= t0) & (st <= t1)])
            pooled_before += before.tolist()
            pooled_during += during.tolist()
            rows.append(
                {
                    # no frame in the 1.5 s before a storm (a stalled machine) leaves nothing to measure
                    "gap_p99_before_ms": float(np.percentile(before, 99) * 1e3) if len(before) else float("nan"),
                    "gap_p99_during_ms": float(np.percentile(during, 99) * 1e3) if len(during) else float("nan"),
                    "storm_s": t1 - t0,
                    "ok": answers.count("ok"),
                    "busy": answers.count("busy"),
                    "other": len(answers) - answers.count("ok") - answers.count("busy"),
                }
            )
            time.sleep(1.5)
    finally:
        daemon.stop()
        if server is not None:
            server.kill()
    return {
        "rounds": rows,
        "gap_p99_before_ms": float(np.percentile(pooled_before, 99) * 1e3) if pooled_before else float("nan"),
        "gap_p99_during_ms": float(np.percentile(pooled_during, 99) * 1e3) if pooled_during else float("nan"),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="bench_control.json")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="vcam-bench-control-"))
    results = {
        "server in the daemon": _storms(False, args.clients, args.rounds, root),
        "server in another process (clients' CPU load only)": _storms(True, args.clients, args.rounds, root),
    }

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.clients} control clients at once against a daemon on the 30 fps demo clip")
    for col in ("mode", "round", "publish gap p99 before ms", "during ms", "storm s", "ok / busy / other"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for name, r in results.items():
        for i, row in enumerate(r["rounds"], 1):
            table.add_row(
                name,
                str(i),
                f"{row['gap_p99_before_ms']:.1f}",
                f"{row['gap_p99_during_ms']:.1f}",
                f"{row['storm_s']:.2f}",
                f"{row['ok']} / {row['busy']} / {row['other']}",
            )
        ok = sum(row["ok"] for row in r["rounds"])
        table.add_row(name, "all", f"{r['gap_p99_before_ms']:.1f}", f"{r['gap_p99_during_ms']:.1f}", "", f"{ok} ok")
    con = Console(width=160)
    con.print(table)
    payload = write_report(args.json, {"clients": args.clients, "results": results})
    con.print(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
