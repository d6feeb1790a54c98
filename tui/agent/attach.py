"""`attach`: a run directory for a server specconsole did not launch — a container started by
`docker run` or compose, or a bare process — so that watch, logs and kill follow it as they
follow a launched run.  Nothing is started but a detached helper (launch.detach), which keeps
the run's server.log and writes exit.json when the server ends.

The record names what was attached and when it started (the container's id and StartedAt, or
the pid's start ticks): a re-attach reuses a live record, and a reused pid or a container
recreated under the same name is never taken for the one attached.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import subprocess
import time

from . import container
from .launch import detach
from .procfs import CLK_TCK, boot_time, read_cmdline, read_stat
from .redaction import redact, secret_hashes
from .rundir import Run, write_json_atomic
from .runs import run_row
from .wire import AGENT_VERSION, AgentFailure, SpecError, emit, spec_strings, spec_value

RESTART_PAUSE = 1.0  # seconds between two `logs --follow` when the runtime ended one early


def cmd_attach(spec: dict) -> int:
    runs_dir = os.path.expanduser(spec_value(spec, "runs_dir", str))
    run_id = spec_value(spec, "run_id", str)
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise SpecError(f"bad run_id {run_id!r}")
    target = spec_value(spec, "target", dict)
    secrets = spec_strings(spec, "redact")
    name = spec_value(target, "container", str, None)
    if name is not None:
        runtime = spec_value(target, "runtime", str, "docker")
        if runtime not in ("docker", "podman"):
            raise SpecError(f"unknown container runtime {runtime!r}")
        facts, log = _container_facts(runtime, name), None
    else:
        facts = _pid_facts(spec_value(target, "pid", int))
        log = _log_of(facts["pid"], spec_value(target, "log", str, None))
    run = _existing(runs_dir, facts)
    if run is None:
        run = _record(runs_dir, run_id, spec, facts, log, secrets)
    emit("runs", runs=[run_row(run)])
    return 0


def _container_facts(runtime: str, name: str) -> dict:
    done = container.cli(runtime, "inspect", "--type", "container", name)
    try:
        found = json.loads(done.stdout) if done.returncode == 0 else []
    except ValueError:
        found = []
    if not found or not isinstance(found[0], dict):
        raise AgentFailure("attach", f"no container {name!r}: {done.stderr.strip()}"
                           f" (`{runtime} ps` lists them)")
    info = found[0]
    state = info.get("State") or {}
    pid = state.get("Pid")
    if not state.get("Running") or not isinstance(pid, int) or pid <= 0:
        raise AgentFailure("attach", f"container {name!r} is not running ({state.get('Status')}"
                           f", exit code {state.get('ExitCode')}): nothing to attach to")
    facts = _pid_facts(pid)
    config = info.get("Config") or {}
    labels = config.get("Labels") or {}
    facts.update(kind="container", runtime=runtime, id=str(info.get("Id") or ""),
                 name=str(info.get("Name") or name).lstrip("/"),
                 started_at=str(state.get("StartedAt") or ""), image=config.get("Image"),
                 compose=labels.get("com.docker.compose.project"))
    return facts


def _pid_facts(pid: int) -> dict:
    st = read_stat(pid)
    if pid <= 1 or st is None or st.dead:
        raise AgentFailure("attach", f"no live process {pid} on this host")
    try:
        user = pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
    except (OSError, KeyError):
        user = None
    return {"kind": "pid", "pid": pid, "start_ticks": st.start_ticks,
            "started": round(boot_time() + st.start_ticks / CLK_TCK, 2), "user": user,
            "pgid": st.pgid, "sid": st.sid, "cmd": " ".join(read_cmdline(pid) or [st.comm])}


def _same(a: dict, b: dict) -> bool:
    """The same server: the same container start (id and StartedAt), or the same process."""
    keys = ("id", "started_at") if b.get("kind") == "container" else ("pid", "start_ticks")
    return a.get("kind") == b.get("kind") and all(a.get(k) == b.get(k) for k in keys)


def _existing(runs_dir: str, facts: dict) -> Run | None:
    """A live record of this very server, which a re-attach goes on with (same run, same
    log): its helper still copies the log, so no line is copied twice."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(runs_dir):
            try:
                run = Run(entry.path)
            except AgentFailure:
                continue
            recorded = run.launch.get("attached")
            if isinstance(recorded, dict) and _same(recorded, facts) and run.top_alive():
                return run
    return None


def _log_of(pid: int, given: str | None) -> str | None:
    """The bare process's log: the file named, else the regular file its stdout goes to."""
    if given is not None:
        path = os.path.abspath(os.path.expanduser(given))
        if not os.path.isfile(path):
            raise AgentFailure("attach", f"no log file {path}")
        return path
    with contextlib.suppress(OSError):
        path = os.readlink(f"/proc/{pid}/fd/1")
        if path.startswith("/") and os.path.isfile(f"/proc/{pid}/fd/1"):
            return path
    return None


def _record(runs_dir: str, run_id: str, spec: dict, facts: dict, log: str | None,
            secrets: list[str]) -> Run:
    """The run directory: launch.json (attached, not launched), pid (the top: the container's
    main process or the pid given, with its start ticks), server.log, and the helper."""
    run_dir = os.path.join(os.path.abspath(runs_dir), run_id)
    try:
        os.makedirs(runs_dir, mode=0o700, exist_ok=True)
        os.mkdir(run_dir, 0o700)
    except OSError as exc:
        raise AgentFailure("run_dir", f"cannot create {run_dir}: {exc.strerror or exc}") from None
    facts = {**facts, "cmd": redact(facts["cmd"], secrets), "log": log}
    write_json_atomic(os.path.join(run_dir, "launch.json"), {
        "run_id": run_id, "profile_key": spec.get("profile_key"),
        "argv": facts["cmd"].split(), "env_names": [], "cwd": None,
        "started": facts["started"], "agent_version": AGENT_VERSION,
        "secret_hashes": secret_hashes(secrets), "served": spec.get("served"),
        "attached": facts})
    server_log = os.path.join(run_dir, "server.log")
    if log is not None:  # the process's own file, read in place (offsets are its bytes)
        os.symlink(log, server_log)
    else:  # the container's log, copied in by the helper; or none at all
        os.close(os.open(server_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    # the helper's fd 1: where it copies a container's log; never the user's own file
    log_fd = os.open(server_log if facts["kind"] == "container" else os.devnull,
                     os.O_WRONLY | os.O_APPEND)
    pid = facts["pid"]
    top = {"pid": pid, "pgid": facts["pgid"] if facts["pgid"] == pid else None,
           "sid": facts["sid"] if facts["pgid"] == pid else None,
           "start_ticks": facts["start_ticks"], "attached": True}
    if facts["kind"] == "container":
        top["container"] = facts["name"]
    write_json_atomic(os.path.join(run_dir, "pid"), top)
    child = os.fork()
    if child == 0:  # the helper-to-be; it never returns into the agent
        status = 0
        try:
            detach(log_fd)
            _helper(run_dir, facts)
        except BaseException:
            status = 1
        os._exit(status)
    os.close(log_fd)
    os.waitpid(child, 0)
    return Run(run_dir)


def _helper(run_dir: str, facts: dict) -> None:
    """Detached: copy the container's log into server.log (or, for a bare process, only wait),
    then write exit.json when the server ends.  The monitor pid is recorded so that a kill
    never signals it."""
    pid_path = os.path.join(run_dir, "pid")
    with open(pid_path, "rb") as f:
        top = json.loads(f.read())
    top["monitor_pid"] = os.getpid()
    write_json_atomic(pid_path, top)
    exit_info: dict = {"pid": facts["pid"], "code": None, "signal": None, "attached": True}
    if facts["kind"] == "container":
        exit_info.update(_copy_container_log(facts, os.path.join(run_dir, "server.log")))
    else:
        _wait_pid(facts["pid"], facts["start_ticks"])
    exit_info["time"] = time.time()
    write_json_atomic(os.path.join(run_dir, "exit.json"), exit_info)


def _copy_container_log(facts: dict, server_log: str) -> dict:
    """`logs --follow` from the start, appended to server.log (fd 1) past the bytes it holds
    already: the whole log is read once, and a follow the runtime ends early (a daemon
    restart) resumes without a line twice.  Returns the container's end for exit.json."""
    runtime, cid = facts["runtime"], facts["id"]
    while True:
        have = os.path.getsize(server_log)
        with subprocess.Popen([runtime, "logs", "--follow", cid], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=container.client_env()) as follow:
            assert follow.stdout is not None
            while chunk := follow.stdout.read1(65536):
                if have >= len(chunk):
                    have -= len(chunk)
                    continue
                chunk, have = chunk[have:], 0
                while chunk:
                    chunk = chunk[os.write(1, chunk):]
        state = container.state(runtime, cid) or {}
        if not state.get("Running") or state.get("StartedAt") != facts["started_at"]:
            code = state.get("ExitCode")
            return {"code": code if isinstance(code, int) else None,
                    "oom_killed": state.get("OOMKilled") is True, "container": facts["name"]}
        time.sleep(RESTART_PAUSE)


def _wait_pid(pid: int, ticks: int) -> None:
    """Until the attached process ends (its pidfd, else a stat a second); not our child, so
    its exit code cannot be read."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    st = read_stat(pid)
    if st is None or st.start_ticks != ticks:
        return
    if fd is not None:
        select.select([fd], [], [])
        return
    while (st := read_stat(pid)) is not None and not st.dead and st.start_ticks == ticks:
        time.sleep(1.0)
