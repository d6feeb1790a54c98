"""/proc read directly: cheaper than psutil for what the watcher asks every tick, and never
raising on a process that vanished (None instead)."""

from __future__ import annotations

import os
import sys
import time

import psutil

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
STATES = {
    "R": "running", "S": "sleeping", "D": "disk-sleep", "Z": "zombie", "T": "stopped",
    "t": "tracing-stop", "X": "dead", "x": "dead", "I": "idle", "K": "wake-kill",
    "W": "waking", "P": "parked",
}


class Stat:
    """The fields of /proc/<pid>/stat we use (field numbers as in proc(5))."""

    __slots__ = ("comm", "cpu_ticks", "exit_status", "pgid", "ppid", "rss", "sid",
                 "start_ticks", "state")

    def __init__(self, data: bytes) -> None:
        close = data.rfind(b")")
        self.comm = data[data.find(b"(") + 1 : close].decode("utf-8", "replace")
        f = data[close + 2 :].split()
        self.state = f[0].decode()  # field 3
        self.ppid = int(f[1])  # 4
        self.pgid = int(f[2])  # 5
        self.sid = int(f[3])  # 6
        self.cpu_ticks = int(f[11]) + int(f[12])  # 14 utime + 15 stime
        self.start_ticks = int(f[19])  # 22
        self.rss = int(f[21]) * PAGE  # 24, pages
        # 52: waitpid-style status, set once the process is a zombie (Linux >= 3.5)
        self.exit_status = int(f[49]) if len(f) > 49 else None

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X", "x")


def read_stat(pid: int) -> Stat | None:
    """None when the process is gone (or vanishes while we read): never an exception."""
    try:
        with open(f"/proc/{pid}/stat", "rb", buffering=0) as f:
            return Stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def read_cmdline(pid: int) -> list[str] | None:
    """argv as psutil splits it: NUL-separated, or space-separated once a title was set."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb", buffering=0) as f:
            data = f.read()
    except OSError:
        return None
    parts = data.rstrip(b"\0").split(b"\0")
    if len(parts) == 1:  # a title set by setproctitle: padded, space separated
        parts = parts[0].split()
    return [p.decode("utf-8", "replace") for p in parts]


def read_nspid(pid: int) -> int | None:
    """The process's pid in its own (innermost) pid namespace, from `NSpid:` in
    /proc/<pid>/status: what a containerised engine prints (`(Worker_TP3 pid=11)`); None for
    a process in the host's namespace, or gone."""
    try:
        with open(f"/proc/{pid}/status", "rb", buffering=0) as f:
            data = f.read()
    except OSError:
        return None
    at = data.find(b"\nNSpid:")
    if at < 0:
        return None
    ids = data[at + 7:data.find(b"\n", at + 1)].split()
    return int(ids[-1]) if len(ids) > 1 else None


def read_environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb", buffering=0) as f:
            return b"\0" + f.read() + b"\0"
    except OSError:
        return None


def env_values(environ: bytes, names: list[str]) -> list[str]:
    """The values of `names` in a NUL-separated environ that are worth redacting (4+ chars)."""
    wanted = set(names)
    values: list[str] = []
    for entry in environ.split(b"\0"):
        name, sep, raw = entry.partition(b"=")
        if not sep or name.decode("utf-8", "replace") not in wanted:
            continue
        value = raw.decode("utf-8", "replace")
        if len(value) >= 4 and value not in values:
            values.append(value)
    return values


def list_pids() -> set[int]:
    return {int(n) for n in os.listdir("/proc") if n.isdigit()}


def decode_status(status: int | None) -> tuple[int | None, int | None]:
    """(code, signal) from a waitpid-style status."""
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def ancestors(pid: int) -> set[int]:
    """pid and the processes above it: never ours to kill."""
    out = {pid}
    while pid > 1:
        st = read_stat(pid)
        if st is None:
            break
        pid = st.ppid
        out.add(pid)
    return out


def boot_time() -> float:
    """Epoch of boot to 10 ms (psutil's btime is whole seconds): start ticks -> epoch."""
    try:
        with open("/proc/uptime", "rb") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return psutil.boot_time()


def pidfd_supported() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def pgid_of(pid: int) -> int | None:
    st = read_stat(pid)
    return st.pgid if st is not None else None


def alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and not st.dead


def own_group() -> dict:
    """subprocess.Popen's keyword for a child in a process group of its own: `process_group`
    exists only from Python 3.11, and the agent runs on the GPU host's Python (3.10 too)."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}
