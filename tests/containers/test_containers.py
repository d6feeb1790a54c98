"""The container lane: the simulated engine INSIDE a container of the lane's image, launched,
supervised and killed by specconsole through the real docker daemon or podman (the core
scenarios run under both: the `runtime` fixture); each test asserts what the bare launch
asserts, and the lane measures both side by side."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import async_wait_for, carriers, next_event, sim_profile, until_event, wait_for

from containers.conftest import ROOT, container_profile, containers_of, record_figure
from tui.core.errors import SpecconsoleError
from tui.core.profile import load_profile
from tui.core.state import CauseUpdated, Died, Ready, Stalled, State
from tui.supervise.supervisor import GpusSeen, StacksTaken, Supervisor

DEAD_WORKER = re.compile(r"DEAD: (Worker_TP\d) \(pid (\d+), (\d+) in the container\) died")


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env=dict(os.environ))


def _run_id(stdout: str) -> str:
    return re.search(r"launched run (\S+)", stdout).group(1)


def _seconds_to(stdout: str, marker: str) -> float:
    """The `[   6.3s]` stamp of the first line holding `marker`, less the launch line's."""
    stamps = [(float(m.group(1)), line) for line in stdout.splitlines()
              if (m := re.match(r"\[\s*([\d.]+)s\]", line))]
    launched = next(t for t, line in stamps if "launched run" in line)
    return next(t for t, line in stamps if marker in line) - launched


def _inspect(run_id: str, runtime: str = "docker") -> dict:
    (cid,) = containers_of(run_id, runtime)
    return json.loads(subprocess.run([runtime, "inspect", "-f", "{{json .State}}", cid],
                                     capture_output=True, text=True, check=True).stdout)


def test_ready_then_kill_leaves_no_container_and_no_process(tmp_path: Path, runtime: str,
                                                            remove_containers, cleanup) -> None:
    # entrypoint = "image": the image's own
    profile = container_profile(tmp_path, "ready", runtime=runtime)
    result = _cli("wait", str(profile), "--launch", "--timeout", "60s")
    run_id = _run_id(result.stdout)
    remove_containers.append(run_id)
    cleanup.append(run_id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "READY after" in result.stdout
    phases = [line.split("phase: ", 1)[1].split(" (at")[0] for line in result.stdout.splitlines()
              if "phase: " in line]
    assert phases[:3] == ["launching", "reading config", "loading weights"]
    state = _inspect(run_id, runtime)
    assert state["Running"] and carriers(run_id), "the server must outlive `wait`"
    assert state["Pid"] in carriers(run_id)  # the container's processes are the run's
    status = _cli("status", str(profile))
    assert run_id in status.stdout and "alive" in status.stdout
    started = time.monotonic()
    killed = _cli("kill", str(profile), "--grace", "5")
    record_figure(f"kill (grace 5 s) in the {runtime} container",
                  f"{time.monotonic() - started:.1f} s")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "no process of the run remains" in killed.stdout
    assert containers_of(run_id, runtime) == [] and carriers(run_id) == []

    bare = _cli("wait", str(sim_profile(tmp_path, "ready", name="bare")), "--launch",
                "--timeout", "60s")
    cleanup.append(_run_id(bare.stdout))
    assert bare.returncode == 0, bare.stdout + bare.stderr
    _cli("kill", str(tmp_path / "bare.toml"), "--grace", "5")
    record_figure(f"launch -> READY, {runtime} container / bare (sim, time scale 300)",
                  f"{_seconds_to(result.stdout, 'READY after'):.1f} s / "
                  f"{_seconds_to(bare.stdout, 'READY after'):.1f} s")


def test_story_dead_names_the_worker_with_both_pids(tmp_path: Path, runtime: str,
                                                   remove_containers, cleanup) -> None:
    profile = container_profile(tmp_path, "syntax-error", time_scale=75, entrypoint="command",
                                runtime=runtime)
    result = _cli("wait", str(profile), "--launch", "--timeout", "60s")
    run_id = _run_id(result.stdout)
    remove_containers.append(run_id)
    cleanup.append(run_id)
    assert result.returncode == 3, result.stdout + result.stderr
    dead = DEAD_WORKER.search(result.stdout)
    assert dead is not None and "exit code 1" in result.stdout, result.stdout
    assert int(dead.group(2)) != int(dead.group(3))  # a host pid and a container pid
    cause = next(line for line in result.stdout.splitlines() if "root cause" in line)
    assert "SyntaxError" in cause and "kimi_k25_patched.py, line 15" in cause
    assert "Engine core initialization failed" not in cause
    state = _inspect(run_id, runtime)  # kept, with its exit, until the profile's next launch
    assert not state["Running"] and state["ExitCode"] != 0
    relaunched = _cli("wait", str(profile), "--launch", "--timeout", "60s")
    remove_containers.append(_run_id(relaunched.stdout))
    assert containers_of(run_id, runtime) == [], "the next launch removes the ended container"

    bare = _cli("wait", str(sim_profile(tmp_path, "syntax-error", time_scale=75, name="bare")),
                "--launch", "--timeout", "60s")
    cleanup.append(_run_id(bare.stdout))
    assert bare.returncode == 3
    record_figure(f"launch -> DEAD (the story), {runtime} container / bare",
                  f"{_seconds_to(result.stdout, 'DEAD:'):.1f} s / "
                  f"{_seconds_to(bare.stdout, 'DEAD:'):.1f} s")


def _worker(run_id: str, name: str) -> int:
    for pid in carriers(run_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if argv.startswith(f"VLLM::{name}".encode()):
            return pid
    raise AssertionError(f"no {name} among {carriers(run_id)}")


async def _sigkill_worker(profile: Path) -> tuple[Supervisor, Died, float]:
    """Launch, wait for READY, SIGKILL Worker_TP3 from the host: the Died event and how long
    after the kill it came."""
    sup = Supervisor(load_profile(profile))
    events = sup.subscribe()
    await sup.launch(skip_preflight=True)
    await next_event(events, Ready)
    # NVML names GPU holders by host pid, in a container too: the GPU pane and the process
    # tree name the same processes
    gpus = (await next_event(events, GpusSeen)).gpus.gpus
    holders = {p.pid for gpu in gpus for p in gpu.procs}
    assert holders and holders <= set(carriers(sup.run.run_id)), holders
    pid = _worker(sup.run.run_id, "Worker_TP3")
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    died = await next_event(events, Died)
    return sup, died, time.monotonic() - killed_at


async def test_worker_sigkilled_from_the_host_while_serving_is_dead(
        tmp_path: Path, runtime: str, remove_containers, cleanup) -> None:
    box, died, box_s = await _sigkill_worker(container_profile(tmp_path, "ready",
                                                               runtime=runtime))
    remove_containers.append(box.run.run_id)
    cleanup.append(box.run.run_id)
    try:
        assert box.machine.state is State.DEAD
        assert died.death.process == "Worker_TP3"
        # its parent (the engine core) may reap it before the agent reads its status: then the
        # signal is unknown, but never wrong (as for a bare run: test_supervisor)
        assert (died.death.signal, died.death.code) in ((9, None), (None, None))
        assert died.death.cpid is not None and died.death.cpid != died.death.pid
        assert f"{died.death.cpid} in the container" in died.death.summary()
    finally:
        await box.kill(2.0)
        await box.close()
    assert containers_of(box.run.run_id, runtime) == [] and carriers(box.run.run_id) == []
    bare, bare_died, bare_s = await _sigkill_worker(sim_profile(tmp_path, "ready", name="bare"))
    cleanup.append(bare.run.run_id)
    try:
        assert bare_died.death.process == "Worker_TP3"
        assert (bare_died.death.signal, bare_died.death.code) in ((9, None), (None, None))
    finally:
        await bare.kill(2.0)
        await bare.close()
    record_figure(f"worker SIGKILL -> DEAD event, {runtime} container / bare",
                  f"{box_s * 1000:.1f} ms / {bare_s * 1000:.1f} ms")


async def test_container_memory_limit_is_dead_said_as_oomkilled(
        tmp_path: Path, image: str, remove_containers, cleanup) -> None:
    # docker only: podman 4.3's conmon (2.1.6, cgroup v1 here) leaves State.OOMKilled false
    # when the limit kills a process of the container (exit code 137, nothing else said)
    # 64 MiB, no swap: the simulated engine's processes outgrow it while they start
    profile = container_profile(tmp_path, "ready", name="oom",
                                run_args=("--memory", "64m", "--memory-swap", "64m"))
    sup = Supervisor(load_profile(profile))
    events = sup.subscribe()
    try:
        await sup.launch(skip_preflight=True)
        remove_containers.append(sup.run.run_id)
        cleanup.append(sup.run.run_id)
        died = await next_event(events, Died)
        death = died.death
        while not death.oom_killed:  # said at the death, or when the container's end is read
            death = (await next_event(events, CauseUpdated)).death
        assert "killed by the container's memory limit (OOMKilled)" in death.summary()
        assert _inspect(sup.run.run_id)["OOMKilled"] is True
    finally:
        await sup.kill(2.0)
        await sup.close()
    assert carriers(sup.run.run_id) == []


def test_engine_core_killed_while_serving_is_dead_and_wait_until_dead_says_so(
        tmp_path: Path, image: str, remove_containers, cleanup) -> None:
    """The seed's failure in a container: the engine core dies while serving and vLLM's API
    server exits 0 after it. `wait --until dead` watches past READY and names the engine core
    with both pids; the container, crashed, is kept for the post-mortem, then the next
    launch of the profile removes it."""
    profile = container_profile(tmp_path, "engine-killed")
    result = _cli("wait", str(profile), "--launch", "--until", "dead", timeout=180)
    run_id = _run_id(result.stdout)
    remove_containers.append(run_id)
    cleanup.append(run_id)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    ready = next(i for i, line in enumerate(lines) if "READY after" in line)
    dead = next(i for i, line in enumerate(lines) if "DEAD" in line)
    assert ready < dead, result.stdout
    assert re.search(r"EngineCore_DP0 \(pid \d+, \d+ in the container\)", lines[dead]), lines[dead]
    assert "while serving" in lines[dead]
    # DEAD came while the API server still stood (it exits 0 seconds later); once it has,
    # the crashed container is kept (no --rm) with its exit, nothing of it running
    wait_for(lambda: not _inspect(run_id)["Running"], 60, "the container's end")
    assert containers_of(run_id) and carriers(run_id) == []
    again = _cli("wait", str(profile), "--launch", "--timeout", "60s")
    assert again.returncode == 0, again.stdout + again.stderr
    cleanup.append(_run_id(again.stdout))
    remove_containers.append(_run_id(again.stdout))
    assert containers_of(run_id) == [], "the next launch removes the crashed container"
    assert _cli("kill", str(profile), "--grace", "5").returncode == 0


async def test_a_frozen_worker_in_a_container_is_stalled_and_its_stack_says_where(
        tmp_path: Path, image: str, remove_containers, cleanup) -> None:
    """A hang inside the container: a worker SIGSTOPped from the host is the stall's suspect
    (by its host pid, named as the log names it), and the stacks taken on the stall are read
    by the host's py-spy from the host pids: the simulated engine's own frames."""
    sup = Supervisor(load_profile(container_profile(tmp_path, "hang", stall="3s")))
    events = sup.subscribe()
    try:
        run = await sup.launch(skip_preflight=True)
        remove_containers.append(run.run_id)
        cleanup.append(run.run_id)
        worker = await async_wait_for(
            lambda: next((p for p, n in sup.machine.names().items()
                          if n == "Worker_TP3" and sup.machine.container_pids.get(p)
                          in sup.machine.log_names), None), 60, "Worker_TP3 logging")
        os.kill(worker, signal.SIGSTOP)
        stalled = await until_event(events, lambda e: isinstance(e, Stalled), 60, "STALLED")
        first = stalled.suspects[0]
        assert (first.name, first.pid) == ("Worker_TP3", worker) and "is stopped" in first.words()
        taken = await until_event(events, lambda e: isinstance(e, StacksTaken), 90,
                                  "the stacks taken on the stall")
        frozen = {s.name: s for s in taken.stacks}["Worker_TP3"]
        assert frozen.error is None and frozen.state == "stopped"
        frames = [f for t in frozen.threads for f in t.frames]
        assert any(f.path.endswith("tui/sim/worker.py") for f in frames), frames
        killed = await sup.kill(2.0)  # a stopped process is continued, then goes
        assert killed.remaining == () and containers_of(run.run_id) == []
    finally:
        await sup.close()


def _python_without_pyspy(tmp: Path) -> Path:
    """This venv again under `tmp` (its pyvenv.cfg, its site-packages), with no py-spy beside
    its python: a GPU host whose Python has no py-spy."""
    venv = Path(sys.prefix)
    clone = tmp / "host-venv"
    (clone / "bin").mkdir(parents=True)
    (clone / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (clone / "lib").symlink_to(venv / "lib")
    (clone / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    return clone / "bin" / "python"


async def _stacks_of_a_worker(tmp: Path, container_python: str | None) -> StacksTaken:
    """Launch the simulated engine in a container whose host has no py-spy, wait for a worker
    to log, take the stacks; the run is killed and its container removed."""
    tmp.mkdir()
    profile = container_profile(tmp, "ready", time_scale=30.0)
    text = profile.read_text().replace(f'python = "{sys.executable}"',
                                       f'python = "{_python_without_pyspy(tmp)}"', 1)
    if container_python is not None:
        text = text.replace(f'python = "{os.path.realpath(sys.executable)}"',
                            f'python = "{container_python}"')
    profile.write_text(text)
    sup = Supervisor(load_profile(profile))
    try:
        run = await sup.launch(skip_preflight=True)
        try:
            await async_wait_for(lambda: "Worker_TP3" in sup.machine.names().values(), 60,
                                 "Worker_TP3 running")
            return await sup.stacks()
        finally:
            await sup.kill(2.0)
            assert containers_of(run.run_id) == []
    finally:
        await sup.close()


async def test_stacks_are_taken_inside_the_container_when_the_host_has_no_pyspy(
        tmp_path: Path, image: str, monkeypatch, remove_containers) -> None:
    """No py-spy beside the host's Python nor on the agent's PATH: the image's py-spy (beside
    its Python, as in vllm/vllm-openai's venv) reads each process by its pid in the container,
    and the stacks name them as the host does; with none in the image either, one line says
    where py-spy was looked for and the fix."""
    path = [d for d in os.environ["PATH"].split(os.pathsep)
            if not os.access(os.path.join(d, "py-spy"), os.X_OK)]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    # the image's Python: this lane's venv (mounted read-only with the checkout), beside which
    # its test extra installed py-spy, as vllm/vllm-openai's venv has it beside its python
    image_python = Path(sys.prefix) / "bin" / "python"
    assert os.access(image_python.parent / "py-spy", os.X_OK), "the test extra's py-spy"
    assert Path(sys.prefix).resolve().is_relative_to(ROOT), "the venv is mounted with ROOT"
    taken = await _stacks_of_a_worker(tmp_path / "with", str(image_python))
    by_name = {s.name: s for s in taken.stacks}
    worker = by_name["Worker_TP3"]
    assert worker.error is None, worker.error
    assert any(f.path.endswith("tui/sim/worker.py") for t in worker.threads for f in t.frames)
    saved = Path(taken.path).read_text()
    assert saved.startswith("# stacks by py-spy inside container "), saved[:200]
    assert "the host has none" in saved.splitlines()[0]

    with pytest.raises(SpecconsoleError) as refused:
        await _stacks_of_a_worker(tmp_path / "without", "python3")
    said = str(refused.value)
    assert "py-spy is neither on the host" in said and "nor in container specconsole-" in said
    assert "\n" not in said and "pip install py-spy" in said
