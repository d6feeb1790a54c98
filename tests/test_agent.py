"""The remote agent, run exactly as the product runs it (bootstrap + archive + spec on stdin),
against real process trees: real forks, real signals, real zombies, no mocks."""

from __future__ import annotations

import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from helpers import carriers, nvml_dir, wait_for

from tui.remote.agent_archive import agent_archive

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = agent_archive()
PY = sys.executable
# Copied from tui/core/protocol.py on purpose: the test pins the agreed bootstrap, not a copy
# that would follow a change there.
BOOTSTRAP = (
    'import sys,os,hashlib,json\n'
    'h=sys.argv.pop(1);r=sys.stdin.buffer;n=int(r.readline());b=r.read(n)\n'
    "d=os.path.expanduser('~/.specconsole/agent');p=os.path.join(d,h+'.pyz')\n"
    'def good():\n'
    ' try:\n'
    "  with open(p,'rb') as f:return hashlib.sha256(f.read()).hexdigest()==h\n"
    ' except OSError:return False\n'
    'def fail(k,m):\n'
    " print(json.dumps({'t':'error','v':1,'kind':k,'message':m}),flush=True);sys.exit(4)\n"
    'if not good() and b and hashlib.sha256(b).hexdigest()==h:\n'
    " t=p+'.%d'%os.getpid()\n"
    ' try:\n'
    '  os.makedirs(d,0o700,exist_ok=True)\n'
    "  with open(t,'wb') as f:f.write(b)\n"
    '  os.replace(t,p)\n'
    " except OSError as e:fail('agent_cache','cannot write '+p+': '+str(e.strerror or e))\n"
    "if not good():fail('agent_missing','no agent '+h[:12]+' in '+d)\n"
    'sys.path.insert(0,p)\n'
    'from specconsole_agent.main import main\n'
    'sys.exit(main())'
)
ENV_KEY = "SPECCONSOLE_RUN_ID"

def agent_env(pythonpath: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_KEY, "PYTHONPATH")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra)
    return env


def agent_input(spec: dict | bytes) -> bytes:
    code = ARCHIVE.data
    line = spec if isinstance(spec, bytes) else json.dumps(spec).encode() + b"\n"
    return b"%d\n" % len(code) + code + line


def run_agent(sub: str, spec: dict | bytes, env: dict | None = None,
              timeout: float = 30) -> tuple[int, list[dict]]:
    """A one-shot subcommand; returns (exit code, messages)."""
    res = subprocess.run([PY, "-u", "-c", BOOTSTRAP, ARCHIVE.digest, sub], input=agent_input(spec),
                         capture_output=True, env=env or agent_env(), timeout=timeout)
    return res.returncode, [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


class Agent:
    """A streaming agent: stdin held open, messages stamped on arrival by a reader thread."""

    def __init__(self, sub: str, spec: dict, env: dict | None = None) -> None:
        self.proc = subprocess.Popen([PY, "-u", "-c", BOOTSTRAP, ARCHIVE.digest, sub],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env or agent_env())
        assert self.proc.stdin is not None
        self.proc.stdin.write(agent_input(spec))
        self.proc.stdin.flush()
        self.q: queue.Queue[tuple[float, dict]] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.q.put((time.monotonic(), json.loads(line)))

    def next(self, t: str, where: Callable[[dict], bool] = lambda m: True,
             timeout: float = 10) -> tuple[float, dict]:
        """The next message of type t matching `where` (earlier ones are kept in .seen)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                stamp, msg = self.q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {t!r} message within {timeout}s; "
                                     f"last: {[m['t'] for m in self.seen[-8:]]}") from None
            self.seen.append(msg)
            assert msg["v"] == 1
            assert not (msg["t"] == "error" and msg.get("kind") == "internal"), msg
            if msg["t"] == t and where(msg):
                return stamp, msg

    def first(self, t: str, where: Callable[[dict], bool] = lambda m: True,
              timeout: float = 10) -> dict:
        """Like next(), but an already received message counts too."""
        for msg in self.seen:
            if msg["t"] == t and where(msg):
                return msg
        return self.next(t, where, timeout)[1]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=10)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[..., tuple[Path, dict]]]:
    """launch(script or argv, ...) -> (run_dir, launched); every run is killed at teardown."""
    launched: list[Path] = []

    def launch(script: str | list[str], env: dict | None = None, redact: list[str] = (),
               profile_key: str = "test", agent_environ: dict | None = None
               ) -> tuple[Path, dict]:
        run_id = f"test-{uuid.uuid4().hex[:8]}"
        argv = [PY, "-c", script] if isinstance(script, str) else script
        spec = {"run_id": run_id, "runs_dir": str(tmp_path / "runs"), "profile_key": profile_key,
                "argv": argv, "env": env or {}, "redact": list(redact), "cwd": str(tmp_path)}
        rc, msgs = run_agent("launch", spec, env=agent_environ, timeout=15)
        run_dir = tmp_path / "runs" / run_id
        launched.append(run_dir)
        assert rc == 0, msgs
        assert msgs[-1]["t"] == "launched", msgs
        return run_dir, msgs[-1]

    yield launch
    for run_dir in launched:
        if (run_dir / "launch.json").exists():
            run_agent("kill", {"run_dir": str(run_dir), "grace": 0}, timeout=60)




def watch_spec(run_dir: Path, **kw: object) -> dict:
    spec = {"run_dir": str(run_dir), "log_offset": 0, "procs_interval": 0.1,
            "gpus_interval": 0.5, "log_interval": 0.02, "health": None}
    spec.update(kw)
    return spec


def log_text(run_dir: Path) -> str:
    path = run_dir / "server.log"
    return path.read_text(errors="replace") if path.exists() else ""


# --------------------------------------------------------------------------- pure helpers

@pytest.fixture(scope="module")
def agent_module():
    """The agent's helpers, from the package its archive is built of."""
    from tui.agent import logtail, names, procfs, redaction

    return SimpleNamespace(**{k: v for m in (logtail, names, procfs, redaction)
                              for k, v in vars(m).items() if not k.startswith("__")})


@pytest.mark.parametrize(("argv", "comm", "top", "name"), [
    (["VLLM::EngineCore"], "VLLM::EngineCor", False, "EngineCore"),
    (["VLLM::EngineCore_DP0"], "VLLM::EngineCor", False, "EngineCore_DP0"),
    (["VLLM::Worker_TP3", ""], "VLLM::Worker_TP", False, "Worker_TP3"),
    (["VLLM::Worker"], "VLLM::Worker", False, "Worker"),
    (None, "VLLM::EngineCor", False, "EngineCor"),
    (["/venv/bin/python3", "/venv/bin/vllm", "serve", "/m", "--port", "8000"], "vllm", True,
     "APIServer"),
    (["python3", "-m", "tui.sim.engine", "serve", "m"], "python3", True, "APIServer"),
    (["python3", "-m", "tui.sim.engine", "serve", "m"], "python3", False, "python3"),
    (["python3", "-B", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(8)"],
     "python3", False, "mp-spawn"),
    (["python3", "-c", "from multiprocessing.resource_tracker import main;main(31)"],
     "python3", False, "resource_tracker"),
    (["g++", "-O2"], "g++", False, "g++"),
    (["sglang::scheduler_TP3"], "sglang::schedul", False, "scheduler_TP3"),
    (["sglang::scheduler_DP0_TP3_EP3", "-m", "x"], "sglang::schedul", False,
     "scheduler_DP0_TP3_EP3"),
    (None, "sglang::detoken", False, "detoken"),
    (["/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m"], "python3", True,
     "SGLangServer"),
    (["python3", "-m", "tui.sim.engine", "--sim-engine", "sglang", "--model-path", "m"],
     "python3", True, "SGLangServer"),
    (["ray::RayWorkerWrapper"], "ray::RayWorkerW", False, "RayWorkerWrapper"),
    (["ray::RayWorkerWrapper.execute_method", ""], "ray::RayWorkerW", False, "RayWorkerWrapper"),
    (["ray::IDLE"], "ray::IDLE", False, "IDLE"),
])
def test_vllm_names(agent_module, argv, comm, top, name) -> None:
    assert agent_module.vllm_name(argv, comm, top) == name


def test_stat_parsing_and_vanished_pids(agent_module) -> None:
    fields = " ".join(["S", "10", "20", "30"] + ["0"] * 7 + ["5", "7"] + ["0"] * 6 + ["1234"]
                      + ["0", "3"] + ["0"] * 27 + ["256"])
    st = agent_module.Stat(b"42 (a) (b) " + fields.encode())
    assert (st.comm, st.state, st.ppid, st.pgid, st.sid) == ("a) (b", "S", 10, 20, 30)
    assert (st.cpu_ticks, st.start_ticks, st.exit_status) == (12, 1234, 256)
    assert agent_module.decode_status(256) == (1, None)
    assert agent_module.decode_status(9) == (None, 9)
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: the pid no longer exists
    assert agent_module.read_stat(gone.pid) is None
    assert agent_module.read_cmdline(gone.pid) is None
    assert agent_module.read_environ(gone.pid) is None


def test_redact_matches_the_core_rule(agent_module) -> None:
    from tui.core.command import redact as core_redact

    text = "a abc abcd abcdef --token=abcdef"
    secrets = ["a", "abc", "abcd", "abcdef", ""]
    assert agent_module.redact(text, secrets) == core_redact(text, secrets)
    assert agent_module.redact(text, secrets) == "a abc «redacted» «redacted» --token=«redacted»"
    assert agent_module.REDACTED == "«redacted»"
    assert agent_module.env_values(b"\0A=xyz\0B=long-value\0C=other\0B=long-value\0",
                                   ["A", "B"]) == ["long-value"]


def test_utf8_cut_never_splits_a_character(agent_module) -> None:
    for tail in (b"", "é".encode(), "€".encode(), "𝄞".encode()):
        for keep in range(len(tail) + 1):
            data = b"x" * 10 + tail[:keep]
            cut = agent_module.utf8_cut(data)
            data[:cut].decode("utf-8")  # whole characters only
            assert cut in (10, 10 + len(tail))


# --------------------------------------------------------------------------- invocation

def test_missing_psutil_exits_3_with_json(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "psutil.py").write_text("raise ImportError(\"No module named 'psutil'\")\n")
    rc, msgs = run_agent("runs", {"runs_dir": str(tmp_path)}, env=agent_env(str(shadow)))
    assert rc == 3
    assert msgs == [msgs[0]] and msgs[0]["t"] == "error"
    assert msgs[0]["kind"] == "missing_module" and msgs[0]["module"] == "psutil"
    assert "point host.python at the server's venv" in msgs[0]["message"]


def test_bad_spec_and_unknown_subcommand_exit_2(tmp_path: Path) -> None:
    rc, msgs = run_agent("runs", b"{not json\n")
    assert rc == 2 and msgs[0]["kind"] == "bad_spec"
    rc, msgs = run_agent("launch", {"run_id": "x", "runs_dir": str(tmp_path), "argv": []})
    assert rc == 2 and msgs[0]["kind"] == "bad_spec"
    rc, msgs = run_agent("explode", {})
    assert rc == 2 and msgs[0]["kind"] == "bad_spec"
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "launch.json").write_text(json.dumps({"run_id": "r"}))
    for health in ({"port": "8000"}, {"port": True}, {"port": 8000, "paths": "/health"},
                   {"port": 8000, "interval": "1"}):
        rc, msgs = run_agent("watch", {"run_dir": str(run_dir), "health": health})
        assert rc == 2 and [m["kind"] for m in msgs] == ["bad_spec"], (health, msgs)


# --------------------------------------------------------------------------- launch

SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


def test_launch_detaches_redacts_and_survives_the_agent(tmp_path: Path, runs) -> None:
    secret = "hf_s3cr3t_VALUE_42"
    run_dir, launched = runs([PY, "-c", SLEEPER, f"--token={secret}"],
                             env={"HF_TOKEN": secret, "PLAIN": "x"}, redact=[secret])
    # run_agent captured stdout+stderr to EOF while the server lives: the monitor holds
    # neither pipe open (its fds, below)
    assert run_dir.stat().st_mode & 0o777 == 0o700
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["argv"][-1] == "--token=«redacted»"
    assert launch["env_names"] == ["HF_TOKEN", "PLAIN"]
    for f in run_dir.iterdir():
        assert secret not in f.read_text(errors="replace"), f
    pid = launched["pid"]
    pidinfo = json.loads((run_dir / "pid").read_text())
    assert pidinfo["pid"] == pid and pidinfo["pgid"] == pid == launched["pgid"]
    wait_for(lambda: "up" in log_text(run_dir), what="server output in server.log")
    assert os.getpgid(pid) == pid  # own process group leader
    assert os.getsid(pid) != os.getsid(0)  # detached from our session
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"{ENV_KEY}={run_dir.name}".encode() in environ
    assert f"HF_TOKEN={secret}".encode() in environ  # the server does get the secret
    monitor = pidinfo["monitor_pid"]
    fds = {fd: os.readlink(f"/proc/{monitor}/fd/{fd}") for fd in (0, 1, 2)}
    assert fds == {0: "/dev/null", 1: str(run_dir / "server.log"), 2: str(run_dir / "server.log")}
    assert all(not os.readlink(f"/proc/{monitor}/fd/{fd}").startswith("pipe:")
               for fd in os.listdir(f"/proc/{monitor}/fd"))


@pytest.mark.parametrize(("script", "code", "sig"), [
    ("import sys; sys.exit(7)", 7, None),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", None, 9),
])
def test_exit_json_is_written_atomically(runs, script, code, sig) -> None:
    run_dir, launched = runs(script)
    exit_path = run_dir / "exit.json"
    wait_for(exit_path.exists, what="exit.json")
    info = json.loads(exit_path.read_text())
    assert (info["pid"], info["code"], info["signal"]) == (launched["pid"], code, sig)
    assert abs(info["time"] - time.time()) < 30
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "exit.json", "launch.json", "pid", "server.log"]  # no temp file left behind


def test_exec_failure_is_an_error_and_exit_127(tmp_path: Path) -> None:
    spec = {"run_id": "nope", "runs_dir": str(tmp_path), "profile_key": "p",
            "argv": [str(tmp_path / "no-such-vllm"), "serve"], "env": {}, "redact": [],
            "cwd": None}
    rc, msgs = run_agent("launch", spec)
    assert rc == 1 and msgs[-1]["kind"] == "exec_failed"
    assert "no-such-vllm" in msgs[-1]["message"]
    info = json.loads((tmp_path / "nope" / "exit.json").read_text())
    assert info["code"] == 127 and "no-such-vllm" in info["error"]
    assert "no-such-vllm" in (tmp_path / "nope" / "server.log").read_text()


def test_a_requeued_jobs_launch_starts_the_server_again_in_the_same_run(tmp_path: Path) -> None:
    """A Slurm job's script runs the agent's launch again when the scheduler requeues the job
    (SLURM_RESTART_COUNT=1): the same run directory, the last allocation's pid and exit kept
    aside, server.log appended to with a line saying so, the new pid file naming its
    allocation; without the restart count a second launch into the run is refused."""
    runs = tmp_path / "runs"
    (runs / "job-1").mkdir(parents=True)
    spec = {"run_id": "job-1", "runs_dir": str(runs), "profile_key": "p", "env": {},
            "redact": [], "cwd": None, "prepared": True, "hold": True,
            "argv": [PY, "-c", "import os; print('server', os.environ['SLURM_RESTART_COUNT'])"]}
    rc, msgs = run_agent("launch", spec, env=agent_env(SLURM_JOB_ID="77",
                                                       SLURM_RESTART_COUNT="0"))
    assert rc == 0 and msgs[-1]["t"] == "launched", msgs
    run_dir = runs / "job-1"
    first = json.loads((run_dir / "pid").read_text())
    assert first["restart"] == 0
    rc, msgs = run_agent("launch", spec, env=agent_env(SLURM_JOB_ID="77"))
    assert rc == 1 and msgs[-1]["kind"] == "run_exists"
    rc, msgs = run_agent("launch", spec, env=agent_env(SLURM_JOB_ID="77",
                                                       SLURM_RESTART_COUNT="1"))
    assert rc == 0 and msgs[-1]["t"] == "launched", msgs
    again = json.loads((run_dir / "pid").read_text())
    assert again["restart"] == 1 and again["pid"] == msgs[-1]["pid"] != first["pid"]
    assert json.loads((run_dir / "pid.0").read_text()) == first
    assert json.loads((run_dir / "exit.0.json").read_text())["pid"] == first["pid"]
    assert json.loads((run_dir / "exit.json").read_text())["pid"] == again["pid"]
    assert (run_dir / "server.log").read_text().splitlines() == [
        "server 0",
        f"specconsole: job 77 requeued (restart 1): the server starts again on "
        f"{os.uname().nodename}",
        "server 1"]
    rc, msgs = run_agent("runs", {"runs_dir": str(runs)})
    assert rc == 0 and msgs[-1]["runs"][0]["restart"] == 1, msgs


def test_two_members_on_one_node_of_a_job_are_each_launched_and_held(tmp_path: Path) -> None:
    """Ray's head and the server share a several-node job's first node: the one agent the job
    script started there launches the first (which says another follows on the node), then
    waits for and launches the second; it ends once both servers have ended, with the worse
    of their ends (the job lasts as long as either server)."""
    runs = tmp_path / "runs"
    job = tmp_path / "job"
    job.mkdir()
    specs = []
    for name, more, code in (("ray-head", True, 0), ("server", False, 3)):
        (runs / name).mkdir(parents=True)
        specs.append({"run_id": name, "runs_dir": str(runs), "profile_key": "p", "env": {},
                      "redact": [], "cwd": None, "prepared": True, "hold": True,
                      "more_on_node": more,
                      "argv": [PY, "-c", f"import sys, time; time.sleep(1.0); sys.exit({code})"]})
    request = job / "launch-gpu-07.json"

    def asked_in_turn() -> None:
        for spec in specs:
            wait_for(lambda: not request.exists(), 10, "the last request taken")
            request.write_text(json.dumps(spec))

    writer = threading.Thread(target=asked_in_turn)
    writer.start()
    started = time.monotonic()
    rc, msgs = run_agent("launch", {"request": str(job / "launch-{node}.json"), "wait_s": 10},
                         env=agent_env(SLURM_JOB_ID="77", SLURMD_NODENAME="gpu-07"))
    writer.join()
    assert sorted(m["run_id"] for m in msgs if m["t"] == "launched") == ["ray-head", "server"]
    assert rc == 1, "the server's end (3) is the worse one"
    for name, code in (("ray-head", 0), ("server", 3)):
        assert json.loads((runs / name / "exit.json").read_text())["code"] == code
    assert time.monotonic() - started >= 1.0, "it waited for both servers"


# --------------------------------------------------------------------------- watch

TREE = r"""
import subprocess, sys, time
PY = sys.executable
# A: parent of the grandchild G, which names itself as vLLM does; A never reaps G
A = ("import subprocess, sys, time; subprocess.Popen(['VLLM::Worker_TP3', '-c', "
     "'import time; time.sleep(60)'], executable=sys.executable); time.sleep(60)")
subprocess.Popen([PY, '-c', A])
# Z exits with 5 and is never reaped: a zombie
Z = subprocess.Popen([PY, '-c', 'import sys, time; time.sleep(0.8); sys.exit(5)'])
print('tree up', flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no-pidfd"])
def test_watch_tree_zombie_and_grandchild_kill_latency(tmp_path: Path, runs, pidfd) -> None:
    run_dir, launched = runs(TREE)
    top = launched["pid"]
    env = None
    if not pidfd:  # an interpreter or kernel without pidfd_open: the polling fallback
        site = tmp_path / "nopidfd"
        site.mkdir()
        (site / "sitecustomize.py").write_text("import os\ndel os.pidfd_open\n")
        env = agent_env(str(site))
    agent = Agent("watch", watch_spec(run_dir), env=env)
    try:
        _, hello = agent.next("hello")
        assert hello["pidfd"] is pidfd and hello["psutil"] and hello["python"]
        _, procs = agent.next("procs", lambda m: any(
            p["name"] == "Worker_TP3" and p["alive"] for p in m["procs"]) and len(m["procs"]) >= 4)
        by_name = {p["name"]: p for p in procs["procs"]}
        grandchild = by_name["Worker_TP3"]
        assert grandchild["ppid"] != top and grandchild["cmd"].startswith("VLLM::Worker_TP3")
        assert {p["pid"] for p in procs["procs"]} >= {top, grandchild["ppid"]}
        # the zombie: dead with its exit code, although its parent never reaps it (on a busy
        # machine it may die before the grandchild shows: its messages are then already read)
        zexit = agent.first("exit", lambda m: m["code"] == 5)
        assert zexit["top"] is False and zexit["signal"] is None
        after = agent.first("procs", lambda m: any(p["pid"] == zexit["pid"] and not p["alive"]
                                                   for p in m["procs"]))
        (zrow,) = [p for p in after["procs"] if p["pid"] == zexit["pid"]]
        assert zrow["alive"] is False and zrow["state"] == "zombie"
        _, later = agent.next("procs")
        assert zexit["pid"] not in {p["pid"] for p in later["procs"]}  # dead ones once only
        # SIGKILL a grandchild: the exit event arrives within 100 ms
        t0 = time.monotonic()
        os.kill(grandchild["pid"], signal.SIGKILL)
        stamp, gexit = agent.next("exit", lambda m: m["pid"] == grandchild["pid"])
        assert stamp - t0 < 0.1, f"exit event after {stamp - t0:.3f}s"
        assert gexit["signal"] == 9 and gexit["name"] == "Worker_TP3"
        assert agent.first("log", lambda m: "tree up" in m["lines"])["off"] == 0
    finally:
        assert agent.close() == 0


SHORT_LIVED = r"""
import subprocess, sys, time
G = ("import subprocess, sys; subprocess.run(['VLLM::Worker_TP5', '-c', "
     "'import sys, time; time.sleep(0.3); sys.exit(3)'], executable=sys.executable)")
# G starts once the watching agent is surely up (it starts after the launch, and a busy
# machine takes its time), then lives 0.3 s: far less than procs_interval
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(2.0); exec(%r)' % G])
for i in range(100):
    print('loading', i, flush=True)
    time.sleep(0.05)
"""


def test_short_lived_grandchild_is_seen_and_its_death_reported(runs) -> None:
    """A worker dying of a broken import lives far less than procs_interval: still reported."""
    run_dir, _ = runs(SHORT_LIVED)
    agent = Agent("watch", watch_spec(run_dir, procs_interval=5.0, log_interval=0.05))
    try:
        _, died = agent.next("exit", lambda m: m["name"] == "Worker_TP5")
        assert died["top"] is False
        assert died["parent"].startswith("python")  # the launcher's child that ran it
        _, middle = agent.next("exit", lambda m: m["pid"] != died["pid"])
        assert "parent" not in middle, middle  # a child of the server's own command: no parent
    finally:
        assert agent.close() == 0


FORKS = r"""
import subprocess, sys, time
W = '''
import os, time
print("worker up", flush=True)
for tail in ("exit", "exec"):
    pid = os.fork()
    if pid == 0:  # seen under the worker's title for a while, as a compiler child can be
        time.sleep(0.6)
        if tail == "exec":
            os.execvp("sh", ["sh", "-c", "exit 0"])
        os._exit(0)
    os.waitpid(pid, 0)  # reaped at once: its end may never be read
print("forks done", flush=True)
time.sleep(60)
'''
subprocess.Popen(["VLLM::Worker_TP1", "-c", W], executable=sys.executable)
time.sleep(60)
"""


def test_a_forked_child_is_marked_as_never_itself(runs) -> None:
    """A child seen only under its parent's title (between a fork and an exec) is reported
    as forked when it ends, so that nobody takes it for the worker itself; the worker lives."""
    run_dir, _ = runs(FORKS)
    agent = Agent("watch", watch_spec(run_dir, procs_interval=0.1, log_interval=0.02))
    try:
        ended = [agent.first("exit"), agent.next("exit")[1]]  # the two children
        agent.first("log", lambda m: "forks done" in m["lines"])
        _, procs = agent.next("procs")
        worker = next(p for p in procs["procs"] if p["name"] == "Worker_TP1" and p["alive"])
        ended = [m for m in agent.seen if m["t"] == "exit"]
        assert ended and worker["pid"] not in {m["pid"] for m in ended}, ended
        forked = [m for m in ended if m["name"] == "Worker_TP1"]
        assert forked and all(m.get("forked") is True for m in forked), ended
        assert all(m["parent"] == "Worker_TP1" for m in ended), ended  # each one's parent
    finally:
        assert agent.close() == 0


CHURN = r"""
import subprocess, time
end = time.time() + 1.5
while time.time() < end:
    subprocess.Popen(['true']).wait()
    subprocess.Popen(['sleep', '0.01'])  # reaped later or never: races with the scans
print('churned', flush=True)
time.sleep(60)
"""


def test_watch_survives_processes_vanishing_under_it(runs) -> None:
    run_dir, _ = runs(CHURN)
    agent = Agent("watch", watch_spec(run_dir, procs_interval=0.01))
    try:
        agent.first("log", lambda m: "churned" in m["lines"], timeout=20)
        agent.next("procs")  # still alive and scanning
        assert any(m["t"] == "exit" for m in agent.seen)
        assert not [m for m in agent.seen if m["t"] == "error"]
    finally:
        assert agent.close() == 0


WRITER = r"""
import sys, time
out = sys.stdout.buffer
for i in range(3000):
    out.write(b'line %d %s\n' % (i, b'x' * (i % 70)))
out.write(b'partial'); out.flush(); time.sleep(0.3)
out.write(b' rest\n')
out.write('é'.encode() * 5_000_000 + b'\n')  # one 10 MB line
out.write(b'last words without newline'); out.flush()
"""


def _collect_log(agent: Agent, until: str) -> list[dict]:
    msgs = []
    while True:
        _, msg = agent.next("log", timeout=20)
        msgs.append(msg)
        if msg["lines"] and msg["lines"][-1] == until:
            return msgs


def test_log_tail_lines_offsets_long_lines_and_resume(runs) -> None:
    run_dir, _ = runs(WRITER)
    agent = Agent("watch", watch_spec(run_dir))
    try:
        msgs = _collect_log(agent, "last words without newline")
    finally:
        agent.close()
    data = (run_dir / "server.log").read_bytes()
    assert msgs[0]["off"] == 0 and msgs[-1]["end"] == len(data)
    for a, b in itertools.pairwise(msgs):
        assert b["off"] == a["end"]  # contiguous: nothing lost, nothing twice
    for m in msgs:
        assert m["end"] - m["off"] <= 1 << 20
        text = data[m["off"]:m["end"]].decode("utf-8", "replace")
        assert "\n".join(m["lines"]) == text.removesuffix("\n")
    lines = [line for m in msgs for line in m["lines"]]
    assert lines[:3000] == [f"line {i} {'x' * (i % 70)}" for i in range(3000)]
    assert lines[3000] == "partial rest"  # held back until its newline
    pieces = lines[3001:-1]
    assert len(pieces) == 10 and "".join(pieces) == "é" * 5_000_000
    assert lines[-1] == "last words without newline"  # flushed once the run exited
    # resume from a line boundary: exactly the rest, nothing twice, nothing lost
    boundary = msgs[len(msgs) // 2]["end"]  # where a dropped console would resume
    offset = 0
    for _ in range(1500):
        offset = data.index(b"\n", offset) + 1
    after_boundary = [line for m in msgs if m["off"] >= boundary for line in m["lines"]]
    for start, expected in ((offset, lines[1500:]), (boundary, after_boundary)):
        again = Agent("watch", watch_spec(run_dir, log_offset=start))
        try:
            resumed = _collect_log(again, "last words without newline")
        finally:
            again.close()
        assert resumed[0]["off"] == start
        assert [line for m in resumed for line in m["lines"]] == expected


def test_watch_without_nvml_says_so_once_and_streams(tmp_path: Path, runs) -> None:
    shadow = tmp_path / "nonvml"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text("raise ImportError('no NVML here')\n")
    run_dir, _ = runs(SLEEPER)
    agent = Agent("watch", watch_spec(run_dir), env=agent_env(str(shadow)))
    try:
        _, hello = agent.next("hello")
        assert hello["nvml"]["ok"] is False and "no NVML here" in hello["nvml"]["error"]
        assert hello["gpu_count"] == 0 and hello["pynvml"] is None
        agent.first("log", lambda m: m["lines"] == ["up"])
        agent.next("procs")
        agent.next("procs")
        assert not [m for m in agent.seen if m["t"] in ("gpus", "error")]
    finally:
        assert agent.close() == 0


def test_watch_reads_secret_env_from_the_top_and_redacts_procs(runs) -> None:
    """A console attached from another shell lacks the secret: the agent finds it in the run's
    environ, sends it in hello's "redact", and hides it in the procs rows' cmd."""
    secret = "hf_abcdefgh1234"
    # the secret is in argv too, and the launch spec's "redact" is empty: only watch can hide it
    run_dir, launched = runs(["sh", "-c", "echo $SECRET_X; sleep 30", secret],
                             env={"SECRET_X": secret}, redact=[])
    assert secret in (run_dir / "launch.json").read_text()
    wait_for(lambda: secret in log_text(run_dir), what="the server's echo")
    agent = Agent("watch", watch_spec(run_dir, secret_env=["SECRET_X", "UNSET_Y"], redact=[]))
    try:
        _, hello = agent.next("hello")
        found = hello["redact"] or agent.next("secrets")[1]["redact"]
        assert found == [secret]
        rows = []
        for _ in range(3):
            rows += agent.next("procs")[1]["procs"]
        assert launched["pid"] in {r["pid"] for r in rows}
        assert all(secret not in r["cmd"] and secret not in r["name"] for r in rows), rows
        assert any(r["cmd"] == "sh -c echo $SECRET_X; sleep 30 «redacted»" for r in rows), rows
    finally:
        assert agent.close() == 0
        rc, msgs = run_agent("kill", {"run_dir": str(run_dir), "grace": 0}, timeout=60)
    assert rc == 0 and msgs[-1]["t"] == "killed" and msgs[-1]["remaining"] == [], msgs


def test_secret_env_comes_in_a_secrets_message_once_the_pid_is_known(tmp_path: Path) -> None:
    """Watch started before the pid file exists (mid-launch): hello's "redact" is empty and the
    values follow in a "secrets" message, before any procs row that could show them."""
    secret = "hf_abcdefgh1234"
    run_dir = tmp_path / "runs" / "late"
    run_dir.mkdir(parents=True)
    (run_dir / "launch.json").write_text(json.dumps({"run_id": "late", "started": time.time()}))
    server = subprocess.Popen(["sh", "-c", "sleep 30; true", secret],
                              env=agent_env(SECRET_X=secret), start_new_session=True)
    agent = Agent("watch", watch_spec(run_dir, secret_env=["SECRET_X"]))
    try:
        _, hello = agent.next("hello")
        assert hello["redact"] == []
        ticks = int(Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        (run_dir / "pid").write_text(json.dumps({
            "pid": server.pid, "pgid": server.pid, "sid": server.pid, "start_ticks": ticks}))
        _, secrets = agent.next("secrets")
        assert secrets["redact"] == [secret]
        _, procs = agent.next("procs", lambda m: any(r["pid"] == server.pid for r in m["procs"]))
        assert [r["cmd"] for r in procs["procs"] if r["pid"] == server.pid] == [
            "sh -c sleep 30; true «redacted»"]
        assert all(secret not in json.dumps(m) for m in agent.seen if m["t"] == "procs")
    finally:
        server.kill()
        server.wait()
        assert agent.close() == 0


def write_gpu_state(state: Path, holders: dict[int, tuple[int, int]]) -> None:
    """Fake NVML state as tui/sim/fakenvml/pynvml.py reads it: 8 devices; holders pid -> (gpu,
    bytes)."""
    state.mkdir(exist_ok=True)
    (state / "devices.json").write_text(json.dumps(
        {"count": 8, "name": "NVIDIA H200 (simulated)", "total": 141 * 2**30}))
    for pid, (gpu, used) in holders.items():
        (state / f"holder-{pid}.json").write_text(
            json.dumps({"pid": pid, "gpu": gpu, "used": used, "util": 40}))


def nvml_env(state: Path, **extra: str) -> dict[str, str]:
    """The agent on the NVML stand-in: the real nvidia-ml-py loading tui/sim/nvml's
    libnvidia-ml.so.1, which reads the simulated GPUs' state."""
    return agent_env(None, LD_LIBRARY_PATH=nvml_dir(), SPECCONSOLE_SIM_GPU_STATE=str(state),
                     **extra)


def test_watch_gpus_with_nvml_appearing_late(tmp_path: Path, runs) -> None:
    state = tmp_path / "gpus"
    run_dir, launched = runs(SLEEPER)
    agent = Agent("watch", watch_spec(run_dir), env=nvml_env(state))
    try:
        _, hello = agent.next("hello")  # no devices.json yet: like a driver not loaded
        assert hello["nvml"]["ok"] is False and "Driver Not Loaded" in hello["nvml"]["error"]
        assert hello["pynvml"] not in (None, "sim") and hello["gpu_count"] == 0
        write_gpu_state(state, {launched["pid"]: (3, 5 * 2**30)})
        _, gpus = agent.next("gpus", timeout=5)  # init is retried every 2 s
        assert [g["index"] for g in gpus["gpus"]] == list(range(8))
        g3 = gpus["gpus"][3]
        assert g3["procs"] == [{"pid": launched["pid"], "mem": 5 * 2**30}]
        assert g3["mem_used"] == 5 * 2**30 and g3["mem_total"] == 141 * 2**30
        assert g3["util"] == 40 and g3["name"] == "NVIDIA H200 (simulated)"
        assert gpus["gpus"][0]["procs"] == [] and gpus["gpus"][0]["mem_used"] == 0
        os.kill(launched["pid"], signal.SIGKILL)  # a dead holder frees its memory
        agent.next("gpus", lambda m: m["gpus"][3]["procs"] == [])
    finally:
        assert agent.close() == 0


FLAKY_NVML = """
__version__ = "flaky"
class NVMLError(Exception):
    pass
class _Mem:
    used, total = 1, 2
def nvmlInit(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i):
    if i == 1:
        raise NVMLError("GPU is lost")
    return "h0"
def nvmlDeviceGetName(h): return b"H200 \\xff"
def nvmlDeviceGetMemoryInfo(h): return _Mem()
def nvmlDeviceGetUtilizationRates(h): raise NVMLError("Not Supported")
def nvmlDeviceGetComputeRunningProcesses(h): return None
# no nvmlDeviceGetGraphicsRunningProcesses: an older or trimmed pynvml
"""


def test_watch_absorbs_nvml_failures_per_device(tmp_path: Path, runs) -> None:
    """A lost device, an unsupported field, a missing function, a bad name: None, not a dead
    agent, and the other devices still reported."""
    shadow = tmp_path / "flaky"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text(FLAKY_NVML)
    run_dir, _ = runs(SLEEPER)
    agent = Agent("watch", watch_spec(run_dir), env=agent_env(str(shadow)))
    try:
        _, hello = agent.next("hello")
        assert hello["nvml"]["ok"] is True and hello["gpu_count"] == 2
        _, gpus = agent.next("gpus")
        assert gpus["gpus"] == [
            {"index": 0, "name": "H200 \ufffd", "mem_used": 1, "mem_total": 2, "util": None,
             "procs": []},
            {"index": 1, "name": None, "mem_used": None, "mem_total": None, "util": None,
             "procs": []}]
        agent.next("gpus")
    finally:
        assert agent.close() == 0


class _Health(BaseHTTPRequestHandler):
    ready = False

    def do_GET(self) -> None:
        code = 200 if self.path == "/v1/models" or type(self).ready else 503
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _health_server(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _health_spec(server: ThreadingHTTPServer, interval: float) -> dict[str, Any]:
    return {"port": server.server_address[1], "paths": ["/health", "/v1/models"],
            "interval": interval}


def test_health_changes_and_stops_after_the_run(runs) -> None:
    handler = type("Handler", (_Health,), {"ready": False})
    server = _health_server(handler)
    run_dir, launched = runs(SLEEPER)
    agent = Agent("watch", watch_spec(run_dir, health=_health_spec(server, 0.1)))
    try:
        _, first = agent.next("health", lambda m: m["path"] == "/health")
        assert (first["ok"], first["status"]) == (False, 503)
        _, models = agent.next("health", lambda m: m["path"] == "/v1/models")
        assert (models["ok"], models["status"]) == (True, 200)
        handler.ready = True
        _, ready = agent.next("health", lambda m: m["path"] == "/health")
        assert (ready["ok"], ready["status"]) == (True, 200)
        assert len(os.listdir(f"/proc/{agent.proc.pid}/task")) == 2  # main loop + health
        os.killpg(launched["pgid"], signal.SIGTERM)
        agent.next("run_exit")
        agent.next("procs", lambda m: not any(p["alive"] for p in m["procs"]))
        wait_for(lambda: len(os.listdir(f"/proc/{agent.proc.pid}/task")) == 1,
                 what="the health thread to end after the run")  # no polling after the run
        agent.next("procs")  # read past whatever the ended thread wrote
        assert sum(m["t"] == "health" for m in agent.seen) == 3
    finally:
        assert agent.close() == 0
        server.shutdown()


class _CountingHealth(BaseHTTPRequestHandler):
    asked: ClassVar[dict[str, int]] = {}
    models_lost_at: ClassVar[list[int]] = []  # the /metrics count at each /v1/models 404
    models_ok = True
    metrics_ok = True

    def do_GET(self) -> None:
        type(self).asked[self.path] = type(self).asked.get(self.path, 0) + 1
        if self.path == "/metrics":
            body = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n" \
                b"other_metric 1.0\n"
            self.send_response(200 if type(self).metrics_ok else 500)
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path == "/v1/models" and not type(self).models_ok:
            type(self).models_lost_at.append(type(self).asked.get("/metrics", 0))
        self.send_response(200 if self.path == "/health" or type(self).models_ok else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_once_healthy_one_request_a_tick_metrics_first(runs) -> None:
    """Until healthy every path each `interval`; then one request a serving tick: /metrics
    (only the asked-for prefixes come back), /health every HEALTH_EVERY ticks, /v1/models every
    CONFIRM_EVERY (a model no longer served is still noticed within them); when /metrics fails,
    /health every tick."""
    from tui.agent.health import CONFIRM_EVERY, HEALTH_EVERY

    handler = type("Handler", (_CountingHealth,), {"asked": {}, "models_lost_at": []})
    server = _health_server(handler)
    run_dir, _ = runs(SLEEPER)
    tick = 0.05  # the agent's floor
    spec = watch_spec(run_dir, health={**_health_spec(server, tick), "serving_interval": tick},
                      metrics={"path": "/metrics", "prefixes": ["vllm:"]})
    agent = Agent("watch", spec)
    try:
        _, scraped = agent.next("metrics")
        assert scraped["text"] == "vllm:num_requests_running 3.0"  # no comment, no other prefix
        before = dict(handler.asked)
        wait_for(lambda: handler.asked["/metrics"] - before["/metrics"] >= 4 * CONFIRM_EVERY,
                 what=f"{4 * CONFIRM_EVERY} scrapes")
        asked = {k: v - before.get(k, 0) for k, v in handler.asked.items()}
        ticks = asked["/metrics"]
        assert ticks // HEALTH_EVERY - 2 <= asked["/health"] <= ticks // HEALTH_EVERY + 2, asked
        assert ticks // CONFIRM_EVERY - 1 <= asked["/v1/models"] <= ticks // CONFIRM_EVERY + 1
        scrapes = handler.asked["/metrics"]
        handler.models_ok = False
        _, lost = agent.next("health", lambda m: m["path"] == "/v1/models")
        assert (lost["ok"], lost["status"]) == (False, 404)
        assert handler.models_lost_at[0] - scrapes <= CONFIRM_EVERY  # within a confirm round
        handler.models_ok, handler.metrics_ok = True, False
        agent.next("health", lambda m: m["path"] == "/v1/models" and m["ok"])
        before = dict(handler.asked)
        wait_for(lambda: handler.asked["/metrics"] - before["/metrics"] >= 30, what="30 ticks")
        failing = {k: v - before.get(k, 0) for k, v in handler.asked.items()}
        assert failing["/health"] >= failing["/metrics"] - 2, failing  # each failed tick
    finally:
        assert agent.close() == 0
        server.shutdown()


def test_the_log_disk_running_low_is_said_once(runs) -> None:
    """statvfs of the run's directory each procs tick: a level change is one `disk` event
    (here the low mark is set above any real disk's free space, then back to zero)."""
    run_dir, _ = runs(SLEEPER)
    agent = Agent("watch", watch_spec(run_dir, disk_low=2**62))
    try:
        _, low = agent.next("disk")
        st = os.statvfs(run_dir)
        assert low["level"] == "low" and low["path"] == str(run_dir)
        assert abs(low["free"] - st.f_bavail * st.f_frsize) < 64 << 20
        agent.next("procs")
        agent.next("procs")
        assert sum(m["t"] == "disk" for m in agent.seen) == 1  # said once, not every tick
    finally:
        assert agent.close() == 0
    agent = Agent("watch", watch_spec(run_dir, disk_low=0))
    try:
        agent.next("procs")
        agent.next("procs")
        assert not [m for m in agent.seen if m["t"] == "disk"]  # room: nothing to say
    finally:
        assert agent.close() == 0


# --------------------------------------------------------------------------- kill

STUBBORN_TREE = r"""
import subprocess, sys, time
PY = sys.executable
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('stubborn', flush=True); time.sleep(60)")
DAEMON = '''
import os, signal, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('daemon', os.getpid(), flush=True)
time.sleep(60)
'''
stubborn = subprocess.Popen([PY, '-c', STUBBORN])
subprocess.Popen([PY, '-c', DAEMON])
print('stubborn pid', stubborn.pid, flush=True)
time.sleep(60)
"""


def test_kill_escalates_and_sweeps_the_run_id(tmp_path: Path, runs) -> None:
    run_dir, launched = runs(STUBBORN_TREE)
    wait_for(lambda: "daemon " in log_text(run_dir) and "stubborn\n" in log_text(run_dir),
             what="the stubborn child and the daemon")
    text = log_text(run_dir)
    stubborn = int(text.split("stubborn pid ")[1].split()[0])
    daemon = int(text.split("daemon ")[1].split()[0])
    assert os.getsid(daemon) != os.getsid(launched["pid"])  # left the session and group
    bystander = subprocess.Popen(["sleep", "30"])
    state = tmp_path / "gpus"
    write_gpu_state(state, {stubborn: (0, 2**30), daemon: (1, 2**30),
                            bystander.pid: (2, 2**30)})
    env = nvml_env(state)
    rc, msgs = run_agent("kill", {"run_dir": str(run_dir), "grace": 0.5}, env=env)
    assert rc == 0, msgs
    steps = {m["step"]: m["pids"] for m in msgs if m["t"] == "kill_step"}
    assert [m["step"] for m in msgs if m["t"] == "kill_step"] == ["TERM", "KILL", "SWEEP"]
    assert {launched["pid"], stubborn} <= set(steps["TERM"])
    assert steps["KILL"] == [stubborn]  # ignored TERM, KILLed after the grace
    assert steps["SWEEP"] == [daemon]  # found only by its SPECCONSOLE_RUN_ID
    killed = msgs[-1]
    assert killed["t"] == "killed" and killed["remaining"] == []
    assert carriers(run_dir.name) == []
    info = json.loads((run_dir / "exit.json").read_text())  # the monitor lived to write it
    assert info["signal"] == signal.SIGTERM
    assert killed["gpu_released"] is True
    assert [(h["pid"], h["run"]) for h in killed["gpu_holders"]] == [(bystander.pid, False)]
    bystander.kill()
    bystander.wait()


KILL_FROM_INSIDE = r"""
import os, subprocess, sys, time
sleeper = subprocess.Popen(['sleep', '60'])
print('sleeper', sleeper.pid, flush=True)
while not os.path.exists('go'):
    time.sleep(0.02)
with open('kill.in', 'rb') as spec, open('kill.out', 'wb') as out:
    rc = subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2], 'kill'], stdin=spec,
                        stdout=out).returncode
print('agent rc', rc, flush=True)
time.sleep(60)
"""


def test_kill_spares_itself_and_its_ancestors_inside_the_run_group(tmp_path: Path, runs) -> None:
    """A kill agent that is itself in the run's process group (started by the server) must not
    TERM the group: that would kill the agent and its parent.  It signals one by one."""
    run_dir, launched = runs([PY, "-c", KILL_FROM_INSIDE, BOOTSTRAP, ARCHIVE.digest])
    wait_for(lambda: "sleeper " in log_text(run_dir), what="the sleeper")
    sleeper = int(log_text(run_dir).split("sleeper ")[1].split()[0])
    (tmp_path / "kill.in").write_bytes(agent_input({"run_dir": str(run_dir), "grace": 0.5}))
    (tmp_path / "go").touch()
    wait_for(lambda: "agent rc " in log_text(run_dir), what="the inside agent's end")
    assert "agent rc 0" in log_text(run_dir)
    msgs = [json.loads(line) for line in (tmp_path / "kill.out").read_bytes().splitlines()]
    steps = {m["step"]: m["pids"] for m in msgs if m["t"] == "kill_step"}
    assert steps["TERM"] == [sleeper]  # not the top (the agent's parent), not the agent
    assert msgs[-1]["t"] == "killed" and msgs[-1]["remaining"] == [launched["pid"]]
    wait_for(lambda: not Path(f"/proc/{sleeper}").exists()
             or Path(f"/proc/{sleeper}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
             what="the sleeper's death")


# --------------------------------------------------------------------------- runs, preflight

def test_runs_lists_newest_first_with_liveness(tmp_path: Path, runs) -> None:
    done_dir, _ = runs("pass", profile_key="a")
    wait_for((done_dir / "exit.json").exists, what="first run's exit")
    time.sleep(0.01)
    live_dir, live = runs(SLEEPER, profile_key="b")
    rc, msgs = run_agent("runs", {"runs_dir": str(tmp_path / "runs"), "profile_key": None})
    assert rc == 0
    listed = msgs[0]["runs"]
    assert [r["run_id"] for r in listed] == [live_dir.name, done_dir.name]
    assert listed[0]["alive"] is True and listed[0]["exit"] is None
    assert listed[0]["pid"] == live["pid"] and listed[0]["profile_key"] == "b"
    assert listed[1]["alive"] is False and listed[1]["exit"]["code"] == 0
    rc, msgs = run_agent("runs", {"runs_dir": str(tmp_path / "runs"), "profile_key": "a"})
    assert [r["run_id"] for r in msgs[0]["runs"]] == [done_dir.name]
    rc, msgs = run_agent("runs", {"runs_dir": str(tmp_path / "none")})
    assert rc == 0 and msgs[0]["runs"] == []


def _fake_engine(site: Path) -> Path:
    """An installed package `fakeengine`: RECORD older than one edited (broken) file."""
    pkg = site / "fakeengine"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "old_broken.py").write_text("def f(:\n")  # broken but not changed
    (pkg / "models" / "kimi.py").write_text("x = 1\n")
    dist = site / "fakeengine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeengine\nVersion: 1.0\n")
    (dist / "RECORD").write_text("fakeengine/__init__.py,,\nfakeengine-1.0.dist-info/RECORD,,\n")
    installed = time.time() - 100
    for path in [*pkg.rglob("*.py"), dist / "RECORD"]:
        os.utime(path, (installed, installed))
    patched = pkg / "models" / "kimi.py"
    patched.write_text("import torch\nfrom .triton import (SparseMatrix\nx = 1\n")
    return patched


def test_preflight_checks(tmp_path: Path) -> None:
    site = tmp_path / "site"
    patched = _fake_engine(site)
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("x = 1\n")
    bad.write_text("a = 1\nb = 2\nif True\n    pass\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    busy = listener.getsockname()[1]
    spec = {"compile_files": [str(good), str(bad)], "engine_package": "fakeengine",
            "check_gpus": False, "port": busy, "paths": [str(tmp_path), str(tmp_path / "nope")],
            "expect_gpus": 8}
    shadow = tmp_path / "nonvml"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text("raise ImportError('no NVML here')\n")
    try:
        rc, msgs = run_agent("preflight", spec,
                             env=agent_env(f"{site}{os.pathsep}{shadow}"))
    finally:
        listener.close()
    assert rc == 0
    checks = msgs[0]["checks"]
    failed = {(c["check"], c["severity"]): c["message"] for c in checks if not c["ok"]}
    ok = [c["check"] for c in checks if c["ok"]]
    assert ok.count("compile") == 1 and ok.count("path") == 1
    assert failed[("compile", "error")].startswith(f"{bad}:3: SyntaxError: ")
    assert failed[("engine_package", "error")].startswith(f"{patched}:2: SyntaxError: ")
    assert "old_broken" not in json.dumps(checks)  # unchanged since install: not compiled
    assert str(busy) in failed[("port_free", "error")]
    assert failed[("path", "error")] == f"{tmp_path / 'nope'} does not exist"
    assert "8 GPUs expected, 0 visible" in failed[("gpu_count", "warning")]


def test_preflight_names_foreign_gpu_holders(tmp_path: Path) -> None:
    holder = subprocess.Popen(["sleep", "30"])
    try:
        state = tmp_path / "gpus"
        write_gpu_state(state, {holder.pid: (5, 3 * 2**30)})
        env = nvml_env(state)
        rc, msgs = run_agent("preflight", {"check_gpus": True, "expect_gpus": 8}, env=env)
    finally:
        holder.kill()
        holder.wait()
    assert rc == 0
    (gpu,) = [c for c in msgs[0]["checks"] if c["check"] == "gpus_free"]
    assert gpu["ok"] is False and gpu["severity"] == "error"
    assert gpu["message"] == f"GPU 5: 3.0 GiB held by pid {holder.pid} (sleep)"
    (count,) = [c for c in msgs[0]["checks"] if c["check"] == "gpu_count"]
    assert count["ok"] is True
