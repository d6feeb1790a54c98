"""The Slurm lane: the simulated engine launched as a job of a real Slurm cluster (munged,
slurmctld, one slurmd per node in its own network namespace: slurmlab.py), from the login node
(this machine, [host] local); the agent reaches the job's node as a step of the job (srun
--jobid J --overlap). Each test submits through the Supervisor as the console does, and checks
what the scheduler itself says (scontrol, squeue) beside what specconsole says."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    async_wait_for,
    carriers,
    free_port,
    next_event,
    sim_profile,
    sim_server,
    until_event,
)

from slurm.conftest import record_figure
from slurm.slurmlab import Cluster
from tui.cli.follow import SeveralHosts
from tui.core.describe import death_lines, describe
from tui.core.errors import PreflightFailed
from tui.core.phases import Phase
from tui.core.profile import load_profile
from tui.core.slurm import expand_nodes, scheduler_end
from tui.core.state import Died, LinesAdded, PhaseChanged, Ready, Stalled, State
from tui.core.status import status_line, timeline_rows, view_of
from tui.remote import launcher
from tui.remote import slurm as remote_slurm
from tui.remote.session import LocalSession
from tui.supervise.events import (
    GpusSeen,
    JobAllocated,
    JobEnded,
    JobEnding,
    JobQueued,
    JobSubmitted,
)
from tui.supervise.group import ClusterRun, MemberEvent, RunDied, StepFailed
from tui.supervise.history import History
from tui.supervise.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[2]


def slurm_profile(tmp: Path, scenario: str = "ready", *, name: str = "job",
                  time_limit: str = "5", time_scale: float = 300.0, extra: str = "") -> Path:
    """A simulated profile launched through Slurm: [host] is this machine (the login node)."""
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[host]
target = "local"
python = "{sys.executable}"
runs_dir = "{tmp / 'runs'}"
{sim_server(tmp, scenario, time_scale)}
[slurm]
partition = "batch"
time = "{time_limit}"
job_name = "{name}"
{extra}
""")
    return path


def scontrol(job_id: str, cluster: Cluster) -> dict[str, str]:
    from tui.core.slurm import parse_fields
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=cluster.env,
                         capture_output=True, text=True, check=True).stdout
    return parse_fields(out)


def _worker(run_id: str, name: str) -> int:
    for pid in carriers(run_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if argv.startswith(f"VLLM::{name}".encode()):
            return pid
    raise AssertionError(f"no {name} among {carriers(run_id)}")


async def _event(events: asyncio.Queue[Any], kind: type, launching: asyncio.Task[Any],
                 timeout: float) -> Any:
    """The next event of `kind`; the launch's own error first if it failed meanwhile."""
    waiting = asyncio.ensure_future(next_event(events, kind, timeout))
    await asyncio.wait({waiting, launching}, return_when=asyncio.FIRST_COMPLETED)
    if launching.done() and launching.exception() is not None and not waiting.done():
        waiting.cancel()
        raise launching.exception()
    return await waiting


async def _launch(sup: Supervisor, jobs: list[str]) -> tuple[asyncio.Queue[Any],
                                                            asyncio.Task[Any], float]:
    """Submit; the events, the launch under way, and when it was submitted."""
    events = sup.subscribe()
    started = time.monotonic()
    launching = asyncio.ensure_future(sup.launch())
    submitted = await _event(events, JobSubmitted, launching, 30)
    jobs.append(submitted.job_id)
    return events, launching, started


async def _ready(sup: Supervisor, jobs: list[str]) -> tuple[float, float]:
    """Launch and wait for READY: (submit -> running, running -> READY) in seconds."""
    events, launching, started = await _launch(sup, jobs)
    await _event(events, JobAllocated, launching, 60)
    allocated = time.monotonic()
    await _event(events, Ready, launching, 90)
    await launching
    return allocated - started, time.monotonic() - allocated


async def test_ready_inside_a_job_then_worker_sigkilled_is_dead_naming_it(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    sup = Supervisor(load_profile(slurm_profile(tmp_path)))
    events = sup.subscribe()
    try:
        to_running, to_ready = await _ready(sup, jobs)
        job_id = jobs[0]
        fields = scontrol(job_id, cluster)
        assert fields["JobState"] == "RUNNING"
        node = fields["NodeList"]
        assert sup.job is not None and sup.job.node == node
        run_dir = Path(sup.run.run_dir)
        script = (run_dir / "job.sbatch").read_text()
        assert "#SBATCH --partition=batch" in script and "#SBATCH --time=5" in script
        assert f"SPECCONSOLE_RUN_ID={sup.run.run_id}" in script
        # the server runs on the job's node: its network namespace, its hostname
        top = sup.run.pid
        assert Path(f"/proc/{top}/ns/net").resolve() != Path("/proc/self/ns/net").resolve()
        assert os.readlink(f"/proc/{top}/ns/net") == os.readlink(
            f"/proc/{cluster.slurmd_pid(node)}/ns/net")
        record_figure("submit -> running (s)", round(to_running, 2))
        record_figure("running -> READY (s)", round(to_ready, 2))
        victim = _worker(sup.run.run_id, "Worker_TP3")
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        died = await next_event(events, Died, 30)
        in_job_ms = (time.monotonic() - killed_at) * 1000
        assert sup.machine.state is State.DEAD
        assert died.death.process == "Worker_TP3"
        assert died.death.ended_by is None, "a worker's own death is not the scheduler's"
        assert "Worker_TP3" in died.death.summary() and "scheduler" not in died.death.summary()
    finally:
        if sup.run is not None:
            await sup.kill(2.0)
        await sup.close()
    assert carriers(sup.run.run_id) == []
    assert scontrol(jobs[0], cluster)["JobState"] in ("CANCELLED", "COMPLETED", "FAILED")
    bare_ms = await _bare_worker_death_ms(tmp_path)
    record_figure("worker SIGKILL -> DEAD, in a job / bare (ms)",
                  f"{in_job_ms:.1f} / {bare_ms:.1f}")


async def _bare_worker_death_ms(tmp: Path) -> float:
    """The same death in a bare launch on this machine, for the figure beside the job's."""
    bare = Supervisor(load_profile(sim_profile(tmp, "ready", name="bare")))
    events = bare.subscribe()
    try:
        await bare.launch(skip_preflight=True)
        await next_event(events, Ready, 90)
        os.kill(_worker(bare.run.run_id, "Worker_TP3"), signal.SIGKILL)
        killed_at = time.monotonic()
        died = await next_event(events, Died, 30)
        assert died.death.process == "Worker_TP3"
        return (time.monotonic() - killed_at) * 1000
    finally:
        if bare.run is not None:
            await bare.kill(2.0)
        await bare.close()


async def test_time_limit_ends_the_job_as_timeout_in_words_never_a_crash(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """A one-minute job: the alert before its end, then the scheduler's TIMEOUT is the
    verdict (the server's SIGTERM from the scheduler is its doing, not a crash)."""
    hooked = tmp_path / "ending.log"
    profile = slurm_profile(tmp_path, time_limit="1", extra=f"""alert_before = "50s"
[alerts]
on_ending = 'echo "$SPECCONSOLE_EVENT $SPECCONSOLE_JOB_ID $SPECCONSOLE_CAUSE" >> {hooked}'
""")
    history = History(tmp_path / "history.sqlite3")
    sup = Supervisor(load_profile(profile), history=history)
    events = sup.subscribe()
    seen: list[Any] = []
    try:
        await _ready(sup, jobs)
        assert sup.job is not None and sup.job.clock is not None
        header = status_line(view_of(sup.machine, job=sup.job.clock), time.time())
        assert re.search(rf"READY · serving · took \S+ · job {jobs[0]} on node-\d · "
                         r"\d+ s of 1 min left$", header), header
        ending = await until_event(events, lambda e: isinstance(e, JobEnding), 60,
                                   "the time-left alert", seen)
        assert 0 < ending.left_s <= 50
        await async_wait_for(hooked.exists, 10, "the on_ending hook")
        assert hooked.read_text().startswith(
            f"ending {jobs[0]} job {jobs[0]} has "), hooked.read_text()
        assert "left before its time limit ends it" in hooked.read_text()
        died = await until_event(events, lambda e: isinstance(e, Died), 90, "the death", seen)
        dead_at = time.time()
        assert died.death.ended_by is not None, died.death
        assert died.death.ended_by.startswith("TIMEOUT: the job's 1 min time limit ended it")
        assert "after READY" in died.death.ended_by
        lines = death_lines(died.death)
        assert "was ended by the scheduler" in lines[0] and "signal" not in lines[0]
        assert lines[1].startswith("root cause: TIMEOUT") and "not a crash" in lines[1]
        ended = await until_event(events, lambda e: isinstance(e, JobEnded), 60, "the end",
                                  seen)
        assert ended.end.state == "TIMEOUT"
        fields = scontrol(jobs[0], cluster)
        assert (fields["JobState"], fields["Reason"]) == ("TIMEOUT", "TimeLimit")
        recorded = history.get(sup.run.run_id)
        assert recorded is not None and recorded.outcome == "dead"
        assert (recorded.job_id, recorded.nodes) == (jobs[0], (fields["NodeList"],))
        assert recorded.queued is not None and 0 <= recorded.queued < 30
        assert (recorded.job_end or "").startswith("TIMEOUT: the job's 1 min time limit ended "
                                                   "it"), recorded
        output = next(Path(sup.run.run_dir).glob("slurm-*.out")).read_text()
        assert "DUE TO TIME LIMIT" in output
        end_time = datetime.fromisoformat(fields["EndTime"]).timestamp()
        record_figure("time limit -> DEAD told as TIMEOUT (s)", round(dead_at - end_time, 2))
        assert not any(isinstance(e, Stalled) for e in seen)
    finally:
        await sup.close()
    await _gone(sup.run.run_id)


async def test_scancel_from_outside_is_cancelled(tmp_path: Path, cluster: Cluster,
                                                 jobs: list[str]) -> None:
    sup = Supervisor(load_profile(slurm_profile(tmp_path)))
    events = sup.subscribe()
    try:
        await _ready(sup, jobs)
        subprocess.run(["scancel", jobs[0]], env=cluster.env, check=True)
        died = await next_event(events, Died, 30)
        assert died.death.ended_by is not None, died.death
        # who: sacct's `CANCELLED by UID`; the lane keeps no accounting (no slurmdbd), and
        # scontrol never says who, so the words say that much
        assert re.fullmatch(rf"CANCELLED: job {jobs[0]} was cancelled \(scancel\), "
                            r"(\d+ min )?\d+ s after READY; this cluster keeps no accounting "
                            "to say by whom", died.death.ended_by), died.death
        ended = await next_event(events, JobEnded, 30)
        assert (ended.end.state, ended.end.accounting, ended.end.cancelled_by) == (
            "CANCELLED", False, None)
        assert scontrol(jobs[0], cluster)["JobState"] == "CANCELLED"
    finally:
        await sup.close()
    await _gone(sup.run.run_id)


async def test_a_job_over_its_memory_ends_out_of_memory_in_words(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """The lane's nodes enforce a job's memory with cgroups (task/cgroup, CR_CPU_Memory): a job
    whose process takes 400 MB under --mem=100M is killed by the kernel at the limit, and the
    scheduler's record, read as the supervisor reads it, says OUT_OF_MEMORY with the limit in
    words. (By hand, not the simulated server: the kernel kills the largest process of the
    job, and where that is the job script's own agent, the server it started outlives the job
    under proctrack/linuxproc.)"""
    job_id = subprocess.run(
        ["sbatch", "--parsable", "--mem=100M", "--time=1", f"--output={tmp_path}/oom-%j.out",
         "--wrap", f"{sys.executable} -c 'b = bytearray(400 << 20)'"],
        env=cluster.env, capture_output=True, text=True, check=True).stdout.strip()
    jobs.append(job_id)
    login = LocalSession()

    async def ended() -> Any:
        job = await remote_slurm.show_job(login, job_id)
        return job if job is not None and job.ended else None

    job = None
    deadline = time.monotonic() + 30
    while job is None and time.monotonic() < deadline:
        job = await ended()
        await asyncio.sleep(0.5)
    assert job is not None, scontrol(job_id, cluster)
    end = scheduler_end(job)
    assert end is not None and (end.state, end.memory) == ("OUT_OF_MEMORY", "100M")
    assert end.words() == (f"OUT_OF_MEMORY: the job's memory limit (100M) was reached on "
                           f"{job.node}: the kernel's cgroup OOM killer ended its processes")
    output = Path(tmp_path / f"oom-{job_id}.out").read_text()
    assert f"Detected 1 oom-kill event(s) in StepId={job_id}.batch" in output, output


async def test_second_job_waits_queued_for_resources_then_ready(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """Every node held by another job: the launch is "queued (Resources)" with the scheduler's
    words, never a stall and never part of the load's time; READY once the nodes free up."""
    blocker = subprocess.run(
        ["sbatch", "--parsable", f"--nodes={len(cluster.nodes)}", "--exclusive",
         "--time=5", f"--output={tmp_path}/blocker-%j.out", "--wrap", "sleep 300"],
        env=cluster.env, capture_output=True, text=True, check=True).stdout.strip()
    jobs.append(blocker)
    sup = Supervisor(load_profile(slurm_profile(tmp_path)))
    seen: list[Any] = []
    try:
        events, launching, started = await _launch(sup, jobs)
        queued = await until_event(
            events, lambda e: isinstance(e, JobQueued) and e.queued.reason == "Resources", 30,
            "queued (Resources)", seen)
        assert "queued (Resources: waiting for nodes to free up)" in queued.words()
        phase = await until_event(
            events, lambda e: isinstance(e, PhaseChanged) and e.phase is Phase.QUEUED
            and "Resources" in (e.detail or ""), 30, "the queued phase", seen)
        assert describe(phase)[0].startswith(
            f"phase: queued (job {jobs[-1]} · Resources: waiting for nodes to free up")
        await asyncio.sleep(3)  # queued a while: longer than nothing, never a stall
        view = view_of(sup.machine)
        assert view.queued and view.eta(time.time()) is None
        assert status_line(view, time.time()).startswith(f"job {jobs[-1]} · Resources")
        subprocess.run(["scancel", blocker], env=cluster.env, check=True)
        allocated = await _event(events, JobAllocated, launching, 60)
        assert allocated.waited_s >= 3
        await _event(events, Ready, launching, 90)
        await launching
        assert sup.machine.launched_at is not None
        assert sup.machine.launched_at >= time.time() - (time.monotonic() - started) + 3, \
            "the queue's wait is not part of the launch's time"
        assert not any(isinstance(e, Stalled) for e in seen)
        queue = timeline_rows(view_of(sup.machine), time.time())[0]
        assert queue.label == "queued" and queue.start_s < -3 and queue.duration_s >= 3
        assert re.fullmatch(rf"job {jobs[-1]} allocated on node-\d", queue.detail), queue
        record_figure("queued behind a busy partition -> allocated after the blocker's "
                      "scancel (s)", round(allocated.waited_s, 1))
    finally:
        if sup.run is not None:
            await sup.kill(2.0)
        await sup.close()
    if sup.run is not None:
        await _gone(sup.run.run_id)


async def test_a_held_job_is_said_in_one_line_and_wait_exits_6(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """A job that cannot start by itself (submitted held): `wait --launch` prints the queued
    phase with the scheduler's reason, then one line, and exits 6; the job is cancelled, never
    left in the queue to start later unwatched."""
    profile = slurm_profile(tmp_path, name="held", extra='sbatch_args = ["--hold"]')
    waited = _cli("wait", str(profile), "--launch", timeout=60)
    assert waited.returncode == 6, waited.stdout + waited.stderr
    job_id = re.search(r"submitted job (\d+)", waited.stdout)
    assert job_id is not None, waited.stdout
    jobs.append(job_id.group(1))
    assert (f"phase: queued (job {job_id.group(1)} · JobHeldUser: held by its user"
            in waited.stdout), waited.stdout
    said = waited.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].removeprefix("specconsole: ").startswith(
        f"job {job_id.group(1)} can never start as it is (JobHeldUser: held by its user"), said
    assert f"cancelled it (scancel {job_id.group(1)})" in said[0]
    assert scontrol(job_id.group(1), cluster)["JobState"] == "CANCELLED"


async def test_check_asks_the_scheduler(tmp_path: Path, cluster: Cluster) -> None:
    """`check` on a [slurm] profile: sbatch --test-only's answer, and a request over the
    partition's limits refused in one line."""
    good = Supervisor(load_profile(slurm_profile(tmp_path, name="fits")))
    try:
        checks = await good.run_preflight()
    finally:
        await good.close()
    slurm_check = next(c for c in checks if c.check == "slurm")
    assert slurm_check.ok and "would start it at" in slurm_check.message
    assert "in partition batch" in slurm_check.message
    too_long = Supervisor(load_profile(slurm_profile(tmp_path, name="long",
                                                     time_limit="2:00:00")))
    try:
        with pytest.raises(PreflightFailed) as refused:
            await too_long.run_preflight()
    finally:
        await too_long.close()
    assert "slurm: the scheduler refuses the request" in str(refused.value)
    assert "time limit" in str(refused.value).lower()


async def _gone(run_id: str, timeout: float = 15) -> None:
    """No process carrying the run id is left (the scheduler's end took them all)."""
    deadline = time.monotonic() + timeout
    while carriers(run_id) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert carriers(run_id) == []


async def test_slurmd_killed_is_node_fail_naming_the_node(tmp_path: Path, cluster: Cluster,
                                                          jobs: list[str]) -> None:
    """The job's node stops answering the scheduler (its slurmd SIGKILLed): after SlurmdTimeout
    the scheduler ends the job NODE_FAIL, and that is the verdict, naming the node. The
    processes on a lost node are beyond the scheduler's reach (and so beyond a step's). The
    job is not requeued (--no-requeue): this cluster requeues a failed node's jobs."""
    sup = Supervisor(load_profile(slurm_profile(tmp_path,
                                                extra='sbatch_args = ["--no-requeue"]')))
    events = sup.subscribe()
    node = ""
    try:
        await _ready(sup, jobs)
        assert sup.job is not None and sup.job.node is not None
        node = sup.job.node
        cluster.kill_slurmd(node)
        killed_at = time.monotonic()
        died = await next_event(events, Died, 90)
        record_figure("slurmd SIGKILL -> DEAD told as NODE_FAIL (s)",
                      round(time.monotonic() - killed_at, 1))
        assert died.death.ended_by == f"NODE_FAIL: the scheduler lost node {node}" or (
            died.death.ended_by or "").startswith(f"NODE_FAIL: the scheduler lost node {node},")
        ended = await next_event(events, JobEnded, 30)
        assert ended.end.state == "NODE_FAIL" and ended.end.node == node
        assert scontrol(jobs[0], cluster)["JobState"] == "NODE_FAIL"
    finally:
        await sup.close()
        for pid in carriers(sup.run.run_id) if sup.run is not None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the lost node's leftovers: the lane's cleanup
        if node:
            cluster.start_slurmd(node)
            cluster.wait_idle(60)  # ReturnToService=2: the node is back once it registers


async def test_preempted_and_requeued_the_run_is_followed_to_ready_on_its_next_allocation(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """One job, READY; a job of the higher-PriorityTier partition takes its node: the scheduler
    preempts the run's job and requeues it (PreemptMode=REQUEUE: same id, Restarts 1). The
    first allocation's death is PREEMPTED in words, never a crash; the run is followed: the
    queue again ("preempted (requeued): job J back in the queue (...)"), allocated on another
    node, the job script's agent starting the server again there, READY again, its log resumed
    (each line of server.log seen once, in order, the first allocation's and the second's);
    the history keeps the preemption. `wait --until dead`, run from another process beside,
    follows the run across the requeue and goes on waiting."""
    history = History(tmp_path / "history.sqlite3")
    profile = slurm_profile(tmp_path)
    sup = Supervisor(load_profile(profile), history=history)
    events = sup.subscribe()
    seen: list[Any] = []
    waiting: subprocess.Popen[str] | None = None
    try:
        await _ready(sup, jobs)
        assert sup.job is not None and sup.run is not None
        node, run_id, pid = sup.job.node, sup.run.run_id, sup.run.pid
        out = tmp_path / "wait.out"
        with out.open("w") as sink:
            waiting = subprocess.Popen([sys.executable, "-m", "tui", "wait", str(profile),
                                        "--until", "dead"], stdout=sink,
                                       stderr=subprocess.STDOUT, text=True,
                                       env={**os.environ, "COLUMNS": "200"})
        await async_wait_for(lambda: "READY after" in out.read_text(), 60, "wait at READY")
        urgent = subprocess.run(
            ["sbatch", "--parsable", "--partition=urgent", f"--nodelist={node}", "--exclusive",
             "--time=2", f"--output={tmp_path}/urgent-%j.out", "--wrap", "sleep 120"],
            env=cluster.env, capture_output=True, text=True, check=True).stdout.strip()
        jobs.append(urgent)
        preempted_at = time.monotonic()
        died = await until_event(events, lambda e: isinstance(e, Died), 60, "the death", seen)
        words = died.death.ended_by or ""
        assert re.fullmatch(rf"PREEMPTED: preempted by a higher-priority job on {node} after "
                            rf"(\d+ min )?\d+ s of serving; requeued \(job {jobs[0]} back in "
                            r"the queue\)", words), died.death
        assert "not a crash" in death_lines(died.death)[1]
        assert died.death in sup.job.requeued  # `wait` goes on past it (tui/cli/follow.py)
        ended = await until_event(events, lambda e: isinstance(e, JobEnded), 30, "the end", seen)
        assert (ended.end.state, ended.end.requeued) == ("PREEMPTED", True)
        queued = await until_event(events, lambda e: isinstance(e, PhaseChanged)
                                   and e.phase is Phase.QUEUED, 30, "the queue again", seen)
        assert (queued.detail or "").startswith(
            f"preempted (requeued): job {jobs[0]} back in the queue ("), queued
        allocated = await until_event(events, lambda e: isinstance(e, JobAllocated), 60,
                                      "the next allocation", seen)
        assert allocated.job.node not in (None, node) and allocated.job.restarts == 1
        await until_event(events, lambda e: isinstance(e, Ready), 90, "READY again", seen)
        record_figure("preempted -> READY again on its next allocation (s)",
                      round(time.monotonic() - preempted_at, 1))
        assert (sup.run.run_id, sup.job.node) == (run_id, allocated.job.node)
        assert sup.run.pid != pid and sup.machine.state is State.READY
        fields = scontrol(jobs[0], cluster)
        assert (fields["JobState"], fields["Restarts"]) == ("RUNNING", "1")
        assert fields["NodeList"] == allocated.job.node
        log = (Path(sup.run.run_dir) / "server.log").read_text().splitlines()
        got = [raw for e in seen if isinstance(e, LinesAdded) for raw in e.chunk.raws]
        assert got == log[:len(got)], "each line once, in order, across the two allocations"
        again = (f"specconsole: job {jobs[0]} requeued (restart 1): the server starts again on "
                 f"{allocated.job.node}")
        assert got.count(again) == 1 and got.index(again) > 0
        output = Path(sup.job.output or "").read_text()
        assert re.search(rf"\*\*\* JOB {jobs[0]} ON {node} CANCELLED AT \S+ DUE TO PREEMPTION",
                         output), output
        recorded = history.get(run_id)
        assert recorded is not None and recorded.outcome == "ready"
        assert recorded.nodes == (node, allocated.job.node), recorded
        assert (recorded.job_end or "").startswith("PREEMPTED: preempted by a higher-priority "
                                                   f"job on {node}"), recorded
        assert not any(isinstance(e, Stalled) for e in seen)
        await async_wait_for(lambda: out.read_text().count("READY after") == 2, 30,
                             "wait at READY again")
        said = out.read_text()
        assert waiting.poll() is None, said  # still waiting, past the preemption
        assert f"PREEMPTED: preempted by a higher-priority job on {node} after" in said, said
        assert (f"phase: queued (preempted (requeued): job {jobs[0]} back in the queue ("
                in said), said
        assert f"job {jobs[0]} allocated on {allocated.job.node}" in said, said
    finally:
        if waiting is not None:
            waiting.terminate()
            waiting.wait(10)
        if sup.run is not None and sup.job is not None and sup.job.end is None:
            await sup.kill(2.0)
        await sup.close()
    await _gone(sup.run.run_id)


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`specconsole ARGS` as a user runs it on the login node."""
    return subprocess.run([sys.executable, "-m", "tui", *args], text=True, capture_output=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


async def test_the_cli_waits_for_a_job_then_kills_it_from_another_process(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """`wait --launch` says the job's submission and node, then READY, and leaves the job
    running; `kill` from another process finds the job from the run directory, kills through
    a step on its node (verified there), scancels it and waits until it has left the queue;
    a second `kill` is one line: the job is over."""
    profile = slurm_profile(tmp_path)
    waited = _cli("wait", str(profile), "--launch", "--timeout", "90s")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    job_id = next(w for w in waited.stdout.split() if w.isdigit() and f"submitted job {w}"
                  in waited.stdout)
    jobs.append(job_id)
    assert f"job {job_id} allocated on node-" in waited.stdout
    assert "READY after" in waited.stdout
    assert scontrol(job_id, cluster)["JobState"] == "RUNNING", "the job outlives `wait`"
    status = _cli("status", str(profile))
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(rf"job {job_id} RUNNING on node-\d, \d+ min( \d+ s)? of 5 min left",
                     status.stdout), status.stdout
    killed = _cli("kill", str(profile), "--grace", "2")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert "no process of the run remains" in killed.stdout
    fields = scontrol(job_id, cluster)
    assert fields["JobState"] == "CANCELLED"
    queue = subprocess.run(["squeue", "--noheader", "--jobs", job_id], env=cluster.env,
                           capture_output=True, text=True).stdout
    assert queue.strip() == ""
    run_id = Path(fields["StdOut"]).parent.name
    assert carriers(run_id) == []
    again = _cli("kill", str(profile), "--grace", "2")
    assert again.returncode != 0
    said = again.stderr.strip().splitlines()
    assert len(said) == 1 and f"job {job_id} is over (CANCELLED)" in said[0], again.stderr


async def test_restart_resubmits_live_or_over(tmp_path: Path, cluster: Cluster,
                                              jobs: list[str]) -> None:
    """Restart of a live job's run: killed and cancelled as `kill` does, then a new job;
    restart after the job's end (scancel from outside): a new job at once."""
    sup = Supervisor(load_profile(slurm_profile(tmp_path)))
    try:
        await _ready(sup, jobs)
        events = sup.subscribe()  # from READY on
        first = jobs[0]
        restarting = asyncio.ensure_future(sup.restart(grace=2.0))
        second = (await _event(events, JobSubmitted, restarting, 60)).job_id
        jobs.append(second)
        await _event(events, Ready, restarting, 90)
        await restarting
        assert second != first and scontrol(first, cluster)["JobState"] == "CANCELLED"
        subprocess.run(["scancel", second], env=cluster.env, check=True)
        await next_event(events, JobEnded, 30)
        restarting = asyncio.ensure_future(sup.restart(grace=2.0))
        third = (await _event(events, JobSubmitted, restarting, 60)).job_id
        jobs.append(third)
        await _event(events, Ready, restarting, 90)
        await restarting
        assert scontrol(third, cluster)["JobState"] == "RUNNING"
        assert sup.job is not None and sup.job.job_id == third
    finally:
        if sup.run is not None and sup.job is not None and sup.job.end is None:
            await sup.kill(2.0)
        await sup.close()
    await _gone(sup.run.run_id)


async def test_attach_to_a_job_submitted_by_hand_then_kill_names_whose_it_is(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """A job someone submitted with sbatch (the simulated server in their own script):
    `attach --slurm-job J --wait` finds its server on the job's node through a step of the job
    and follows it to READY; `kill` refuses in one line naming whose job it is; with --yes it
    is the scheduler's own kill (a kill through a step could not be verified: the job ends
    with its server, and the step with it): scancel, the job out of the queue, nothing of it
    left on the node."""
    profile = load_profile(slurm_profile(tmp_path, name="byhand"))
    plan = launcher.plan_launch(profile, dict(os.environ), time.time())
    script = tmp_path / "byhand.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --partition=batch\n#SBATCH --time=5\n"
                      f"#SBATCH --output={tmp_path}/byhand-%j.out\n"
                      f"export PYTHONPATH={shlex.quote(str(ROOT))}\n"
                      + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in plan.env.items())
                      + shlex.join(plan.argv) + "\n")
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], env=cluster.env, cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()
    jobs.append(job_id)
    deadline = time.monotonic() + 30
    while scontrol(job_id, cluster)["JobState"] != "RUNNING" and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    target = ["--slurm-job", job_id, "--port", str(profile.server.port), "--runs-dir",
              str(tmp_path / "attached"), "--python", sys.executable]
    attached = _cli("attach", *target, "--wait", "--timeout", "90s")
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert re.search(r"attached to run attached-job\d+-\S+ on local", attached.stdout)
    assert "READY after" in attached.stdout
    node = scontrol(job_id, cluster)["NodeList"]
    refused = _cli("kill", *target, "--grace", "2")
    said = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(said) == 1, refused.stdout + refused.stderr
    assert f"job {job_id} of user root on {node}: pid " in said[0]
    assert said[0].endswith("not killed; add --yes to kill it"), said
    assert scontrol(job_id, cluster)["JobState"] == "RUNNING"
    assert _of_job(job_id), "the owner's server runs in the job"
    killed = _cli("kill", *target, "--grace", "2", "--yes")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert f"cancelling job {job_id} (scancel): the scheduler ends its processes on {node}" \
        in killed.stdout, killed.stdout
    assert f"job {job_id} has left the queue" in killed.stdout, killed.stdout
    assert scontrol(job_id, cluster)["JobState"] == "CANCELLED"
    assert "RUNNING" not in subprocess.run(["squeue", "-h", "-j", job_id], env=cluster.env,
                                           capture_output=True, text=True).stdout
    deadline = time.monotonic() + 10
    while _of_job(job_id) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _of_job(job_id), "nothing of the owner's server is left on the node"


def _of_job(job_id: str) -> list[int]:
    """The simulated server's processes of the job (SLURM_JOB_ID in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in env and b"tui.sim" in cmd:
            found.append(int(entry.name))
    return found


def two_node_profile(tmp: Path, extra: str = "", *, backend: str = "native",
                     python: str = sys.executable, server_extra: str = "",
                     cluster_extra: str = "") -> Path:
    """The simulated engine at TP 8 over a two-node job, 4 fake GPUs per node: vLLM's native
    multi-node (the head on the first node, a --headless node on the second), or Ray's;
    `extra` lines in [slurm], `server_extra` tables after [server], `cluster_extra` lines in
    [cluster]."""
    path = tmp / f"two-{backend}.toml"
    path.write_text(f"""
[host]
target = "local"
python = "{python}"
runs_dir = "{tmp / 'runs'}"
{sim_server(tmp, "ready", 300.0, load_time="1m", stall="5m", gpus=4)}
{server_extra}
[slurm]
partition = "batch"
time = "5"
nodes = 2
job_name = "two"
{extra}

[cluster]
backend = "{backend}"
port = {free_port()}
join_timeout = "90s"
{cluster_extra}
""")
    return path


def _of(member: str, kind: type) -> Any:
    return lambda e: (isinstance(e, MemberEvent) and e.member == member
                      and isinstance(e.event, kind))


async def test_a_two_node_job_a_member_per_node_kill_then_a_worker_killed_on_the_second(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """One job of two nodes: the server's member on the first, the headless node on the
    second, each launched by the agent the job script started on its node and watched through
    a step (its processes, their GPU memory). Kill leaves no process of either member on either
    node and the job out of the queue. Launched again (a new job): a worker SIGKILLed on the
    second node is the run's death within 1 s, naming the node and the process, its root cause
    the signal; while the scheduler still runs the job, the verdict says the first node still
    holds its GPUs; the job's own end follows (the simulated head, like vLLM's multiproc
    executor, shuts down when a worker dies) and leaves nothing on either node."""
    group = ClusterRun(load_profile(two_node_profile(tmp_path)))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        nodes = await two_node_ready(group, events, seen, cluster, jobs)
        first_runs = [s.run.run_id for s in group.sups.values() if s.run is not None]
        await group.kill(2.0)
        assert len(first_runs) == 2
        for run_id in first_runs:
            await _gone(run_id, timeout=5)
        assert scontrol(jobs[0], cluster)["JobState"] == "CANCELLED"
        assert _queued(jobs[0], cluster) == ""
        for sup in group.sups.values():  # as restart does, after the kill
            sup.reset()
        nodes = await two_node_ready(group, events, seen, cluster, jobs)
        second = group.sups["node-1"]
        assert second.run is not None
        died, after = await sigkill_is_the_runs_death(
            events, seen, _worker(second.run.run_id, "Worker_TP"), "node-1", nodes[1])
        assert died.death.process.startswith("Worker_TP")
        assert died.death.ended_by is None, "a worker's own death is not the scheduler's"
        failed = await until_event(events, lambda e: isinstance(e, StepFailed), 10,
                                   "the failed step's verdict", seen)
        assert (failed.node, failed.holding) == (nodes[1], (nodes[0],))
        assert failed.words().startswith(f"{died.death.process} died on {nodes[1]}; job "
                                         f"{jobs[-1]} is still running: {nodes[0]} still holds "
                                         "its GPUs"), failed.words()
        record_figure("two-node job: worker SIGKILL on the second node -> DEAD (ms)",
                      round(after * 1000, 1))
        # the exit status comes after the death (its root cause): within 10 s on a busy machine
        asked, found = time.monotonic(), group.death()
        while found is not None and time.monotonic() - asked < 10 and not death_lines(
                found[1])[1].startswith("root cause: killed by SIGKILL"):
            await asyncio.sleep(0.1)
            found = group.death()
        assert found is not None and found[0].host == nodes[1]
        assert death_lines(found[1])[1].startswith("root cause: killed by SIGKILL"), (
            found, f"{time.monotonic() - asked:.1f} s after the death")
        record_figure("two-node job: the death's root cause after it (s)",
                      round(time.monotonic() - asked, 2))
        ended = await until_event(events, _of("server", JobEnded), 30, "the job's end", seen)
        assert ended.event.end.state in ("COMPLETED", "FAILED"), ended.event
    finally:
        await group.close()
    for sup in group.sups.values():
        assert sup.run is not None
        await _gone(sup.run.run_id, timeout=10)
    assert scontrol(jobs[-1], cluster)["JobState"] in ("COMPLETED", "FAILED")
    assert _queued(jobs[-1], cluster) == ""


async def test_slurmd_killed_on_the_second_node_of_a_two_node_job_is_node_fail_naming_it(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """A two-node job READY; the second node's slurmd SIGKILLed: after SlurmdTimeout the
    scheduler ends the job NODE_FAIL, and the run's verdict names the node it lost (not the
    job's first). Not requeued (--no-requeue: this cluster requeues a failed node's jobs)."""
    group = ClusterRun(load_profile(two_node_profile(
        tmp_path, extra='sbatch_args = ["--no-requeue"]')))
    events = group.subscribe()
    seen: list[Any] = []
    lost = ""
    try:
        nodes = await two_node_ready(group, events, seen, cluster, jobs)
        lost = nodes[1]
        cluster.kill_slurmd(lost)
        killed_at = time.monotonic()
        ended = await until_event(events, _of("server", JobEnded), 90, "the job's end", seen)
        record_figure("two-node job: second node's slurmd SIGKILL -> NODE_FAIL told (s)",
                      round(time.monotonic() - killed_at, 1))
        assert ended.event.end.state == "NODE_FAIL", ended.event
        assert ended.event.end.words().startswith(
            f"NODE_FAIL: the scheduler lost node {lost} (of the job's "), ended.event.end.words()
        assert scontrol(jobs[-1], cluster)["JobState"] == "NODE_FAIL"
    finally:
        await group.close()
        for sup in group.sups.values():
            for pid in carriers(sup.run.run_id) if sup.run is not None else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # the lost node's leftovers: the lane's cleanup
        if lost:
            cluster.start_slurmd(lost)
            cluster.wait_idle(60)


@pytest.mark.timeout(300)
async def test_a_two_node_job_preempted_and_requeued_is_followed_to_ready_on_its_next_nodes(
        tmp_path: Path, cluster: Cluster, jobs: list[str]) -> None:
    """A two-node job READY; a job of the higher-PriorityTier partition takes its first node:
    the scheduler preempts the job and requeues it (same id, Restarts 1). The run's death is
    PREEMPTED in words; the queue again; the job allocated again on two nodes (not the one
    taken), each member placed on its new node and launched there by the agent the job script
    started again, a fresh run each, READY again. The kill then leaves nothing of either
    member and the job out of the queue."""
    group = ClusterRun(load_profile(two_node_profile(tmp_path)))
    events = group.subscribe()
    seen: list[Any] = []
    try:
        nodes = await two_node_ready(group, events, seen, cluster, jobs)
        first = {name: sup.run.run_id for name, sup in group.sups.items() if sup.run}
        urgent = subprocess.run(
            ["sbatch", "--parsable", "--partition=urgent", f"--nodelist={nodes[0]}",
             "--exclusive", "--time=2", f"--output={tmp_path}/urgent-%j.out", "--wrap",
             "sleep 120"], env=cluster.env, capture_output=True, text=True, check=True)
        jobs.append(urgent.stdout.strip())
        preempted_at = time.monotonic()
        died = await until_event(events, lambda e: isinstance(e, RunDied), 60, "the death", seen)
        assert (died.death.ended_by or "").startswith("PREEMPTED: preempted by a higher-priority "
                                                      "job"), died.death
        assert died.requeued and not SeveralHosts(group).is_death(died), "wait goes on"
        ended = await until_event(events, _of("server", JobEnded), 30, "the job's end", seen)
        assert (ended.event.end.state, ended.event.end.requeued) == ("PREEMPTED", True)
        allocated = await until_event(events, _of("server", JobAllocated), 90,
                                      "the next allocation", seen)
        assert allocated.event.job.restarts == 1 and nodes[0] not in allocated.event.job.nodes
        await until_event(events, _of("server", Ready), 120, "READY again", seen)
        record_figure("two-node job: preempted -> READY again on its next nodes (s)",
                      round(time.monotonic() - preempted_at, 1))
        fields = scontrol(jobs[0], cluster)
        assert (fields["JobState"], fields["Restarts"]) == ("RUNNING", "1")
        again = expand_nodes(fields["NodeList"])
        assert [(m.name, m.host) for m in group.parts] == [("server", again[0]),
                                                           ("node-1", again[1])]
        for m in group.parts:
            sup = group.sups[m.name]
            assert sup.run is not None and sup.run.run_id != first[m.name]
            assert os.readlink(f"/proc/{sup.run.pid}/ns/net") == os.readlink(
                f"/proc/{cluster.slurmd_pid(m.host)}/ns/net"), m.name
        runs = [sup.run.run_id for sup in group.sups.values() if sup.run is not None]
        await group.kill(2.0)
        for run_id in [*runs, *first.values()]:
            await _gone(run_id, timeout=10)
        assert scontrol(jobs[0], cluster)["JobState"] == "CANCELLED"
        assert _queued(jobs[0], cluster) == ""
    finally:
        await group.close()


async def sigkill_is_the_runs_death(events: asyncio.Queue[Any], seen: list[Any], victim: int,
                                   member: str, node: str) -> tuple[RunDied, float]:
    """SIGKILL `victim`: the run's death within 1 s, on `member` at `node`, that process's;
    (the death, seconds after the signal)."""
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    died = await until_event(events, lambda e: isinstance(e, RunDied), 10, "the death", seen)
    after = time.monotonic() - killed_at
    assert after < 1.0, f"DEAD {after:.2f} s after the SIGKILL"
    assert (died.member, died.host, died.death.pid) == (member, node, victim), died
    return died, after


NATIVE_LAYOUT = (("server", 0), ("node-1", 1))  # (member, its node's index), launch order


async def two_node_ready(group: ClusterRun, events: asyncio.Queue[Any], seen: list[Any],
                         cluster: Cluster, jobs: list[str], layout: tuple[tuple[str, int], ...]
                         = NATIVE_LAYOUT, holding_gpus: tuple[str, ...] = ("server", "node-1"),
                         what: str = "two-node job") -> tuple[str, ...]:
    """Launch the two-node job to READY; its nodes. Each member is checked to run on its node
    of `layout` (its server in that node's network namespace) and, for those `holding_gpus`,
    the agent there to see their GPU memory, per process."""
    started = time.monotonic()
    launching = asyncio.ensure_future(group.launch())
    submitted = await until_event(events, _of("server", JobSubmitted), 30, "the job", seen)
    jobs.append(submitted.event.job_id)
    await until_event(events, _of("server", Ready), 180, "READY", seen)
    await launching
    record_figure(f"{what}: submit -> READY (s)", round(time.monotonic() - started, 1))
    fields = scontrol(jobs[-1], cluster)
    assert (fields["JobState"], fields["NumNodes"]) == ("RUNNING", "2")
    nodes = expand_nodes(fields["NodeList"])
    placed = [(name, nodes[i]) for name, i in layout]
    assert [(m.name, m.host) for m in group.parts] == placed
    assert [(m.role, m.host) for m in group.members] == placed
    for m in group.parts:
        sup = group.sups[m.name]
        assert sup.run is not None and sup.job is not None and sup.job.node == m.host
        assert os.readlink(f"/proc/{sup.run.pid}/ns/net") == os.readlink(
            f"/proc/{cluster.slurmd_pid(m.host)}/ns/net"), m.name
        if m.name in holding_gpus:
            ours = set(carriers(sup.run.run_id))
            await until_event(events, lambda e, name=m.name, ours=ours: _of(name, GpusSeen)(e)
                              and any(p.pid in ours for g in e.event.gpus.gpus
                                      for p in g.procs), 30, f"{m.name}'s GPU memory", seen)
    return nodes


def _queued(job_id: str, cluster: Cluster) -> str:
    return subprocess.run(["squeue", "--noheader", "--jobs", job_id], env=cluster.env,
                          capture_output=True, text=True).stdout.strip()
