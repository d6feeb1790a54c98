"""The monitor of a containerised run: it sets the container up (the profile's ended containers
removed, the image pulled, `docker run -d`), records the container's main process as the run's
top, waits for its end through the runtime and writes exit.json.

It never dies silently: every way out, an error of any kind included, writes exit.json with the
reason in one line (and that line into server.log). From its start until the container's pid
or its end is recorded, the start marker (rundir.STARTING) names it, so a kill in that window
TERMs it and it stops what it started instead of a container coming up after the kill. A
`docker wait` that fails (the daemon restarted, its socket went away) is not the container's
end: the monitor asks again until the runtime can say how the container ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from . import container
from .procfs import alive, read_stat
from .rundir import STARTING, write_json_atomic
from .wire import AgentFailure

RETRY_S = 1.0  # between two asks of a runtime that did not answer
GONE_DAEMON_S = 60.0  # the top process ended and the daemon still silent: say so


class BoxMonitor:
    """One containerised run's monitor (runs in the detached monitor process)."""

    def __init__(self, box: container.Box, run_dir: str, argv: list[str],
                 env: dict[str, str]) -> None:
        self.box = box
        self.run_dir = run_dir
        self.argv = argv
        self.env = env
        self.pid_path = os.path.join(run_dir, "pid")
        self.exit_path = os.path.join(run_dir, "exit.json")
        self.marker = os.path.join(run_dir, STARTING)
        self.pull: container.Pull | None = None
        self.stopping = False
        self.pid: int | None = None  # the container's main process, once recorded

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        try:
            pid = self._start()
            if pid is not None:
                self._finish(pid, *self._wait(pid))
        except AgentFailure as exc:
            self._failed(str(exc))
        except Exception as exc:  # never silent: the run's end says why, in one line
            self._failed(f"the container's monitor failed: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())}")

    def _on_term(self, *_: object) -> None:
        """A kill while the container is set up: the pull ends, no container stays up."""
        self.stopping = True
        if self.pull is not None:
            self.pull.stop()

    def _mark(self, pulling: bool) -> None:
        me = read_stat(os.getpid())
        write_json_atomic(self.marker, {"monitor_pid": os.getpid(), "image": self.box.image,
                                        "start_ticks": me.start_ticks if me else None,
                                        "pulling": pulling})

    def _start(self) -> int | None:
        """The container's main process's host pid, recorded; None when the run ended first
        (exit.json written)."""
        box = self.box
        self._mark(pulling=False)
        container.remove_ended(box)
        if not container.image_present(box):
            if box.pull == "never":
                raise AgentFailure("container", f"image {box.image} is not on this host and "
                                   "container.pull = \"never\"")
            self.pull = container.Pull(box)
            self._mark(pulling=True)
            self.pull.run()
            self._mark(pulling=False)
        if self.stopping:
            what = "pulling image" if self.pull is not None else "starting container"
            self._ended(f"killed while {what} {box.image}", signal.SIGTERM.value)
            return None
        inner = (container.image_entrypoint(box) + box.command if box.entrypoint == "image"
                 else self.argv)
        started = self._run(inner)
        if started.returncode != 0:
            container.remove(box.runtime, box.name, force=True)  # half made: never left behind
            raise AgentFailure("container", "cannot start the container: "
                               f"{started.stderr.strip() or started.stdout.strip()}")
        if self.stopping:  # the kill came while it started: it never serves
            container.remove(box.runtime, box.name, force=True)
            self._ended(f"killed while starting container {box.name}", signal.SIGTERM.value)
            return None
        st = container.state(box.runtime, box.name) or {}
        pid = st.get("Pid") if isinstance(st.get("Pid"), int) and st.get("Pid") > 0 else None
        stat = read_stat(pid) if pid is not None else None
        if pid is None or stat is None:
            raise AgentFailure("container", "the container ended as it started (exit code "
                               f"{st.get('ExitCode')}, {st.get('Error') or 'see server.log'}); "
                               f"`{box.runtime} logs {box.name}` has what it printed before "
                               "its command ran")
        write_json_atomic(self.pid_path, {
            "pid": pid, "pgid": stat.pgid, "monitor_pid": os.getpid(), "sid": stat.sid,
            "start_ticks": stat.start_ticks, "container": box.name,
            "started_at": st.get("StartedAt"),
        })
        self._unmark()
        self.pid = pid
        return pid

    def _run(self, inner: list[str]) -> subprocess.CompletedProcess[str]:
        """`run -d` with the secrets in a file of their own (never on the runtime's command
        line, in its environment or in what `inspect` shows); the host's name for that file
        is gone once the client returns. A client that times out leaves no container."""
        box = self.box
        secrets_path = os.path.join(self.run_dir, container.SECRETS)
        secret = container.write_secrets(secrets_path, self.env, box.secret_env)
        client = {k: v for k, v in self.env.items() if k not in box.secret_env}
        try:
            return container.cli(box.runtime, *container.run_argv(
                box, self.run_dir, inner, secret)[1:], timeout=container.RUN_TIMEOUT,
                env=client)
        except AgentFailure:
            container.remove(box.runtime, box.name, force=True)
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(secrets_path)

    def _wait(self, pid: int) -> tuple[int | None, bool, str | None]:
        """(exit code, OOMKilled, why in words when the runtime's wait failed) once the
        container ended. A failed wait is asked again: the container may still run (a daemon
        restarted with live-restore), or have died with the daemon."""
        box, trusted = self.box, True  # a wait's code is its end unless a wait failed unseen
        silent_since: float | None = None
        while True:
            code = container.wait(box.runtime, box.name)
            st = container.state(box.runtime, box.name)
            if code is not None and trusted:
                st = st or {}
                return code, st.get("OOMKilled") is True, None
            trusted = False
            if st is None:
                if container.answers(box.runtime):
                    return None, False, (f"the container {box.name} was removed before "
                                         f"{box.runtime} could say how it ended")
                silent_since = silent_since or time.monotonic()
                if not alive(pid) and time.monotonic() - silent_since > GONE_DAEMON_S:
                    return None, False, (f"the {box.runtime} daemon does not answer and the "
                                         "container's main process has ended")
                time.sleep(RETRY_S)
                continue
            silent_since = None
            if st.get("Running") and alive(pid):
                trusted = True  # the daemon is back and the container lives: wait again
                time.sleep(RETRY_S)
                continue
            code = st.get("ExitCode") if isinstance(st.get("ExitCode"), int) else None
            return code, st.get("OOMKilled") is True, (
                f"the {box.runtime} daemon restarted; the container died with it (exit code "
                f"{code})" if box.runtime == "docker" else
                f"`podman wait` failed; the container ended with exit code {code}")

    def _finish(self, pid: int, code: int | None, oom: bool, why: str | None) -> None:
        if why is not None:
            self._say(why)
        write_json_atomic(self.exit_path, {
            "pid": pid, "code": code, "signal": None, "time": time.time(),
            "oom_killed": oom, "container": self.box.name,
            **({"error": why} if why is not None else {}),
        })

    def _say(self, message: str) -> None:
        with contextlib.suppress(OSError):
            os.write(2, f"specconsole: {message}\n".encode("utf-8", "replace"))

    def _ended(self, message: str, sig: int | None, code: int | None = None) -> None:
        """The run ended before its container ran: exit.json and a pid file without a pid."""
        self._say(message)
        write_json_atomic(self.exit_path, {"pid": None, "code": code, "signal": sig,
                                           "time": time.time(), "error": message,
                                           "container": self.box.name})
        write_json_atomic(self.pid_path, {"pid": None, "pgid": None,
                                          "monitor_pid": os.getpid()})
        self._unmark()

    def _failed(self, message: str) -> None:
        if os.path.exists(self.exit_path):
            return
        if self.pid is not None:  # the container ran: its pid file stays as it is
            self._finish(self.pid, None, False, message)
            return
        self._ended(message, None, 127)

    def _unmark(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.marker)
