"""`stacks`: the Python stacks of every process of the run, by py-spy, streamed back one process
at a time and saved in the run's directory with a timestamp.

vLLM's own advice for a hang is `py-spy dump --pid P` of each of its processes. A stopped
process (SIGSTOP) cannot be paused by py-spy, but its memory holds still: it is read without
pausing (`--nonblocking`). Not being allowed to trace (kernel.yama.ptrace_scope, a container
without SYS_PTRACE) is said with its fix, once per process; a process that is not Python is
said as such.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .procfs import read_stat
from .rundir import Run
from .tracker import Proc, Tracker
from .wire import AgentFailure, emit, spec_value

PYSPY_FIX = "pip install py-spy (into host.python's environment, or anywhere on PATH)"
PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
DUMP_TIMEOUT = 15.0
WORKERS = 4


def find_pyspy(configured: str | None = None) -> str | None:
    """py-spy beside this interpreter (host.python's venv), else on PATH."""
    if configured and os.access(configured, os.X_OK):
        return configured
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def cmd_stacks(spec: dict) -> int:
    run = Run(spec_value(spec, "run_dir", str))
    native = bool(spec_value(spec, "native", bool, False))
    pyspy = find_pyspy(spec_value(spec, "pyspy", str, None))
    if pyspy is None:
        raise AgentFailure("pyspy_missing", f"py-spy is not installed for {sys.executable} "
                           f"nor on PATH: {PYSPY_FIX}")
    tracker = Tracker(run, use_pidfd=False)
    tracker.scan()
    procs = [p for p in tracker.alive() if p.pid != os.getpid()]
    tracker.close()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    sections: list[str] = []
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for proc, result in zip(procs, pool.map(lambda p: _dump(pyspy, p, native), procs),
                                strict=True):
            ok, text, state = result
            emit("stack", pid=proc.pid, name=proc.name, state=state, ok=ok,
                 text=text if ok else None, error=None if ok else text)
            sections.append(f"=== {proc.name} (pid {proc.pid}, {state or '?'})\n{text}\n")
    path = os.path.join(run.dir, f"stacks-{stamp}.txt")
    try:
        with open(path, "w", encoding="utf-8", errors="replace") as f:
            f.write("\n".join(sections))
    except OSError as exc:
        path = f"(not saved: {exc.strerror or exc})"
    emit("stacks_done", count=len(procs), path=path, time=time.time())
    return 0


def _dump(pyspy: str, proc: Proc, native: bool) -> tuple[bool, str, str | None]:
    """(ok, the dump or why not, the process state when it was read)."""
    st = read_stat(proc.pid)
    if st is None or st.dead:
        return False, "gone before its stack could be read", None
    stopped = st.state in ("T", "t")
    argv = [pyspy, "dump", "--full-filenames", "--pid", str(proc.pid)] + (
        ["--native"] if native else [])
    state = "stopped" if stopped else None
    error = ""
    for nonblocking in ((True,) if stopped else (False, True)):
        try:
            done = subprocess.run(argv + (["--nonblocking"] if nonblocking else []),
                                  capture_output=True, text=True, errors="replace",
                                  timeout=DUMP_TIMEOUT)
        except subprocess.TimeoutExpired:
            return False, f"py-spy did not answer within {DUMP_TIMEOUT:.0f}s", state
        except OSError as exc:
            return False, f"cannot run {pyspy}: {exc.strerror or exc}", state
        if done.returncode == 0 and done.stdout.strip():
            return True, done.stdout.rstrip(), state
        error = _why(done.stderr or done.stdout, proc.pid)
        if error.startswith(("not a Python", "the kernel")):
            return False, error, state
    return False, error, state


def _why(output: str, pid: int) -> str:
    """py-spy's failure in one line, with the fix where there is one."""
    text = output.strip()
    first = text.splitlines()[0] if text else "no output"
    if "python version" in text.lower() or "python interpreter" in text.lower():
        return "not a Python process"
    if "Permission denied" in text or "Operation not permitted" in text or "EPERM" in text:
        return f"the kernel refused to let py-spy read pid {pid} (ptrace): {_ptrace_fix()}"
    return first.removeprefix("Error: ")


def _ptrace_fix() -> str:
    try:
        with open(PTRACE_SCOPE) as f:
            scope = f.read().strip()
    except OSError:
        scope = None
    if os.geteuid() == 0:
        return ("running as root and still refused: a container without the SYS_PTRACE "
                "capability (docker run --cap-add SYS_PTRACE, or securityContext "
                "capabilities add SYS_PTRACE)")
    if scope and scope != "0":
        return (f"kernel.yama.ptrace_scope={scope} allows no ptrace of another process: "
                "`sudo sysctl kernel.yama.ptrace_scope=0`, or set host.python to run as root")
    return "the process belongs to another user, or the container lacks SYS_PTRACE"
