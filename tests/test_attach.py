"""`specconsole attach --pid`: a simulated server started by hand (outside specconsole, its
output to a file) is followed to READY, a worker's death is DEAD with its cause, and a kill
is refused without --yes (it is someone else's server)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_port, next_event, wait_for

from tui.agent import attach as agent_attach
from tui.cli.status import run_state
from tui.core.attach import attach_profile, attached_words
from tui.core.profile import AttachTarget
from tui.core.protocol import PROTOCOL_VERSION, AttachedFacts, RunExit, decode
from tui.core.state import CauseUpdated, Died, Ready, State
from tui.supervise.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def by_hand(tmp_path: Path, request: pytest.FixtureRequest,
            ) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """The simulated vLLM at TP 4 started as a user would, in its own session, its stdout and
    stderr to a file; killed whatever the test did."""
    port = free_port()
    log = tmp_path / "vllm.log"
    scenario = getattr(request, "param", "ready")
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "tui.sim.engine", "serve", "/models/Kimi-K2.5", "--port",
             str(port), "--tensor-parallel-size", "4", "--sim-scenario", scenario,
             "--sim-time-scale", "300", "--sim-gpus", "4", "--sim-gpu-state",
             str(tmp_path / "gpus")],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        yield server, port, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _worker(top: int, name: str) -> int:
    """The pid of the process of `top`'s session whose title is VLLM::<name>."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            sid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        if sid == top and argv.startswith(f"VLLM::{name}".encode()):
            return int(entry)
    return 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


async def test_attach_pid_ready_kill_refused_then_a_dead_worker_is_dead(
        tmp_path: Path, by_hand: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    server, port, log = by_hand
    profile = attach_profile(AttachTarget(pid=server.pid), port=port,
                             runs_dir=str(tmp_path / "runs"), python=sys.executable)
    sup = Supervisor(profile)
    events = sup.subscribe()
    try:
        run = await sup.start(launch=False)
        assert run.pid == server.pid and run.owner is not None
        assert f"pid {server.pid}" in run.owner and "not launched by specconsole" in run.owner
        record = json.loads((Path(run.run_dir) / "launch.json").read_text())
        assert record["attached"]["kind"] == "pid" and record["attached"]["log"] == str(log)
        await next_event(events, Ready)
        refused = _cli("kill", "--pid", str(server.pid), "--runs-dir", str(tmp_path / "runs"),
                       "--python", sys.executable)
        assert refused.returncode == 2 and refused.stdout == ""
        (line,) = refused.stderr.splitlines()
        assert "not launched by specconsole" in line and "--yes" in line
        assert server.poll() is None, "refused: nothing signalled"
        worker = wait_for(lambda: _worker(server.pid, "Worker_TP2"), what="Worker_TP2")
        os.kill(worker, signal.SIGKILL)
        died = await next_event(events, Died)
        assert sup.machine.state is State.DEAD
        # its parent (the engine core) may reap it before its zombie's status is read: then
        # the signal is unknown (the same as for a launched run's worker)
        assert died.death.process == "Worker_TP2" and died.death.signal in (9, None)
        assert died.death.pid == worker
        assert died.death.summary().startswith(f"Worker_TP2 (pid {worker}) died")
    finally:
        await sup.close()


@pytest.mark.parametrize("by_hand", ["oom"], indirect=True)
async def test_attach_pid_a_worker_dead_of_oom_is_dead_with_the_root_cause_from_its_log(
        tmp_path: Path, by_hand: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    server, port, _ = by_hand
    sup = Supervisor(attach_profile(AttachTarget(pid=server.pid), port=port,
                                    runs_dir=str(tmp_path / "runs"), python=sys.executable))
    events = sup.subscribe()
    try:
        await sup.start(launch=False)
        died = await next_event(events, Died)
        death = died.death
        while death.cause is None or "OutOfMemoryError" not in death.cause.line:
            death = (await next_event(events, CauseUpdated)).death
        assert death.process.startswith("Worker_TP") and death.pid != server.pid
    finally:
        await sup.close()


def test_kill_of_an_attached_pid_with_yes_kills_it_and_a_reattach_reuses_the_record(
        tmp_path: Path, by_hand: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    server, port, _ = by_hand
    runs = str(tmp_path / "runs")
    wait_for(lambda: _worker(server.pid, "Worker_TP0"), what="the workers")
    first = _cli("attach", "--pid", str(server.pid), "--port", str(port), "--runs-dir", runs,
                 "--python", sys.executable, "--wait", "--timeout", "60s")
    assert first.returncode == 0, first.stdout + first.stderr
    again = _cli("attach", "--pid", str(server.pid), "--port", str(port), "--runs-dir", runs,
                 "--python", sys.executable, "--wait", "--timeout", "60s")
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(os.listdir(runs)) == 1, "a re-attach goes on with the live record"
    killed = _cli("kill", "--pid", str(server.pid), "--runs-dir", runs, "--python",
                  sys.executable, "--grace", "5", "--yes")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "no process of the run remains" in killed.stdout
    assert server.wait(timeout=30) is not None
    (run_dir,) = Path(runs).iterdir()
    wait_for(lambda: (run_dir / "exit.json").exists(), what="the helper's exit.json")


@pytest.mark.parametrize(("facts", "words"), [
    ({"kind": "container", "name": "vllm-a", "image": "vllm/vllm-openai",
      "compose": "infer", "started": 1000.0, "user": "alice"},
     "container vllm-a (image vllm/vllm-openai, compose project infer), started 2h04m ago, "
     "runs as user alice — not launched by specconsole"),
    ({"kind": "pid", "pid": 4312, "cmd": "vllm serve m", "started": 8460.0, "user": None},
     "pid 4312 (vllm serve m), started 30.0s ago — not launched by specconsole"),
])
def test_attached_words_say_whose_it_is(facts: dict, words: str) -> None:
    assert attached_words(AttachedFacts.from_wire(facts), now=8490.0) == words


def _agent_facts(kind: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The facts the agent's attach records in launch.json for this very process, as it
    writes them (a container's from a `docker inspect` answer, the runtime's CLI stubbed)."""
    if kind == "pid":
        facts = agent_attach._pid_facts(os.getpid())
    else:
        inspect = [{"Id": "c0ffee", "Name": "/vllm-a",
                    "State": {"Running": True, "Pid": os.getpid(),
                              "StartedAt": "2026-12-07T10:00:00Z"},
                    "Config": {"Image": "vllm/vllm-openai",
                               "Labels": {"com.docker.compose.project": "infer"}}}]
        monkeypatch.setattr(agent_attach.container, "cli", lambda *argv: subprocess.
                            CompletedProcess(argv, 0, json.dumps(inspect), ""))
        facts = agent_attach._container_facts("docker", "vllm-a")
    return {**facts, "log": None}  # what _record adds before writing launch.json


@pytest.mark.parametrize("kind", ["pid", "container"])
def test_the_attached_facts_travel_typed_and_whole(kind: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    facts = _agent_facts(kind, monkeypatch)
    line = json.dumps({"v": PROTOCOL_VERSION, "t": "runs", "runs": [{
        "run_id": "r1", "profile_key": "p@local", "run_dir": "/runs/r1", "started": 1.0,
        "pid": facts["pid"], "alive": False, "served": None, "attached": facts,
        "exit": {"pid": facts["pid"], "code": None, "signal": 9, "time": 5.0,
                 "attached": True}}]})
    (record,) = decode(line).runs
    assert isinstance(record.attached, AttachedFacts) and record.attached.kind == kind
    assert record.attached.to_wire() == facts, "every fact the agent writes is kept"
    assert record.exit == RunExit(facts["pid"], None, 9, 5.0)
    assert run_state(record.alive, record.exit) == "exited (signal 9)"


def test_odd_attached_facts_are_read_leniently() -> None:
    facts = AttachedFacts.from_wire({"kind": "pid", "pid": "12", "started": True, "user": 7})
    assert (facts.pid, facts.started, facts.user, facts.cmd) == (None, None, None, "")
    assert attached_words(facts, now=10.0) == "pid None — not launched by specconsole"


def test_attach_target_is_a_container_or_a_pid() -> None:
    with pytest.raises(ValueError):
        AttachTarget()
    with pytest.raises(ValueError):
        AttachTarget(container="a", pid=12)
    assert AttachTarget(container="my box/1").label == "attached-my_box_1"
