"""`runs`: the runs of a profile on this host, newest first."""

from __future__ import annotations

import os

from .rundir import Run
from .wire import AgentFailure, emit, spec_value


def run_row(run: Run) -> dict:
    """A run as `runs` lists it (while its container is set up: alive, its pid the
    monitor's); `attached`: what an attached run follows (tui/agent/attach.py),
    absent for a launched one."""
    starting = run.starting() if run.top_pid is None else None  # the monitor, until its container
    pid = run.top_pid if starting is None else starting["monitor_pid"]
    if pid is None and run.container is not None:  # its image never pulled: still followable
        pid = run.monitor_pid                       # to its end (exit.json says why)
    row = {"run_id": run.run_id, "profile_key": run.launch.get("profile_key"),
           "run_dir": run.dir, "started": run.launch.get("started"),
           "pid": pid, "restart": run.pidinfo.get("restart", 0),
           "alive": run.top_alive() or starting is not None, "exit": run.exit_info(),
           "served": run.launch.get("served")}
    if isinstance(run.launch.get("attached"), dict):
        row["attached"] = run.launch["attached"]
    return row


def cmd_runs(spec: dict) -> int:
    runs_dir = os.path.expanduser(spec_value(spec, "runs_dir", str))
    profile_key = spec_value(spec, "profile_key", str, None)
    runs = []
    try:
        entries = list(os.scandir(runs_dir))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.is_dir():
            continue
        try:
            run = Run(entry.path)
        except AgentFailure:
            continue
        if profile_key is not None and run.launch.get("profile_key") != profile_key:
            continue
        runs.append(run_row(run))
    runs.sort(key=lambda r: r["started"] if isinstance(r["started"], (int, float)) else 0,
              reverse=True)
    emit("runs", runs=runs)
    return 0
