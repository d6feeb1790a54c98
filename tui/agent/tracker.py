"""The death watcher: which processes belong to the run, and the moment each one dies.

Deaths come from pidfds (poll wakes within milliseconds, no polling); membership is judged once
per new pid, so a scan costs one listdir of /proc plus a read per new process.
"""

from __future__ import annotations

import os
import select
import time

from .names import CONTAINER_INITS, vllm_name
from .procfs import (
    CLK_TCK,
    STATES,
    Stat,
    boot_time,
    decode_status,
    list_pids,
    read_cmdline,
    read_environ,
    read_nspid,
    read_stat,
)
from .redaction import redact
from .rundir import Run

MAX_CMD = 8192  # the most characters of a command line we report


class Proc:
    """One process of the run; its pidfd turns readable when it exits."""

    __slots__ = ("alive", "argv", "children_fd", "comm", "cpid", "cpu_prev", "inherited",
                 "name", "pgid", "pid", "pidfd", "ppid", "server", "start_ticks", "state", "top")

    def __init__(self, pid: int, st: Stat, top: bool, server: bool | None = None,
                 parent_argv: list[str] | None = None) -> None:
        """server: named as the run's server (the top, or the command a container's init
        runs); None: as top.  parent_argv: its parent's command line, when a member."""
        self.pid = pid
        self.top = top
        self.server = top if server is None else server
        self.start_ticks = st.start_ticks
        self.ppid, self.pgid, self.comm = st.ppid, st.pgid, st.comm
        self.state = "zombie" if st.state == "Z" else "dead" if st.dead else "running"
        self.argv = read_cmdline(pid)
        self.cpid = read_nspid(pid)  # its pid inside a container, which its log lines print
        self.name = vllm_name(self.argv, st.comm, self.server)
        # Forked and not yet its own: its parent's very command line, so its name is the
        # parent's (a worker's compiler child before its exec); cleared once it is its own
        self.inherited = (self.argv or None) if self.argv == parent_argv and not top else None
        self.pidfd: int | None = None
        self.children_fd: int | None = None  # its children file, open while it is young
        self.alive = not st.dead
        self.cpu_prev: tuple[int, float] | None = None


def lives(proc: Proc) -> bool:
    """The very process (same start time) still runs: not gone, not a zombie."""
    st = read_stat(proc.pid)
    return st is not None and not st.dead and st.start_ticks == proc.start_ticks


class Tracker:
    """Finds the run's processes (top, descendants, process group, env) and their deaths.

    Membership: a child of a live member; a process in the run's process group *and* session
    (both numbers together cannot have been recycled); and, when env_scan, a process whose
    environ carries SPECCONSOLE_RUN_ID=<run id> (it may have left with setsid).  Each pid is
    judged once, when it first appears, so a scan costs one listdir of /proc plus a read per
    new process.
    """

    def __init__(self, run: Run, use_pidfd: bool, env_scan: bool = True) -> None:
        self.run = run
        self.use_pidfd = use_pidfd
        self.env_scan = env_scan
        self.poller = select.poll()
        self.procs: dict[int, Proc] = {}
        self.by_fd: dict[int, Proc] = {}
        self.seen: set[int] = set()  # pids already judged (member or not)
        self.gone: set[tuple[int, int]] = set()  # (pid, start ticks) of the dead, never again
        self.boot = boot_time()
        self.top_checked = False

    def alive(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.alive]

    def group_is_ours(self) -> bool:
        """A live member holds the group, so its number cannot have been reused."""
        pgid = self.run.pgid
        return pgid is not None and any(p.alive and p.pgid == pgid for p in self.procs.values())

    def scan(self) -> list[Proc]:
        """Judge the pids that appeared since the last scan; return the newly adopted."""
        adopted = []
        if not self.top_checked and self.run.top_pid is not None:
            self.top_checked = True
            st = read_stat(self.run.top_pid)
            if st is not None and self.run.exit_info() is None and self.run.is_top(st):
                self.seen.add(self.run.top_pid)
                adopted.append(self._adopt(self.run.top_pid, st, top=True))
        try:
            pids = list_pids()
        except OSError:
            return adopted
        self.seen &= pids
        if len(self.gone) > 4096:  # a churning server: forget the dead whose pid is free
            self.gone = {dead for dead in self.gone if dead[0] in pids}
        fresh = {}
        for pid in pids - self.seen:
            st = read_stat(pid)
            if st is not None:
                fresh[pid] = st
        self.seen |= pids
        if self.env_scan:
            me = os.getpid()
            # oldest first: a parent is adopted before the children it forked (see inherited)
            for pid, st in sorted(fresh.items(), key=lambda item: item[1].start_ticks):
                env = read_environ(pid) if not st.dead and pid != me else None
                if env is not None and self.run.env_needle in env:
                    adopted.append(self._adopt(pid, fresh.pop(pid), top=False))
        changed = True
        while changed and fresh:  # fixpoint: an adopted parent makes its children members
            changed = False
            for pid, st in list(fresh.items()):
                if self._member(st):
                    adopted.append(self._adopt(pid, fresh.pop(pid), top=False))
                    changed = True
        return adopted

    def scan_children(self, young: float) -> list[Proc]:
        """Children of live members started less than `young` seconds ago.

        /proc/<pid>/task/<pid>/children costs one read per member, cheap enough for every
        tick: a vLLM worker that dies of a broken import lives well under a scan interval,
        and must still be seen (and its death reported).  The file stays open while its
        member is young: a pread a tick instead of an open, a read and a close.
        """
        adopted = []
        born_after = (time.time() - young - self.boot) * CLK_TCK
        stack = []
        for p in self.alive():
            if p.start_ticks > born_after:
                stack.append(p)
            elif p.children_fd is not None:  # grown old: its children are left to scan()
                os.close(p.children_fd)
                p.children_fd = None
        while stack:
            parent = stack.pop()
            for pid in self._children(parent):
                if pid in self.procs:
                    continue
                st = read_stat(pid)
                if st is None or st.ppid != parent.pid or (pid, st.start_ticks) in self.gone:
                    continue
                self.seen.add(pid)
                proc = self._adopt(pid, st, top=False)
                adopted.append(proc)
                if proc.alive:
                    stack.append(proc)
        return adopted

    def _children(self, proc: Proc) -> list[int]:
        """The pids in proc's children file, opened once and checked to be this very process
        (the descriptor then follows it, never a recycled pid); [] when it is gone."""
        try:
            if proc.children_fd is None:
                fd = os.open(f"/proc/{proc.pid}/task/{proc.pid}/children",
                             os.O_RDONLY | os.O_CLOEXEC)
                st = read_stat(proc.pid)
                if st is None or st.start_ticks != proc.start_ticks:
                    os.close(fd)
                    return []
                proc.children_fd = fd
            data = b""
            while part := os.pread(proc.children_fd, 65536, len(data)):
                data += part
            return [int(k) for k in data.split()]
        except (OSError, ValueError):
            return []

    def _member(self, st: Stat) -> bool:
        parent = self.procs.get(st.ppid)
        if parent is not None and parent.alive:
            return True
        if st.pgid != self.run.pgid:
            return False
        return st.sid == self.run.sid if self.run.sid is not None else self.group_is_ours()

    def _adopt(self, pid: int, st: Stat, top: bool) -> Proc:
        parent = self.procs.get(st.ppid)
        proc = Proc(pid, st, top, server=top or (parent is not None and parent.top
                                                  and parent.comm in CONTAINER_INITS),
                    parent_argv=parent.argv if parent is not None else None)
        self.procs[pid] = proc
        if not proc.alive or not self.use_pidfd:
            return proc
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # already gone
            proc.alive = False
            return proc
        again = read_stat(pid)  # the pidfd is this process's only if the pid was not reused
        if again is None or again.start_ticks != st.start_ticks:
            os.close(fd)
            proc.alive = False
            return proc
        proc.pidfd = fd
        self.by_fd[fd] = proc
        self.poller.register(fd, select.POLLIN)
        return proc

    def poll_deaths(self) -> list[Proc]:
        """The live processes without a pidfd that died: one stat read each (the fallback's
        cost; with pidfds the list is empty and nothing is read)."""
        return [p for p in self.alive() if p.pidfd is None and not lives(p)]

    def mark_dead(self, proc: Proc) -> dict:
        """Record a death; return the exit event's fields (code read from the zombie's stat)."""
        code = sig = None
        st = read_stat(proc.pid)
        if st is not None and st.start_ticks == proc.start_ticks and st.dead:
            code, sig = decode_status(st.exit_status)
            proc.state = "zombie" if st.state == "Z" else "dead"
            if st.comm != proc.comm:  # renamed (or exec'd) since we looked: a zombie keeps
                proc.comm = st.comm   # only its comm, so the name comes from that, unless
                proc.inherited = None
                first = proc.argv[0] if proc.argv else ""  # it is the title we read, cut short
                if not first.startswith(st.comm):
                    proc.name = vllm_name(None, st.comm, proc.server)
        else:
            proc.state = "dead"
        self.gone.add((proc.pid, proc.start_ticks))
        if proc.pidfd is not None:
            self.poller.unregister(proc.pidfd)
            self.by_fd.pop(proc.pidfd, None)
            os.close(proc.pidfd)
            proc.pidfd = None
        if proc.children_fd is not None:
            os.close(proc.children_fd)
            proc.children_fd = None
        proc.alive = False
        event = {"pid": proc.pid, "name": proc.name, "code": code, "signal": sig,
                 "time": time.time(), "top": proc.top}
        if proc.inherited is not None:
            event["forked"] = True  # never seen as itself: its name is its parent's
        parent = self.procs.get(proc.ppid)
        if parent is not None and not proc.top and not parent.server:
            # a shell's command fails as part of its script; a wrapper script's (the server
            # command's) children are the server itself, so its name is not given
            event["parent"] = parent.name
        if proc.cpid is not None:
            event["cpid"] = proc.cpid
        return event

    def snapshot(self, now: float, secrets: list[str]) -> list[dict]:
        """procs message body: live processes, and each dead one once (alive false)."""
        out = []
        for pid, p in list(self.procs.items()):
            st = read_stat(pid) if p.alive else None
            if st is not None and st.start_ticks == p.start_ticks and not st.dead:
                if st.comm != p.comm or p.name == "mp-spawn" or p.inherited is not None:
                    p.comm = st.comm  # exec'd, or a title set since (a forked child's too)
                    p.argv = read_cmdline(pid) or p.argv
                    p.name = vllm_name(p.argv, st.comm, p.server)
                    if p.argv != p.inherited:
                        p.inherited = None
                cpu = None
                if p.cpu_prev is not None and now > p.cpu_prev[1]:
                    cpu = round((st.cpu_ticks - p.cpu_prev[0]) / CLK_TCK
                                / (now - p.cpu_prev[1]) * 100, 1)
                p.cpu_prev = (st.cpu_ticks, now)
                p.ppid, p.state = st.ppid, STATES.get(st.state, st.state)
                out.append(self._row(p, cpu, st.rss, secrets))
            elif not p.alive:
                out.append(self._row(p, None, None, secrets))
                del self.procs[pid]
        return out

    def _row(self, p: Proc, cpu: float | None, rss: int | None, secrets: list[str]) -> dict:
        cmd = " ".join(p.argv or [])[:MAX_CMD]
        row = {"pid": p.pid, "ppid": p.ppid, "name": redact(p.name, secrets),
               "cmd": redact(cmd, secrets),
               "state": p.state, "cpu": cpu, "rss": rss,
               "started": round(self.boot + p.start_ticks / CLK_TCK, 2), "alive": p.alive}
        if p.cpid is not None:
            row["cpid"] = p.cpid
        return row

    def close(self) -> None:
        for fd in list(self.by_fd):
            os.close(fd)
        self.by_fd.clear()
        for proc in self.procs.values():
            if proc.children_fd is not None:
                os.close(proc.children_fd)
                proc.children_fd = None


def env_members(run: Run, exclude: set[int]) -> list[int]:
    """Every live process whose environ carries this run's id (uncached: kill's sweep)."""
    out = []
    try:
        pids = list_pids()
    except OSError:
        return out
    for pid in pids - exclude:
        env = read_environ(pid)
        if env is not None and run.env_needle in env:
            st = read_stat(pid)
            if st is not None and not st.dead:
                out.append(pid)
    return sorted(out)
