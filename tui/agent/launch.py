"""`launch`: start the server detached (new session, own process group) under a monitor that
records its pid and its exit, with all output appended to the run's server.log.

Inside a Slurm job (`hold`), the launch then stays until the server ends, so the job lasts as
long as the server; the scheduler's SIGTERM at the job's end (its time limit, scancel) is
passed to the server's process group, which left the job's process tree when it detached.
On each node of a several-node job (`request`) the launch first waits for its member's spec,
which the console writes when that member's turn comes; where another member follows on the
same node (Ray's head, then the server), that launch is forked and the next one waited for."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

from . import container
from .boxmonitor import BoxMonitor
from .procfs import alive, own_group, read_stat
from .redaction import redact, secret_hashes
from .rundir import ENV_KEY, STARTING, read_json, write_json_atomic
from .wire import AGENT_VERSION, AgentFailure, SpecError, emit, spec_strings, spec_value


def cmd_launch(spec: dict) -> int:
    request = spec_value(spec, "request", str, None)
    if request is None:
        return _launch(spec)
    wait_s = float(spec_value(spec, "wait_s", (int, float), 600))
    others: list[int] = []  # the launches forked for this node's earlier members
    while (asked := _await_request(request, wait_s)) is not None:
        if not spec_value(asked, "more_on_node", bool, False):
            code = _launch(asked)
            break
        sys.stdout.flush()
        child = os.fork()
        if child == 0:  # this member's launch and hold; the next member's is waited for above
            return _launch(asked)
        others.append(child)
    else:
        code = 0  # no (further) member was launched here: the node is left to the job's end
    return max([code, *(_ended_code(pid) for pid in others)])


def _ended_code(pid: int) -> int:
    """A forked launch's end: 0 when its server ended well, else 1 (as _hold says)."""
    _, status = os.waitpid(pid, 0)
    return 0 if os.waitstatus_to_exitcode(status) == 0 else 1


def _launch(spec: dict) -> int:
    """One server's launch (and, in a job, its hold)."""
    run_id = spec_value(spec, "run_id", str)
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise SpecError(f"bad run_id {run_id!r}")
    argv = spec_strings(spec, "argv")
    if not argv:
        raise SpecError("spec 'argv' is empty")
    env = spec_value(spec, "env", dict, {}) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SpecError("spec 'env' must map strings to strings")
    secrets = spec_strings(spec, "redact")
    box_spec = spec_value(spec, "container", dict, None)
    box = container.Box(box_spec) if box_spec is not None else None
    cwd = spec_value(spec, "cwd", str, None)
    cwd = os.path.abspath(os.path.expanduser(cwd)) if cwd else os.getcwd()
    runs_dir = os.path.expanduser(spec_value(spec, "runs_dir", str))
    run_dir = os.path.abspath(os.path.join(runs_dir, run_id))
    # made beforehand with the job script in it (a Slurm launch), still without a launch
    prepared = spec_value(spec, "prepared", bool, False)
    hold = spec_value(spec, "hold", bool, False)
    restart = requeued_count() if hold else 0
    try:
        os.makedirs(runs_dir, mode=0o700, exist_ok=True)
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        if not prepared or (os.path.exists(os.path.join(run_dir, "launch.json"))
                            and not restart):
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
            "secret_hashes": secret_hashes(secrets), "served": spec.get("served"),
            "container": box.record() if box is not None else None,
        })
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if restart:
            _allocation_again(run_dir, log_fd, restart)
    except OSError as exc:  # a full disk: no half-made run is left behind
        if not prepared:
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
            _become_monitor(run_dir, log_fd, argv, server_env, cwd, box)
        except BaseException:
            traceback.print_exc()  # fd 2 is server.log by then, or still the agent's stderr
            status = 1
        os._exit(status)
    os.close(log_fd)
    os.waitpid(child, 0)
    pid_path = os.path.join(run_dir, "pid")
    # a container's `run -d` may take minutes (its layer made, a large image unpacked)
    deadline = time.monotonic() + (30 if box is None else container.RUN_TIMEOUT + 60)
    while (info := read_json(pid_path)) is None:
        pulling = read_json(os.path.join(run_dir, STARTING))
        if pulling is not None and pulling.get("pulling") is True:
            # the watch shows the pull and picks the container up later
            emit("launched", run_id=run_id, run_dir=run_dir, pid=pulling.get("monitor_pid"),
                 pgid=None, log=log, pulling=pulling.get("image"))
            return 0
        if time.monotonic() > deadline:
            raise AgentFailure("launch_timeout", f"the monitor wrote no pid file in {run_dir}")
        time.sleep(0.005)
    if info.get("pid") is None:
        failure = read_json(os.path.join(run_dir, "exit.json")) or {}
        raise AgentFailure("exec_failed", str(failure.get("error") or "the server did not start"))
    emit("launched", run_id=run_id, run_dir=run_dir, pid=info["pid"], pgid=info["pgid"], log=log)
    return _hold(run_dir, info) if hold else 0


REQUEST_POLL_S = 0.1


def _await_request(pattern: str, wait_s: float) -> dict | None:
    """This node's launch spec (`{node}` in `pattern` is its Slurm name), once the console has
    written it, read and removed (it holds the server's environment); None when none came
    within `wait_s`."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    path = os.path.expanduser(pattern.replace("{node}", node))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(path, encoding="utf-8") as f:
                spec = json.load(f)
        except FileNotFoundError:
            time.sleep(REQUEST_POLL_S)
            continue
        except (OSError, ValueError) as exc:
            raise SpecError(f"cannot read the launch request {path}: {exc}") from None
        with contextlib.suppress(OSError):
            os.unlink(path)
        if not isinstance(spec, dict):
            raise SpecError(f"the launch request {path} is not a spec")
        return spec
    return None


HOLD_POLL_S = 0.2
HOLD_GRACE_S = 3.0  # TERM to KILL of the server's group, well inside Slurm's KillWait
# written by the console before it kills the run through a step of the job: the job stays
# (at most KILL_HOLD_MAX_S) until the kill is verified on the node and the job cancelled
KILL_HOLD = "kill.hold"
KILL_HOLD_MAX_S = 180.0


def _hold(run_dir: str, info: dict) -> int:
    """Wait until the server ends (its exit.json, or its monitor gone), and any kill under way
    (KILL_HOLD) is over; the server's exit code is the job's (0, or 1). A SIGTERM meanwhile
    (the scheduler ending the job) TERMs the server's process group, and KILLs it after
    HOLD_GRACE_S; a SIGTERM, before the server's end was read or during the kill's hold (the
    scancel that follows the verified kill), ends the hold: where the scheduler tracks
    processes by their parents (proctrack/linuxproc), a launch still holding once its job
    script's shell has gone would outlive the job."""
    term_at: list[float] = []  # when the scheduler's SIGTERM came
    code = _hold_server(run_dir, info, term_at)
    hold = os.path.join(run_dir, KILL_HOLD)
    deadline = time.monotonic() + KILL_HOLD_MAX_S
    signal.signal(signal.SIGTERM, lambda signum, frame: term_at.append(time.monotonic()))
    while os.path.exists(hold) and not term_at and time.monotonic() < deadline:
        time.sleep(HOLD_POLL_S)
    return code


def _hold_server(run_dir: str, info: dict, term_at: list[float]) -> int:
    exit_path = os.path.join(run_dir, "exit.json")
    pgid, monitor = info.get("pgid"), info.get("monitor_pid")

    def on_term(signum: int, frame: object) -> None:
        if term_at:
            return
        term_at.append(time.monotonic())
        if isinstance(pgid, int):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
                os.killpg(pgid, signal.SIGCONT)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        ended = read_json(exit_path)
        if ended is not None:
            return 0 if ended.get("code") == 0 else 1
        if isinstance(monitor, int) and not alive(monitor):
            return 1
        if term_at and time.monotonic() - term_at[0] > HOLD_GRACE_S and isinstance(pgid, int):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        time.sleep(HOLD_POLL_S)


def requeued_count() -> int:
    """How many times the scheduler requeued this job (Slurm sets SLURM_RESTART_COUNT in a
    requeued batch job's environment); 0 on its first allocation."""
    count = os.environ.get("SLURM_RESTART_COUNT", "0")
    return int(count) if count.isdigit() else 0


def _allocation_again(run_dir: str, log_fd: int, restart: int) -> None:
    """A requeued job's script runs again with the same run: the last allocation's pid and exit
    are kept aside (pid.N, exit.N.json), so the run's pid and end are the new server's, and
    server.log goes on from where it was (one line says so) for the console that follows the
    run across its allocations, resuming at its byte offset."""
    for name in ("pid", "exit.json"):
        path = os.path.join(run_dir, name)
        stem, dot, ext = name.partition(".")
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, os.path.join(run_dir, f"{stem}.{restart - 1}{dot}{ext}"))
    job = os.environ.get("SLURM_JOB_ID", "?")
    os.write(log_fd, f"specconsole: job {job} requeued (restart {restart}): the server starts "
                     f"again on {os.uname().nodename}\n".encode())


def _runs_dir_fix(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on that disk, or set host.runs_dir to a directory with room"
    return "set host.runs_dir to a directory you can write"


def detach(log_fd: int) -> None:
    """In a forked child: a new session, a second fork (the first child exits), fds 0-2 on
    /dev/null and `log_fd`, every other fd closed, cwd /: what is left outlives the agent and
    never holds its stdout pipe."""
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


def _become_monitor(run_dir: str, log_fd: int, argv: list[str], env: dict, cwd: str,
                    box: container.Box | None = None) -> None:
    """Detach (new session, second fork), start the server (or its container), wait for it,
    write exit.json.

    The monitor's own fds 0-2 go to /dev/null and server.log, and every other fd is closed,
    so it never holds the agent's stdout pipe: an SSH exec returns as soon as the agent exits.
    """
    detach(log_fd)
    pid_path = os.path.join(run_dir, "pid")
    exit_path = os.path.join(run_dir, "exit.json")
    if box is not None:
        BoxMonitor(box, run_dir, argv, env).run()
        return
    try:
        server = subprocess.Popen(argv, stdin=0, stdout=1, stderr=2, env=env, cwd=cwd,
                                  **own_group())
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
        "restart": requeued_count(),  # the job's allocation this server runs in
    })
    rc = server.wait()
    write_json_atomic(exit_path, {
        "pid": server.pid, "code": rc if rc >= 0 else None, "signal": -rc if rc < 0 else None,
        "time": time.time(),
    })
