"""`stacks`: the Python stacks of every process of the run, by py-spy, streamed back one process
at a time and saved in the run's directory with a timestamp.

vLLM's own advice for a hang is `py-spy dump --pid P` of each of its processes. A stopped
process (SIGSTOP) cannot be paused by py-spy, but its memory holds still: it is read without
pausing (`--nonblocking`). Not being allowed to trace (kernel.yama.ptrace_scope, a container
without SYS_PTRACE) is said with its fix, once per process; a process that is not Python is
said as such.

A server in a container whose host has no py-spy is read from inside: `RUNTIME exec NAME
py-spy dump --pid P`, P being the process's pid in the container (NSpid), py-spy found
beside the image's Python or on the container's PATH (images such as vllm/vllm-openai
often ship it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .container import cli
from .procfs import read_nspid, read_stat
from .rundir import Run
from .tracker import Proc, Tracker
from .wire import AgentFailure, emit, spec_value

PYSPY_FIX = "pip install py-spy (into host.python's environment, or anywhere on PATH)"
PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
IN_CONTAINER_PTRACE_FIX = ("py-spy inside a container needs the SYS_PTRACE capability: add "
                           '"--cap-add", "SYS_PTRACE" to [container] run_args, or install '
                           "py-spy on the host")
DUMP_TIMEOUT = 15.0
WORKERS = 4


def find_pyspy() -> str | None:
    """py-spy beside this interpreter (host.python's venv), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


class Dumper:
    """How one process's stack is asked for: py-spy on the host by host pid, or py-spy inside
    the run's container by the pid the container knows."""

    def __init__(self, pyspy: str, box: dict | None = None) -> None:
        self.pyspy = pyspy
        self.box = box

    @property
    def where(self) -> str:
        if self.box is None:
            return f"py-spy on the host ({self.pyspy})"
        return f"py-spy inside container {self.box['name']} ({self.pyspy}): the host has none"

    def argv(self, pid: int) -> list[str] | None:
        """py-spy's dump of `pid` up to its options; None when the process is not in the
        container's pid namespace (so py-spy in there cannot see it)."""
        if self.box is None:
            return [self.pyspy, "dump", "--full-filenames", "--pid", str(pid)]
        inside = read_nspid(pid)
        if inside is None:
            return None
        return [self.box["runtime"], "exec", self.box["name"], self.pyspy, "dump",
                "--full-filenames", "--pid", str(inside)]

    def ptrace_fix(self) -> str:
        return _ptrace_fix() if self.box is None else IN_CONTAINER_PTRACE_FIX


def find_dumper(run: Run) -> Dumper:
    """The host's py-spy, else the run's container's; neither is one line with both fixes."""
    pyspy = find_pyspy()
    if pyspy is not None:
        return Dumper(pyspy)
    box = run.container
    if box is None:
        raise AgentFailure("pyspy_missing", f"py-spy is not installed for {sys.executable} "
                           f"nor on PATH: {PYSPY_FIX}")
    python = box.get("python")
    candidates = ([os.path.join(os.path.dirname(python), "py-spy")]
                  if isinstance(python, str) and os.path.isabs(python) else []) + ["py-spy"]
    for candidate in candidates:
        if cli(box["runtime"], "exec", box["name"], candidate, "--version",
               timeout=DUMP_TIMEOUT).returncode == 0:
            return Dumper(candidate, box)
    raise AgentFailure("pyspy_missing", f"py-spy is neither on the host ({sys.executable}'s "
                       f"directory, PATH) nor in container {box['name']} (beside its Python, "
                       f"its PATH): {PYSPY_FIX}, or into the image")


def cmd_stacks(spec: dict) -> int:
    run = Run(spec_value(spec, "run_dir", str))
    native = bool(spec_value(spec, "native", bool, False))
    dumper = find_dumper(run)
    tracker = Tracker(run, use_pidfd=False)
    tracker.scan()
    procs = [p for p in tracker.alive() if p.pid != os.getpid()]
    tracker.close()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    sections: list[str] = [f"# stacks by {dumper.where}\n"]
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for proc, result in zip(procs, pool.map(lambda p: _dump(dumper, p, native), procs),
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


def _dump(dumper: Dumper, proc: Proc, native: bool) -> tuple[bool, str, str | None]:
    """(ok, the dump or why not, the process state when it was read)."""
    st = read_stat(proc.pid)
    if st is None or st.dead:
        return False, "gone before its stack could be read", None
    stopped = st.state in ("T", "t")
    state = "stopped" if stopped else None
    argv = dumper.argv(proc.pid)
    if argv is None:
        return False, "not in the container's pid namespace: py-spy inside cannot see it", state
    argv += ["--native"] if native else []
    error = ""
    for nonblocking in ((True,) if stopped else (False, True)):
        try:
            done = subprocess.run(argv + (["--nonblocking"] if nonblocking else []),
                                  capture_output=True, text=True, errors="replace",
                                  timeout=DUMP_TIMEOUT)
        except subprocess.TimeoutExpired:
            return False, f"py-spy did not answer within {DUMP_TIMEOUT:.0f}s", state
        except OSError as exc:
            return False, f"cannot run {argv[0]}: {exc.strerror or exc}", state
        if done.returncode == 0 and done.stdout.strip():
            return True, done.stdout.rstrip(), state
        error = _why(done.stderr or done.stdout, proc.pid, dumper.ptrace_fix)
        if error.startswith(("not a Python", "the kernel")):
            return False, error, state
    return False, error, state


def _why(output: str, pid: int, ptrace_fix: Callable[[], str]) -> str:
    """py-spy's failure in one line, with the fix where there is one."""
    text = output.strip()
    first = text.splitlines()[0] if text else "no output"
    if "python version" in text.lower() or "python interpreter" in text.lower():
        return "not a Python process"
    if "Permission denied" in text or "Operation not permitted" in text or "EPERM" in text:
        return f"the kernel refused to let py-spy read pid {pid} (ptrace): {ptrace_fix()}"
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
