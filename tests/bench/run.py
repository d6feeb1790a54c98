"""specconsole's benchmarks: they print figures (no test asserts a time).

    python tests/bench/run.py [--quick] [--json FILE] [--only death,core,...]

1 death     death -> DEAD event and banner, local and SSH; `wait` on the top process and a 2 s
            polling loop on the same deaths                                     (death.py)
2 core      the log pipeline's lines/s on a vLLM-shaped log, and grep -v on it   (core.py)
3 firehose  20 k lines/s into a running console: keys, frozen frames, RSS        (firehose.py)
4 agent     the GPU host agent's CPU and RSS while watching (firehose.py: under the firehose),
            and `ps` + an nvidia-smi-like process once a second                  (agent.py)
5 scale     one console process supervising 1, 4 and 16 launches               (scale.py)
6 startup   `specconsole demo` to its first frame, `specconsole wait` to its first line
                                                                                 (startup.py)
7 longlog   a 1 GiB log: `specconsole explain` (wall, peak RSS) beside lnav's indexing; the
            console attaching over SSH: first screen, pages scrolled back      (longlog.py)

--quick (under 3 minutes on 2 cores) runs fewer and shorter rounds of each. Several benchmarks
run one after the other, each in a fresh process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import agent
import core
import death
import firehose
import longlog
import scale
import startup
from common import Figures, say

FULL = {"death_runs": 50, "baseline_runs": 10, "core_lines": 1_000_000, "core_repeats": 5,
        "firehose_s": 30.0, "agent_s": 60.0, "startup_runs": 5,
        "longlog_bytes": 1 << 30}
QUICK = {"death_runs": 5, "baseline_runs": 2, "core_lines": 200_000, "core_repeats": 3,
         "firehose_s": 8.0, "agent_s": 10.0, "startup_runs": 1,
         "longlog_bytes": 128 << 20}
BENCHES = ("death", "core", "firehose", "agent", "scale", "startup", "longlog")


def machine() -> dict[str, object]:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d %H:%M")}


def run(only: tuple[str, ...], p: dict[str, float]) -> Figures:
    figures: Figures = {}
    if "death" in only:
        figures |= asyncio.run(death.run(int(p["death_runs"]), int(p["baseline_runs"])))
    if "core" in only:
        figures |= core.run(int(p["core_lines"]), int(p["core_repeats"]))
    if "firehose" in only:
        figures |= asyncio.run(firehose.run(p["firehose_s"]))
    if "agent" in only:
        figures |= asyncio.run(agent.run(p["agent_s"]))
    if "scale" in only:
        figures |= asyncio.run(scale.run())
    if "startup" in only:
        figures |= startup.run(int(p["startup_runs"]))
    if "longlog" in only:
        figures |= longlog.run(int(p["longlog_bytes"]))
    return figures


def apart(only: tuple[str, ...], args: argparse.Namespace) -> Figures:
    """Each benchmark in a process of its own, one after the other: what one leaves behind
    (a large heap, threads, a peak RSS a child inherits) never weighs on the next."""
    figures: Figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in only:
            out = Path(tmp) / f"{name}.json"
            argv = [sys.executable, str(Path(__file__).resolve()), "--only", name,
                    "--json", str(out), *(["--quick"] if args.quick else []), "--no-header"]
            if subprocess.run(argv, check=False).returncode != 0:
                raise SystemExit(f"benchmark {name} failed")
            got = json.loads(out.read_text())
            figures |= {k: v for k, v in got.items() if k not in ("machine", "quick")}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--only", default=",".join(BENCHES),
                        help=f"comma-separated, of: {', '.join(BENCHES)}")
    parser.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    only = tuple(args.only.split(","))
    unknown = set(only) - set(BENCHES)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    # the launch history of these runs is not the user's
    os.environ.setdefault("SPECCONSOLE_DATA_DIR", tempfile.mkdtemp(prefix="specconsole-bench"))
    info = machine()
    if not args.no_header:
        say(f"{info['cpu']}, {info['cores']} cores, Python {info['python']}, "
            f"load {info['load_avg_1m']:.2f}, {info['date']}{' (quick)' if args.quick else ''}")
    start = time.monotonic()
    figures = run(only, QUICK if args.quick else FULL) if len(only) == 1 else apart(only, args)
    say(f"({time.monotonic() - start:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": info, "quick": args.quick, **figures},
                                        indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
