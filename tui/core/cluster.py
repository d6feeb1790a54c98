"""A launch that spans several hosts, as the ordered members that start it.

vLLM runs on several nodes in two shapes: a Ray cluster (`ray start --head` on the head host,
`ray start --address` on the others, then `vllm serve ... --distributed-executor-backend ray` on
the head) or its own multi-node launch (`vllm serve --nnodes N --node-rank R --master-addr A`, the
other nodes `--headless`). Each member is one process tree on one host, launched and watched like
a single-host run (its own derived Profile), in the order given here; a member with a `joined`
pattern must print it before the next member starts.

Through Slurm (`[slurm] nodes = N` with `[cluster]`) the hosts are the job's nodes, known once
the scheduler has allocated them (`allocated`): each member is then reached through the login
node ([host]) as a step of the job, and runs on its node as on any host.

A simulated profile (`[simulate]`) runs the simulated engine everywhere; its Ray is the
simulated one (`tui.sim.ray`) unless `[cluster] ray` names a Ray command of its own: then the
members run that real `ray start`, with the simulated GPUs declared as Ray's (`--num-gpus`),
and the simulated engine core places its ranks as real Ray actors on that cluster
(`tui/sim/ray_actors.py`, told so by REAL_RAY_ENV).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from tui.core.command import build_server_argv, host_python
from tui.core.errors import ProfileError
from tui.core.profile import NodeConfig, Profile

# `ray start` prints it (Ray 2.x, green, between dashes) once its node is up: the head's once
# its GCS and raylet run, another's once its raylet has registered with the head's GCS
RAY_JOINED = re.compile(r"Ray runtime started")
DEFAULT_RAY = ("ray",)  # ClusterConfig.ray's default: a simulated profile simulates it
# the environment that puts the simulated engine on a real Ray cluster (tui/sim/ray_actors.py
# reads the same names; a test keeps them equal)
REAL_RAY_ENV = "SPECCONSOLE_SIM_REAL_RAY"
SIM_SCENARIO_ENV = "SPECCONSOLE_SIM_SCENARIO"
# A headless node has joined once vLLM's headless entry point runs it (vllm/entrypoints/cli/
# serve.py, run_headless): multi-node TP/PP (0.11+) says "Launching vLLM (vX) headless multiproc
# executor, with head node address A:P for torch.distributed process group.", data-parallel
# headless "Launching N data parallel engine(s) in headless mode, with head node address ...".
# Its config is then valid and its workers start. The rendezvous itself (each worker's "rank R
# in world size W is assigned as ...") completes only once every node is up, so waiting for it
# node by node would never end past two nodes.
HEADLESS_JOINED = re.compile(r"headless multiproc executor, with head node address|"
                             r"data parallel engine\(s\) in headless mode")
SERVER = "server"


@dataclass(frozen=True, slots=True)
class Member:
    """One process tree of the launch on one host."""

    name: str  # "ray-head", "ray-node-1", "node-1", "server"
    node: NodeConfig
    profile: Profile  # a single-host profile whose command is this member's
    joined: re.Pattern[str] | None = None  # None: nothing waits for it (the server)

    @property
    def serves(self) -> bool:
        """The member whose READY is the run's READY (its health and smoke are the run's)."""
        return self.name == SERVER

    @property
    def host(self) -> str:
        return self.node.where


def is_cluster(profile: Profile) -> bool:
    return profile.cluster is not None and (len(profile.nodes) > 1 or job_nodes(profile) > 1)


def job_nodes(profile: Profile) -> int:
    """How many nodes the profile's Slurm job asks for (1 without [slurm])."""
    return profile.slurm.nodes if profile.slurm is not None else 1


def allocated(profile: Profile, nodes: Sequence[tuple[str, str]]) -> Profile:
    """A several-node job's profile once the scheduler has allocated its nodes, each (name,
    address), the first the head: the hosts of its launch, each reached through [host] (the
    login node) as a step of the job."""
    return replace(profile, nodes=tuple(
        NodeConfig("head" if i == 0 else "worker", profile.host, address, job_node=name)
        for i, (name, address) in enumerate(nodes)))


def unallocated(profile: Profile) -> Profile:
    """A several-node job's profile before its allocation: its members are named, their nodes
    not known yet (`job node 1`, ...); `allocated` replaces them."""
    return allocated(profile, [(f"job node {i}", f"job-node-{i}.invalid")
                               for i in range(1, job_nodes(profile) + 1)])


def members(profile: Profile) -> list[Member]:
    """The members in launch order (kill goes the other way round)."""
    cluster = profile.cluster
    if not profile.nodes and job_nodes(profile) > 1:
        profile = unallocated(profile)
    assert cluster is not None and profile.nodes, "members() is for [[hosts]] profiles"
    head, others = profile.nodes[0], profile.nodes[1:]
    port = cluster.rendezvous_port
    address = head.reached_at
    if cluster.backend == "ray":
        ray_at = f"{address}:{port}"
        out = [Member("ray-head", head, _node_profile(profile, head, "ray-head", _ray(
            profile, head, ["--head", f"--port={port}"]), port, _ray_env(profile, head)),
            RAY_JOINED)]
        out += [Member(f"ray-node-{i}", node, _node_profile(profile, node, f"ray-node-{i}", _ray(
            profile, node, [f"--address={ray_at}"]), None, _ray_env(profile, node)), RAY_JOINED)
                for i, node in enumerate(others, 1)]
        server = _server_argv(profile, head, ["--distributed-executor-backend", "ray"])
        env = {"RAY_ADDRESS": ray_at, **({REAL_RAY_ENV: "1"} if real_ray(profile) else {})}
        out.append(Member(SERVER, head, _server_profile(profile, head, server, env)))
        return out
    n = len(profile.nodes)

    def ranked(node: NodeConfig, rank: int) -> list[str]:
        return ["--nnodes", str(n), "--node-rank", str(rank), "--master-addr", address,
                "--master-port", str(port)]

    out = [Member(SERVER, head, _server_profile(profile, head, _server_argv(
        profile, head, ranked(head, 0)), {}))]
    out += [Member(f"node-{i}", node, _node_profile(profile, node, f"node-{i}", _server_argv(
        profile, node, [*ranked(node, i), "--headless"]), None), HEADLESS_JOINED)
            for i, node in enumerate(others, 1)]
    return out


def member_profile(profile: Profile, name: str) -> Profile:
    """One member's own profile (its log, its runs), or one line naming the members."""
    found = {m.name: m for m in members(profile)}
    if name not in found:
        raise ProfileError(profile.path, f"no member {name!r} in this launch; its members: "
                           f"{', '.join(found)}", key="cluster")
    return found[name].profile


def _scenario(profile: Profile, node: NodeConfig) -> str | None:
    """The simulated scenario this host plays: every host the profile's, or only fault_host's
    (the others run "ready")."""
    sim = profile.simulate
    if sim is None:
        return None
    if sim.fault_host is None:
        return sim.scenario
    return sim.scenario if sim.fault_host == node.where else "ready"


def _on_host(profile: Profile, node: NodeConfig) -> Profile:
    """The profile as seen from one host: its host table, its own fake GPUs (the lab's hosts
    share one filesystem, real ones do not mind a subdirectory), its scenario."""
    sim = profile.simulate
    if sim is not None:
        base = PurePosixPath(sim.gpu_state or "~/.specconsole/sim-gpus")
        sim = replace(sim, gpu_state=str(base / _safe(node.where)),
                      scenario=_scenario(profile, node) or sim.scenario)
    return replace(profile, host=node.host, simulate=sim, nodes=(), cluster=None)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "host"


def _server_argv(profile: Profile, node: NodeConfig, extra: list[str]) -> tuple[str, ...]:
    """`vllm serve ...` (or the simulated engine) with the multi-node arguments added."""
    local = _on_host(profile, node)
    argv = build_server_argv(local, host_python(local))
    if profile.simulate is None:
        return (*argv, *extra)
    sim_at = argv.index("--sim-scenario")  # the engine's own options before the simulation's
    return (*argv[:sim_at], *extra, *argv[sim_at:])


def real_ray(profile: Profile) -> bool:
    """Whether the members run a real `ray start`: always for a real profile; for a simulated
    one when `[cluster] ray` names a Ray command of its own (see the module docstring)."""
    cluster = profile.cluster
    return cluster is not None and cluster.backend == "ray" and (
        profile.simulate is None or cluster.ray != DEFAULT_RAY)


def _ray(profile: Profile, node: NodeConfig, how: list[str]) -> tuple[str, ...]:
    """`ray start ... --block` on a host (the simulated Ray when the profile simulates, unless
    it names a real one: then with the host's simulated GPUs as Ray's GPUs)."""
    local = _on_host(profile, node)
    sim = local.simulate
    assert profile.cluster is not None
    own = [*how, f"--node-ip-address={node.reached_at}"]
    if sim is None:
        return (*profile.cluster.ray, "start", *own, "--block")
    if real_ray(profile):
        return (*profile.cluster.ray, "start", *own, f"--num-gpus={sim.gpus}", "--block")
    argv = [host_python(local), "-m", "tui.sim.ray", "start", *own, "--num-gpus", str(sim.gpus),
            "--block", "--sim-gpu-state", str(sim.gpu_state)]
    if profile.simulate is not None and profile.simulate.fault_host is not None:
        argv += ["--sim-scenario", sim.scenario]
    return tuple(argv)


def _server_profile(profile: Profile, node: NodeConfig, argv: tuple[str, ...],
                    env: dict[str, str]) -> Profile:
    local = _on_host(profile, node)
    per_host = max(1, profile.server.tensor_parallel_size // len(profile.nodes))
    return replace(local, server=replace(local.server, command=argv, env={
        **local.server.env, **env}, tensor_parallel_size=per_host))


def _ray_env(profile: Profile, node: NodeConfig) -> dict[str, str]:
    """A real Ray node under the simulated engine: the scenario its actors play when only one
    host plays the fault (Ray's workers inherit the node's environment, as they inherit
    SPECCONSOLE_RUN_ID and the node's $SPECCONSOLE_SIM_GPU_STATE)."""
    sim = profile.simulate
    if sim is None or sim.fault_host is None or not real_ray(profile):
        return {}
    return {SIM_SCENARIO_ENV: _scenario(profile, node) or sim.scenario}


def _node_profile(profile: Profile, node: NodeConfig, name: str, argv: tuple[str, ...],
                  port: int | None, env: dict[str, str] | None = None) -> Profile:
    """A member that serves nothing itself: named after the run, its preflight checks the
    GPUs (and the rendezvous port on the head), never the server's port."""
    local = _server_profile(profile, node, argv, env or {})
    preflight = replace(local.preflight, port_free=port is not None and local.preflight.port_free)
    return replace(local, name=f"{profile.name}.{name}", preflight=preflight,
                   server=replace(local.server, port=port or local.server.port),
                   smoke=replace(local.smoke, enabled=False))
