"""`watch`: the long-lived stream — hello, procs, gpus, log, exit — from one thread and one
poll() over stdin, the pidfds and the timers."""

from __future__ import annotations

import os
import platform
import select
import socket
import sys
import time

import psutil

from .health import Health
from .logtail import LogTail
from .nvml import Gpus
from .procfs import pidfd_supported
from .redaction import SecretFinder, redact
from .rundir import Run
from .tracker import Proc, Tracker
from .wire import AGENT_VERSION, emit, spec_strings, spec_value

YOUNG = 60.0  # seconds: processes this young are checked for new children ...
YOUNG_EVERY = 0.1  # ... this often (vLLM spawns its engine and workers in their first seconds)
DISK_LOW = 256 << 20  # free bytes under which the disk of the run's log is said to be low
DISK_FULL = 64 << 10  # ...and full: the server's next lines may be lost


def disk_level(path: str, low: int) -> tuple[str, int | None]:
    """("ok" | "low" | "full", free bytes) for the file system holding `path`, as an
    unprivileged writer sees it; ("ok", None) when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return "ok", None
    free = st.f_bavail * st.f_frsize
    return ("full" if free < min(low, DISK_FULL) else "low" if free < low else "ok"), free


def cmd_watch(spec: dict) -> int:
    run = Run(spec_value(spec, "run_dir", str))
    log_offset = spec_value(spec, "log_offset", int, 0)
    intervals = (max(0.01, float(spec_value(spec, "procs_interval", (int, float), 1.0))),
                 max(0.01, float(spec_value(spec, "gpus_interval", (int, float), 1.0))),
                 max(0.005, float(spec_value(spec, "log_interval", (int, float), 0.05))))
    health_spec = spec_value(spec, "health", dict, None) or {}
    port = spec_value(health_spec, "port", int, None)
    health_paths = spec_strings(health_spec, "paths") or ["/health"]
    health_every = max(0.05, float(spec_value(health_spec, "interval", (int, float), 1.0)))
    serving_every = max(health_every, float(spec_value(health_spec, "serving_interval",
                                                       (int, float), 10.0)))
    metrics_spec = spec_value(spec, "metrics", dict, None)
    metrics = None if metrics_spec is None else (
        spec_value(metrics_spec, "path", str, "/metrics"),
        tuple(spec_strings(metrics_spec, "prefixes")) or ("",))
    secrets = list(spec_strings(spec, "redact"))
    secret_env = spec_strings(spec, "secret_env")
    disk_low = max(0, spec_value(spec, "disk_low", int, DISK_LOW))
    use_pidfd = pidfd_supported()
    gpus = Gpus()
    found = run.env_secrets(secret_env)  # None only while the pid file is missing (mid-launch)
    secrets += found or []
    emit("hello", agent=AGENT_VERSION, python=platform.python_version(),
         psutil=psutil.__version__, pynvml=gpus.version,
         nvml={"ok": gpus.ok, "error": gpus.error}, gpu_count=len(gpus.handles),
         host=socket.gethostname(), pidfd=use_pidfd, run_id=run.run_id, time=time.time(),
         redact=found or [])
    health = None
    if port is not None:
        health = Health(port, health_paths, health_every, serving_every, metrics)
        health.start()
    skim = spec_value(spec, "skim", dict, None)
    tail = LogTail(run.log, log_offset, SecretFinder(run.launch.get("secret_hashes"), secrets),
                   None if skim is None else (max(0, spec_value(skim, "head", int)),
                                              max(0, spec_value(skim, "tail", int))),
                   follow=isinstance((run.attached or {}).get("log"), str))
    watcher = Watcher(run, use_pidfd, tail, gpus, health, intervals,
                      secrets, secret_env if found is None else [], disk_low)
    watcher.loop()
    return 0


class Watcher:
    """One thread, one poll(): stdin, the pidfds, and timers for log, procs, gpus."""

    def __init__(self, run: Run, use_pidfd: bool, tail: LogTail, gpus: Gpus,
                 health: Health | None, intervals: tuple[float, float, float],
                 secrets: list[str], secret_env: list[str], disk_low: int = DISK_LOW) -> None:
        """secrets: values hidden in procs rows; secret_env: names whose values are still to
        be read from the top's environ (its pid was unknown at hello), then sent and hidden."""
        self.run, self.tail, self.gpus, self.health = run, tail, gpus, health
        self.procs_every, self.gpus_every, self.log_every = intervals
        self.secrets, self.secret_env = secrets, secret_env
        self.tracker = Tracker(run, use_pidfd)
        self.stdin = sys.stdin.fileno()
        self.tracker.poller.register(self.stdin, select.POLLIN | select.POLLHUP)
        self.run_exited = False
        self.exit_due = False  # the top died: look for exit.json every tick, not every second
        self.finished = False
        self.disk_low, self.disk = disk_low, "ok"  # the log's disk: said when its level changes

    def loop(self) -> None:
        now = time.monotonic()
        next_log = next_procs = next_gpus = next_young = now
        idle = 0
        while True:
            due = min(next_log, next_procs, next_gpus if self.gpus.nv is not None else next_log)
            timeout = max(0.0, due - time.monotonic())
            if not self.tracker.use_pidfd:  # deaths are found by polling: poll often
                timeout = min(timeout, self.log_every)
            dead = []
            for fd, _ in self.tracker.poller.poll(timeout * 1000):
                if fd == self.stdin:
                    if not self._read_stdin():
                        return
                elif fd in self.tracker.by_fd:
                    dead.append(self.tracker.by_fd[fd])
            if dead:
                self._died(dead)
            now = time.monotonic()
            if not self.tracker.use_pidfd and (dead := self.tracker.poll_deaths()):
                self._died(dead)
            if now >= next_procs:
                next_procs = now + self.procs_every
                self._procs()
                self._check_exit()
            if now >= next_log:
                if self.exit_due:
                    self._check_exit()
                if now >= next_young:
                    next_young = now + YOUNG_EVERY
                    self._adopt(self.tracker.scan_children(YOUNG))
                # a quiet log is looked at less often (up to 8x, at most 0.5 s): wakeups are
                # most of an idle agent's cost; deaths come from pidfds and pump the log too
                idle = 0 if self._tail() or self.exit_due else min(idle + 1, 3)
                next_log = now + min(self.log_every * 2**idle, max(self.log_every, 0.5))
            if self.gpus.nv is not None and now >= next_gpus:
                if self.gpus.init():
                    next_gpus = now + self.gpus_every
                    emit("gpus", time=time.time(), gpus=self.gpus.sample())
                else:
                    next_gpus = now + max(self.gpus_every, 2.0)

    def _read_stdin(self) -> bool:
        try:
            return bool(os.read(self.stdin, 65536))
        except OSError:
            return False

    def _died(self, procs: list[Proc]) -> None:
        """Report processes found dead in one wakeup, oldest first (a parent started before its
        children, which die of its death; poll() returns fds in no such order): every stat is
        read before anything else, as their parents may reap them any moment."""
        procs = sorted(procs, key=lambda p: p.start_ticks)
        events = [self.tracker.mark_dead(p) for p in procs]
        self.tail.pump()  # the dying processes' last lines (tracebacks) come before their exits
        for event in events:
            self.exit_due = self.exit_due or event["top"]
            if event["top"] and event["code"] is None and event["signal"] is None:
                # the monitor reaped it before we read its stat: exit.json follows within ms
                deadline = time.monotonic() + 0.05
                while (info := self.run.exit_info()) is None and time.monotonic() < deadline:
                    time.sleep(0.005)
                if info is not None:
                    event["code"], event["signal"] = info.get("code"), info.get("signal")
            event["name"] = redact(event["name"], self.secrets)  # a title may hold a secret
            emit("exit", **event)

    def _procs(self) -> None:
        if self.tracker.run.top_pid is None:
            self.run.load_pid()
        if self.secret_env:
            found = self.run.env_secrets(self.secret_env)
            if found is not None:  # the top pid is known now: once, before any procs row
                self.secret_env = []
                self.secrets.extend(found)
                if found:
                    emit("secrets", redact=found)
        self._adopt(self.tracker.scan())
        self._check_disk()
        emit("procs", time=time.time(), procs=self.tracker.snapshot(time.monotonic(),
                                                                    self.secrets))

    def _check_disk(self) -> None:
        """The server appends its output to server.log: on a full disk those lines are lost
        and nothing else would say so (one statvfs a procs tick)."""
        level, free = disk_level(self.run.dir, self.disk_low)
        if level != self.disk:
            self.disk = level
            emit("disk", level=level, free=free, path=self.run.dir, time=time.time())

    def _adopt(self, procs: list[Proc]) -> None:
        """Found already dead (a zombie, or gone before its pidfd opened): report it now."""
        if dead := [p for p in procs if not p.alive]:
            self._died(dead)

    def _check_exit(self) -> None:
        """run_exit once exit.json exists (the monitor writes it after reaping the top)."""
        if self.run_exited:
            return
        info = self.run.exit_info()
        if info is not None:
            self.run_exited = True
            self.exit_due = False
            self.tail.pump()
            emit("run_exit", pid=info.get("pid"), code=info.get("code"),
                 signal=info.get("signal"), time=info.get("time"),
                 oom_killed=info.get("oom_killed") is True, container=info.get("container"))

    def _tail(self) -> bool:
        if self.run_exited and not self.tracker.alive():
            if not self.finished:
                self.finished = True
                if self.health is not None:
                    self.health.stop.set()
            return self.tail.pump(final=True)
        return self.tail.pump()
