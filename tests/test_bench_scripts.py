"""The benchmark scripts still run (their figures are printed, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent / "bench"


def test_run_refuses_an_unknown_benchmark() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "run.py"), "--only", "nope"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown benchmark(s): nope" in done.stderr


def test_the_core_benchmark_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    probe = ("import sys, json; sys.argv = ['run.py']; import run; "
             "run.QUICK.update(core_lines=3000, core_repeats=1); "
             f"sys.argv += ['--quick', '--only', 'core', '--json', {str(out)!r}]; run.main()")
    done = subprocess.run([sys.executable, "-c", probe], cwd=BENCH, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    assert {"core_lines_per_s", "grep_lines_per_s", "machine"} <= figures.keys()
    assert figures["core_lines"] == 3000
    assert "log core:" in done.stdout
