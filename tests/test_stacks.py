"""Hangs diagnosed (issue 16): which process a stall hangs on, from the processes' states and
CPU, and where each is stuck, from py-spy's real stacks of real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from helpers import carriers, sim_profile, until, until_event, wait_for
from test_bad_input import _opener

from tui.agent.stacks import IN_CONTAINER_PTRACE_FIX, Dumper, _why
from tui.console.app import ConsoleApp
from tui.console.screens.stacks import StacksScreen
from tui.core.profile import load_profile
from tui.core.protocol import ProcInfo, Procs
from tui.core.stacks import parse_dump, process_stacks
from tui.core.stall import ProcWatch
from tui.core.state import Stalled, State
from tui.supervise.supervisor import StacksTaken, Supervisor

PYSPY = Path(sys.executable).with_name("py-spy")


def info(pid: int, name: str, state: str, cpu: float | None) -> ProcInfo:
    return ProcInfo(pid, 1, name, name, state, cpu, 1 << 20, 0.0, True)


# -- the suspects, from the processes' samples ------------------------------------------------

def test_a_process_stopped_for_seconds_is_the_suspect_the_others_wait_on() -> None:
    watch = ProcWatch()
    names = {10: "APIServer", 11: "EngineCore_DP0", 12: "Worker_TP0"}
    for at, core in ((100.0, "sleeping"), (101.0, "stopped"), (104.0, "stopped")):
        watch.feed(Procs(at, (info(10, "vllm", "sleeping", 0.0),
                              info(11, "VLLM::EngineCor", core, 0.0),
                              info(12, "VLLM::Worker", "sleeping", 0.0))), at)
    assert watch.held_for(102.0) == {}  # a moment is nothing yet
    words = [s.words() for s in watch.suspects(106.0, names)]
    assert words[0] == ("EngineCore_DP0 (pid 11) is stopped (SIGSTOP, or a debugger holds it) "
                        "for 5s")
    assert words[1] == "the other 2 processes wait on it"
    watch.feed(Procs(107.0, (info(11, "VLLM::EngineCor", "sleeping", 0.0),)), 107.0)
    assert all(s.pid != 11 for s in watch.suspects(108.0, names))


def test_uninterruptible_sleep_spinning_and_all_asleep() -> None:
    watch = ProcWatch()
    watch.feed(Procs(0, (info(1, "a", "disk-sleep", 0.0), info(2, "b", "sleeping", 1.0))), 0.0)
    assert "uninterruptible sleep" in watch.suspects(10.0, {})[0].words()
    spin = ProcWatch()
    spin.feed(Procs(0, (info(1, "w0", "running", 99.5), info(2, "w1", "sleeping", 0.3),
                        info(3, "w2", "sleeping", 0.0))), 0.0)
    assert [s.words() for s in spin.suspects(1.0, {})] == [
        "w0 (pid 1) spins at 100 % CPU while the others sleep"]
    asleep = ProcWatch()
    asleep.feed(Procs(0, tuple(info(i, f"w{i}", "sleeping", 0.0) for i in range(4))), 0.0)
    (only,) = asleep.suspects(1.0, {})
    assert only.pid is None and "all 4 processes sleep at 0 % CPU" in only.words()
    busy = ProcWatch()
    busy.feed(Procs(0, (info(1, "w0", "running", 60.0), info(2, "w1", "running", 55.0))), 0.0)
    assert busy.suspects(1.0, {}) == ()  # working: nothing to say


def test_why_py_spy_failed_says_the_fix() -> None:
    host = Dumper("/usr/bin/py-spy")
    assert _why("Error: Failed to find python version from target process", 5,
                host.ptrace_fix) == "not a Python process"
    refused = _why("Error: Permission denied (os error 13)", 7, host.ptrace_fix)
    assert refused.startswith("the kernel refused to let py-spy read pid 7 (ptrace): ")
    assert "SYS_PTRACE" in refused or "ptrace_scope" in refused
    inside = Dumper("py-spy", {"runtime": "docker", "name": "sc-x"})
    assert _why("Error: Operation not permitted (os error 1)", 7, inside.ptrace_fix).endswith(
        IN_CONTAINER_PTRACE_FIX)


def test_a_dump_inside_a_container_asks_by_the_pid_the_container_knows() -> None:
    """This process is in the host's pid namespace: no pid inside a container to ask by."""
    inside = Dumper("/opt/venv/bin/py-spy", {"runtime": "podman", "name": "sc-x"})
    assert inside.argv(os.getpid()) is None
    assert "inside container sc-x" in inside.where
    assert Dumper("/usr/bin/py-spy").argv(42) == [
        "/usr/bin/py-spy", "dump", "--full-filenames", "--pid", "42"]


# -- py-spy's real output ------------------------------------------------------------------------

STUCK = """
import time
def wait_for_peer():
    print("waiting", flush=True)
    while True:
        time.sleep(0.05)
def run_engine_core():
    wait_for_peer()
run_engine_core()
"""


def test_a_real_py_spy_dump_reads_as_frames_with_the_engines_marked(tmp_path: Path) -> None:
    engine = tmp_path / "site-packages" / "vllm" / "v1" / "engine"
    engine.mkdir(parents=True)
    script = engine / "core.py"
    script.write_text(textwrap.dedent(STUCK))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
        status = psutil.Process(proc.pid).status
        wait_for(lambda: status() == psutil.STATUS_SLEEPING, what="the script in time.sleep")
        os.kill(proc.pid, signal.SIGSTOP)  # a stopped process is read without pausing it
        wait_for(lambda: status() == psutil.STATUS_STOPPED, what="the script stopped")
        done = subprocess.run([str(PYSPY), "dump", "--full-filenames", "--pid", str(proc.pid),
                               "--nonblocking"],
                              capture_output=True, text=True, timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert done.returncode == 0, done.stderr
    threads = parse_dump(done.stdout)
    assert threads and threads[0].header.startswith("Thread ")
    functions = [f.function for f in threads[0].frames]
    assert functions[:3] == ["wait_for_peer", "run_engine_core", "<module>"]
    stacks = process_stacks(proc.pid, "EngineCore_DP0", "stopped", done.stdout, None)
    frame = stacks.stuck_in()
    assert frame is not None and frame.engine and frame.function == "wait_for_peer"
    assert stacks.summary() == (f"EngineCore_DP0 (pid {proc.pid}, stopped): in wait_for_peer "
                                "(vllm/v1/engine/core.py:6)")


# -- the whole way: a frozen worker of the simulated engine, locally and over SSH -------------

def _worker(sup: Supervisor, name: str) -> int | None:
    """The pid of the process `name` once it has logged (its own code runs: frozen during the
    interpreter's start-up, its stack would rightly say site.py)."""
    return next((pid for pid, n in sup.machine.log_names.items() if n == name), None)


@pytest.mark.parametrize("over", ["local", "ssh"])
async def test_a_frozen_worker_is_the_stalls_suspect_and_its_stack_says_where(
        tmp_path: Path, ssh_server, cleanup: list[str], over: str) -> None:
    target = ssh_server.alias if over == "ssh" else "local"
    profile = load_profile(sim_profile(tmp_path, "hang", target=target, time_scale=300,
                                       stall="3s"))
    sup = Supervisor(profile, opener=_opener(ssh_server if over == "ssh" else None))
    events = sup.subscribe()
    try:
        run = await sup.start(launch=True)
        cleanup.append(run.run_id)
        deadline = time.monotonic() + 30
        while (worker := _worker(sup, "Worker_TP3")) is None:
            assert time.monotonic() < deadline, "no Worker_TP3 in the process tree"
            await asyncio.sleep(0.1)
        os.kill(worker, signal.SIGSTOP)
        stalled = await until_event(events, lambda e: isinstance(e, Stalled), 40, "STALLED")
        assert stalled.suspects, stalled
        first = stalled.suspects[0]
        assert (first.name, first.pid) == ("Worker_TP3", worker)
        assert "is stopped" in first.words()
        taken = await until_event(events, lambda e: isinstance(e, StacksTaken), 60,
                                  "the stacks taken on the stall")
        assert taken.why == "on stall" and taken.path.endswith(".txt")
        by_name = {s.name: s for s in taken.stacks}
        frozen = by_name["Worker_TP3"]
        assert frozen.error is None and frozen.state == "stopped"
        where = frozen.stuck_in()
        assert where is not None and where.engine and "tui/sim/" in where.path
        frames = [f for t in frozen.threads for f in t.frames]
        assert any(f.path.endswith("tui/sim/worker.py") for f in frames), frames  # its own code
        assert by_name["EngineCore_DP0"].error is None  # every Python process of the run
        assert Path(taken.path).read_text().count("=== ") == len(taken.stacks)
        killed = await sup.kill(1.0)  # a stopped process is continued, then goes
        assert killed.remaining == ()
        assert carriers(run.run_id) == []
    finally:
        await sup.close()


async def test_key_d_shows_the_stacks_pane_with_the_workers_frames(
        tmp_path: Path, cleanup: list[str]) -> None:
    profile = load_profile(sim_profile(tmp_path, "hang", time_scale=300, stall="5m"))
    sup = Supervisor(profile)
    app = ConsoleApp(sup, kill_grace=1.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: sup.run is not None, what="launch")
        cleanup.append(sup.run.run_id)
        await until(pilot, lambda: _worker(sup, "Worker_TP0") is not None
                    and sup.machine.state is State.LOADING, 30, "the workers loading")
        await pilot.pause(1.0)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen)
                    and bool(app.screen.query("#stacks-body")), 60, "the stacks pane")
        text = str(app.screen.query_one("#stacks-body").render())
        assert "Worker_TP0 (pid" in text and "EngineCore_DP0 (pid" in text
        assert "tui/sim/" in text and "▶ " in text
        await pilot.press("escape")
        await pilot.press("k")
        await pilot.press("y")
        await until(pilot, lambda: sup.machine.state is State.STOPPED, 30, "stopped")


def test_wait_exits_5_naming_the_frozen_process_and_where_the_stacks_are(
        tmp_path: Path, cleanup: list[str]) -> None:
    path = sim_profile(tmp_path, "hang", time_scale=300, stall="3s")
    waiting = subprocess.Popen([sys.executable, "-m", "tui", "wait", str(path), "--launch",
                                "--timeout", "90s"], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 30
        worker = None
        while worker is None and time.monotonic() < deadline:
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
                try:
                    title = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if title.startswith(b"VLLM::Worker_TP2") and str(tmp_path).encode() in \
                        Path(f"/proc/{pid}/environ").read_bytes():
                    worker = pid
            time.sleep(0.1)
        assert worker is not None, "the simulated Worker_TP2 never appeared"
        os.kill(worker, signal.SIGSTOP)
        out, _ = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    run_id = next(w for line in out.splitlines() for w in line.split()
                  if w.startswith("hang-"))
    cleanup.append(run_id)
    assert waiting.returncode == 5, out
    assert f"suspect: Worker_TP2 (pid {worker}) is stopped" in out, out
    assert "stacks of" in out and "saved on the host:" in out, out
    assert f"Worker_TP2 (pid {worker}, stopped): in " in out, out
