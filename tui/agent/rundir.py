"""A run directory as the launcher leaves it: launch.json, pid, exit.json, server.log.

Files are written atomically (tmp + fsync + rename): a reader sees the old file or the new one.
"""

from __future__ import annotations

import contextlib
import json
import os

from .procfs import Stat, env_values, read_environ, read_stat
from .wire import AgentFailure

ENV_KEY = "SPECCONSOLE_RUN_ID"
# in the run directory while a container's monitor sets it up (removes the profile's ended
# containers, pulls the image, runs it), until the container's pid is recorded or its end is
STARTING = "starting"


def write_json_atomic(path: str, obj: object) -> None:
    """tmp + fsync + os.replace: a reader sees the old file or the whole new one, never half."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            data = json.dumps(obj).encode()
            while data:  # os.write may write less than asked
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            obj = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


class Run:
    """A run directory as the launcher left it (launch.json, pid, exit.json, server.log)."""

    def __init__(self, run_dir: str) -> None:
        self.dir = os.path.abspath(os.path.expanduser(run_dir))
        launch = read_json(os.path.join(self.dir, "launch.json"))
        if launch is None:
            raise AgentFailure("run_not_found", f"no run at {self.dir} (launch.json missing)")
        self.launch = launch
        self.run_id = str(launch.get("run_id") or os.path.basename(self.dir))
        self.env_needle = f"\0{ENV_KEY}={self.run_id}\0".encode()
        self.log = os.path.join(self.dir, "server.log")
        self.exit_path = os.path.join(self.dir, "exit.json")
        self.pidinfo: dict = {}
        self.load_pid()

    def load_pid(self) -> None:
        self.pidinfo = read_json(os.path.join(self.dir, "pid")) or {}

    def _int(self, key: str) -> int | None:
        value = self.pidinfo.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def top_pid(self) -> int | None:
        return self._int("pid")

    @property
    def pgid(self) -> int | None:
        return self._int("pgid")

    @property
    def sid(self) -> int | None:
        return self._int("sid")

    @property
    def monitor_pid(self) -> int | None:
        return self._int("monitor_pid")

    @property
    def attached(self) -> dict | None:
        """What an attached run follows (tui/agent/attach.py); None for a launched run."""
        facts = self.launch.get("attached")
        return facts if isinstance(facts, dict) else None

    @property
    def container(self) -> dict | None:
        """{runtime, name, image, python} of a containerised run (see container.Box.record), or of
        the container an attached run follows (by id: its name may be taken again)."""
        facts = self.attached
        box = self.launch.get("container") if facts is None or facts.get("kind") != "container" \
            else {"runtime": facts.get("runtime"), "name": facts.get("id")}
        return box if isinstance(box, dict) and isinstance(box.get("name"), str) \
            and box.get("runtime") in ("docker", "podman") else None

    def exit_info(self) -> dict | None:
        return read_json(self.exit_path)

    def starting(self) -> dict | None:
        """{monitor_pid, start_ticks, image, pulling} while the monitor sets the container up
        (no top process yet); None once the container's pid or its end is recorded, or when
        that monitor is gone."""
        info = read_json(os.path.join(self.dir, STARTING))
        pid = info.get("monitor_pid") if info is not None else None
        if not isinstance(pid, int) or self.exit_info() is not None:
            return None
        st = read_stat(pid)
        alive = st is not None and not st.dead and st.start_ticks == info.get("start_ticks")
        return info if alive else None

    def env_secrets(self, names: list[str]) -> list[str] | None:
        """The top process's values of the variables `names`; None while its pid is unknown.

        Read from /proc/<top pid>/environ, only while that pid is still the recorded top (a
        recycled pid's environ is not ours to report); a top already gone yields [].
        """
        if not names:
            return []
        pid = self.top_pid
        if pid is None:
            return [] if self.pidinfo or self.exit_info() is not None else None
        st = read_stat(pid)
        if st is None or st.dead or not self.is_top(st):
            return []
        environ = read_environ(pid)
        return env_values(environ, names) if environ is not None else []

    def top_alive(self) -> bool:
        """The top process lives: the very process recorded (start time), not a zombie."""
        if self.top_pid is None or os.path.exists(self.exit_path):
            return False
        st = read_stat(self.top_pid)
        return st is not None and not st.dead and self.is_top(st)

    def is_top(self, st: Stat) -> bool:
        """st (read from the recorded top pid) is the run's top, not a recycled pid: same start
        time, or, for a pid file without one, the run id in its environ."""
        ticks = self._int("start_ticks")
        if ticks is not None:
            return st.start_ticks == ticks
        env = read_environ(self.top_pid or 0)  # unreadable: not provably ours
        return env is not None and self.env_needle in env


def run_id_of(pid: int) -> str | None:
    """The SPECCONSOLE_RUN_ID in a process's environment, if it carries one."""
    env = read_environ(pid)
    key = f"\0{ENV_KEY}=".encode()
    at = env.find(key) if env is not None else -1
    if at < 0:
        return None
    start = at + len(key)
    return env[start:env.index(b"\0", start)].decode("utf-8", "replace") or None
