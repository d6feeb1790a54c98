"""A Slurm job of several nodes, the pure and the agent's parts: the [slurm] nodes with
[cluster] table, the members placed on the allocated nodes, the generated job script (one agent
per node, each waiting for its member's launch), the scheduler's node states, and the verdict
words (a failed step naming its node and the nodes the job still holds; NODE_FAIL naming the lost
node of several). The sinfo text below was printed by the Slurm lane's cluster (slurm-wlm
22.05.8, tests/slurm/slurmlab.py), a node's slurmd killed."""

from __future__ import annotations

import json
import shlex
import threading
import time
from pathlib import Path

import pytest

from tui.agent.launch import _await_request
from tui.cli.follow import SeveralHosts
from tui.core import cluster
from tui.core.errors import ProfileError, SpecconsoleError
from tui.core.profile import Profile, loads_profile
from tui.core.slurm import (
    LAUNCH_REQUEST,
    SchedulerEnd,
    job_script,
    parse_node_states,
    step_failed_words,
)
from tui.core.state import Death
from tui.supervise.events import Notice
from tui.supervise.group import ClusterRun, RunDied
from tui.supervise.slurmjob import JobRun

TWO_NODES = ('[host]\ntarget = "login1"\nruns_dir = "/home/u/runs"\n'
             '[server]\nengine = "vllm"\nmodel = "/models/m"\ntensor_parallel_size = 16\n'
             '[slurm]\npartition = "gpu"\nnodes = 2\ngpus_per_node = 8\ntime = "4:00:00"\n'
             '[cluster]\nbackend = "native"\n')


def _two_nodes(text: str = TWO_NODES) -> Profile:
    return loads_profile(text, "/p/kimi.toml", environ={})


def test_several_nodes_need_a_cluster_table_and_a_cluster_needs_several() -> None:
    with pytest.raises(ProfileError) as refused:
        _two_nodes(TWO_NODES.replace('[cluster]\nbackend = "native"\n', ""))
    assert str(refused.value).startswith("/p/kimi.toml:10: slurm.nodes: 2 nodes need a "
                                         "[cluster] table"), refused.value
    with pytest.raises(ProfileError) as refused:
        _two_nodes(TWO_NODES.replace("nodes = 2", "nodes = 1"))
    assert "cluster: [cluster] needs several nodes: set [slurm] nodes" in str(refused.value)
    with pytest.raises(ProfileError) as refused:
        _two_nodes(TWO_NODES.replace("tensor_parallel_size = 16", "tensor_parallel_size = 3"))
    assert "tensor_parallel_size 3 does not split over 2 hosts" in str(refused.value)


def test_the_members_are_placed_on_the_allocated_nodes_reached_through_the_login_node() -> None:
    profile = _two_nodes()
    assert cluster.is_cluster(profile)
    before = cluster.members(profile)  # named before the allocation, nodes not known
    assert [(m.name, m.host) for m in before] == [("server", "job node 1"),
                                                  ("node-1", "job node 2")]
    placed = cluster.members(cluster.allocated(profile, [("gpu-07", "10.0.0.7"),
                                                         ("gpu-08", "10.0.0.8")]))
    assert [(m.name, m.host) for m in placed] == [("server", "gpu-07"), ("node-1", "gpu-08")]
    head, other = (m.profile for m in placed)
    assert head.host.target == other.host.target == "login1"  # each reached as a step
    assert head.slurm is not None and head.slurm.nodes == 2
    assert head.server.tensor_parallel_size == 8
    assert head.server.command[-8:] == ("--nnodes", "2", "--node-rank", "0", "--master-addr",
                                        "10.0.0.7", "--master-port", "29500")
    assert other.server.command[-9:] == ("--nnodes", "2", "--node-rank", "1", "--master-addr",
                                         "10.0.0.7", "--master-port", "29500", "--headless")


def test_the_job_script_starts_one_agent_per_node_waiting_for_its_member() -> None:
    run_dir = "/home/u/runs/kimi.job-1"
    script = job_script(_two_nodes(), "kimi.job-1", run_dir,
                        ["python3", "-u", "-c", "boot", "h", "launch"],
                        stdin=f"{run_dir}/agent.stdin")
    lines = script.splitlines()
    directives = [ln.removeprefix("#SBATCH ") for ln in lines if ln.startswith("#SBATCH ")]
    assert directives[:5] == ["--job-name=kimi", f"--output={run_dir}/slurm-%j.out",
                              "--open-mode=append", "--nodes=2", "--ntasks-per-node=1"]
    # the batch script runs on the first node only: one step of one task on every node, each
    # given the agent on stdin, a task's end not ending the others
    assert shlex.split(lines[-1]) == [
        "srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        "--kill-on-bad-exit=0", "--input=all", "python3", "-u", "-c", "boot", "h", "launch",
        "<", f"{run_dir}/agent.stdin"]
    assert f"({run_dir}/launch-{{node}}.json)" in script
    one_node = _two_nodes(TWO_NODES.replace("nodes = 2", "nodes = 1").replace(
        '[cluster]\nbackend = "native"\n', ""))
    assert shlex.split(job_script(one_node, "r", run_dir, ["agent"]).splitlines()[-1]) == [
        "agent"]


def test_the_agent_on_a_node_waits_for_its_members_launch_then_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-08")
    pattern = str(tmp_path / LAUNCH_REQUEST)
    spec = {"run_id": "kimi.node-1-1", "argv": ["vllm", "serve"], "env": {"HF_TOKEN": "s"}}
    other = tmp_path / "launch-gpu-07.json"
    other.write_text(json.dumps({"run_id": "not this node's"}))

    def written_later() -> None:
        time.sleep(0.3)
        (tmp_path / "launch-gpu-08.json").write_text(json.dumps(spec))

    threading.Thread(target=written_later).start()
    assert _await_request(pattern, 5.0) == spec
    assert not (tmp_path / "launch-gpu-08.json").exists(), "it holds secrets: removed"
    assert other.exists()
    started = time.monotonic()
    assert _await_request(pattern, 0.3) is None  # none came: nothing launched on this node
    assert time.monotonic() - started >= 0.3


SINFO_NODE_LOST = "node-1|alloc|10.230.1.2\nnode-2|down*|10.230.2.2\nnode-2|down*|10.230.2.2\n"


def test_node_states_say_which_node_the_scheduler_lost() -> None:
    states = parse_node_states(SINFO_NODE_LOST)
    assert [(s.name, s.state, s.address, s.lost) for s in states] == [
        ("node-1", "alloc", "10.230.1.2", False), ("node-2", "down*", "10.230.2.2", True)]
    assert [s.lost for s in parse_node_states("a|idle*|a\nb|mix|b\nc|drain|c\n")] == [
        True, False, True]


def test_node_fail_of_a_node_of_several_names_that_node() -> None:
    end = SchedulerEnd("NODE_FAIL", "31", "node-2", 300, None, None, "NodeDown",
                       ("node-1", "node-2"))
    assert end.words() == "NODE_FAIL: the scheduler lost node node-2 (of the job's node-1, node-2)"
    alone = SchedulerEnd("NODE_FAIL", "31", "node-1", 300, None, None, "NodeDown", ("node-1",))
    assert alone.words() == "NODE_FAIL: the scheduler lost node node-1"


def test_a_failed_step_names_its_node_and_the_nodes_still_held() -> None:
    assert step_failed_words("31", "node-2", "Worker_TP1", ("node-1",)) == (
        "Worker_TP1 died on node-2; job 31 is still running: node-1 still holds its GPUs until "
        "the job ends (specconsole kill, or scancel 31, releases them)")
    assert "node-1, node-3 still hold their GPUs" in step_failed_words(
        "31", "node-2", "Worker_TP1", ("node-1", "node-3"))


async def test_a_requeued_job_that_ends_before_it_runs_again_is_the_runs_death_after_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A several-node job preempted and requeued: its first death is said as requeued (`wait`
    goes on). When the job then ends before it runs again, that death is the run's after all,
    with what followed, so `wait` ends there."""
    group = ClusterRun(_two_nodes())
    events = group.subscribe()
    death = Death(7, "APIServer", None, 15, 100.0, 100.0, None, None,
                  ended_by="PREEMPTED: preempted by a higher-priority job on gpu-07")
    group.died = RunDied("node-1", "gpu-08", death, requeued=True)
    group.server.job = JobRun("5", "/home/u/runs/kimi.job-1/job.sbatch",
                              job_dir="/home/u/runs/kimi.job-1", node="gpu-07")

    async def ended_first(end: SchedulerEnd, at: float) -> None:
        raise SpecconsoleError("job 5 ended before it ran again: CANCELLED: job 5 was cancelled")

    monkeypatch.setattr(group.server.slurm, "requeued_job", ended_first)
    end = SchedulerEnd("PREEMPTED", "5", "gpu-07", 300, None, None, "", requeued=True)
    await group._follow_requeue(end)
    said = [events.get_nowait() for _ in range(events.qsize())]
    died = next(e for e in said if isinstance(e, RunDied))
    assert not died.requeued and SeveralHosts(group).is_death(died)
    assert died.death.ended_by == ("PREEMPTED: preempted by a higher-priority job on gpu-07; "
                                   "then job 5 ended before it ran again: CANCELLED: job 5 was "
                                   "cancelled")
    assert any(isinstance(e, Notice) and e.level == "warning" for e in said)
