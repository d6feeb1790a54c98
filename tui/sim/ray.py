"""Simulated `ray start` (simulation only): the Ray cluster vLLM's Ray backend runs on.

    python -m tui.sim.ray start --head --port RP --node-ip-address ADDR --num-gpus G --block
        [--sim-scenario S] [--sim-gpu-state DIR]
    python -m tui.sim.ray start --address ADDR:RP --node-ip-address IP --num-gpus G --block
        [--sim-scenario S] [--sim-gpu-state DIR]

Either stays in the foreground (real Ray returns without --block; this always blocks) and prints
Ray-like lines, "Ray runtime started." once its node is up: the head's once its GCS listens,
another's once it has registered with the head. The head's GCS (a thread here) keeps the node
registry and relays between the drivers (the simulated engine core, at $RAY_ADDRESS) and the
nodes. Every node, the head's included, is a `NodeAgent` (`tui/sim/node.py`) that runs the
ranks placed on it as `ray::RayWorkerWrapper` processes in sessions of their own, as Ray's
raylet does: they inherit the node's environment and write to its stdout under Ray's prefix,
and only the node itself stops them. --sim-scenario overrides the driver's scenario for this
node's workers.

This stands in for Ray only where a simulated profile leaves `[cluster] ray` at its default;
naming a real Ray there runs the real `ray start` instead, and the simulated engine's ranks
become real Ray actors on it (`tui/sim/ray_actors.py`).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

from tui.sim import cluster, gpu_state, runtime
from tui.sim.cluster import Link, Message
from tui.sim.node import NodeAgent
from tui.sim.runtime import Runtime, SimClock
from tui.sim.scenarios import SCENARIOS
from tui.sim.simlog import SimLog

DEFAULT_PORT = 6379
BLOCK_NOTICE = (
    "--block\n"
    "  This command will now block forever until terminated by a signal.\n"
    "  Running subprocesses are monitored and a message will be printed if any of them "
    "terminate unexpectedly. Subprocesses exit with SIGTERM will be treated as graceful, thus "
    "NOT reported.\n")


class _Node(cluster.Peer):
    """A registered node: its GPUs and how many each job holds."""

    def __init__(self, link: Link, node_id: int, hello: Message) -> None:
        super().__init__(link, f"node {node_id} ({hello.get('ip')})")
        self.node_id = node_id
        self.ip = str(hello.get("ip"))
        self.gpus = int(hello.get("gpus", 0))
        self.head = bool(hello.get("head"))
        self.used: dict[int, int] = {}  # job -> GPUs

    @property
    def free(self) -> int:
        return self.gpus - sum(self.used.values())


@dataclass
class _Driver:
    """A connected driver (an engine core) and its job id."""

    job: int
    link: Link


class Gcs:
    """The head's registry and relay (Ray's GCS), run by `cluster.serve` on one thread."""

    def __init__(self) -> None:
        self.session = f"{os.getpid()}-{time.time():.6f}"
        self.nodes: dict[int, _Node] = {}
        self.drivers: dict[int, _Driver] = {}
        self.placed: dict[tuple[int, int], _Node] = {}  # (job, rank) -> its node
        self.finished: set[tuple[int, int]] = set()  # (job, rank) that exited
        self._ids = itertools.count(1)

    def greet(self, link: Link, msg: Message) -> _Node | _Driver | None:
        resume = msg.get("resume")
        if msg.get("op") != "hello" or (resume and resume.get("session") != self.session):
            link.send({"op": "reject", "reason": "this Ray head does not know that node"})
            return None
        if msg.get("role") == "driver":
            driver = _Driver(next(self._ids), link)
            self.drivers[driver.job] = driver
            link.send({"op": "welcome", "job": driver.job})
            return driver
        node = self.nodes.get(resume.get("node_id")) if resume else None
        if node is not None:
            node.resume(link, self._welcome(node))
            return node
        node = _Node(link, next(self._ids), msg)
        self.nodes[node.node_id] = node
        link.send(self._welcome(node))
        return node

    def _welcome(self, node: _Node) -> Message:
        return {"op": "welcome", "session": self.session, "node_id": node.node_id}

    def message(self, owner: _Node | _Driver, msg: Message) -> None:
        op = msg.get("op")
        if isinstance(owner, _Driver):
            if op == "place":
                self._place(owner, msg)
            elif op == "signal":
                for node in self.nodes.values():
                    if owner.job in node.used:
                        node.send({**msg, "job": owner.job})
            return
        if op in ("said", "exit"):
            if op == "exit":
                self.finished.add((msg.get("job"), msg.get("rank")))
            driver = self.drivers.get(msg.get("job", 0))
            if driver is not None:
                driver.link.send(msg)

    def ended(self, owner: _Node | _Driver, link: Link) -> None:
        """A driver gone ends its job's workers (as Ray does); a node gone gets the grace."""
        if isinstance(owner, _Driver):
            del self.drivers[owner.job]
            for node in self.nodes.values():
                if node.used.pop(owner.job, None) is not None:
                    node.send({"op": "signal", "job": owner.job, "ranks": None,
                               "signal": int(signal.SIGKILL)})
        elif owner.link is link:
            owner.lost_at = time.time()

    def tick(self) -> None:
        """A node that did not come back: its unfinished ranks end with LOST for their driver."""
        for node in list(self.nodes.values()):
            if node.lost_at is None or time.time() - node.lost_at <= cluster.RECONNECT_GRACE:
                continue
            del self.nodes[node.node_id]
            for (job, rank), where in self.placed.items():
                if where is node and (job, rank) not in self.finished:
                    self.finished.add((job, rank))
                    driver = self.drivers.get(job)
                    if driver is not None:
                        driver.link.send({"op": "exit", "job": job, "rank": rank,
                                          "code": cluster.LOST})

    def _place(self, driver: _Driver, msg: Message) -> None:
        """TP ranks over the nodes, head node first, as many per node as it has GPUs free;
        "short" when the cluster has too few (the driver waits and asks again)."""
        tp = int(msg["tp"])
        order = sorted((n for n in self.nodes.values() if n.lost_at is None),
                       key=lambda n: not n.head)
        if sum(n.free for n in order) < tp:
            driver.link.send({"op": "short", "gpus": sum(n.free for n in order)})
            return
        spawns: list[tuple[_Node, list[int]]] = []
        for node in order:
            take = min(node.free, tp - sum(len(r) for _, r in spawns))
            if take > 0:
                start = sum(len(r) for _, r in spawns)
                spawns.append((node, list(range(start, start + take))))
        driver.link.send({"op": "placed", "nodes": [[n.ip, ranks] for n, ranks in spawns]})
        for node, ranks in spawns:
            first_gpu = node.gpus - node.free
            node.used[driver.job] = len(ranks)
            self.placed.update(((driver.job, r), node) for r in ranks)
            node.send({"op": "spawn", "job": driver.job, "ranks": ranks, "first_gpu": first_gpu,
                       "config": msg["config"]})


class RayNode(NodeAgent):
    """A node of the cluster (the head's too): Ray's workers leave its session."""

    title = "ray::RayWorkerWrapper"
    new_session = True
    connect_timeout = cluster.RAY_CONNECT_TIMEOUT

    def joined(self) -> None:
        address = f"{self.head[0]}:{self.head[1]}"
        text = "\n--------------------\nRay runtime started.\n--------------------\n\n"
        if self.hello["head"]:
            text += ("Next steps\n  To add another node to this Ray cluster, run\n"
                     f"    ray start --address='{address}'\n\n"
                     "  To connect to this Ray cluster:\n    import ray\n    ray.init()\n\n"
                     "  To terminate the Ray runtime, run\n    ray stop\n\n"
                     "  To view the status of the cluster, use\n    ray status\n\n")
        else:
            text += "To terminate the Ray runtime, run\n  ray stop\n\n"
        self.log.raw(text + BLOCK_NOTICE)

    def lost(self) -> None:
        self.log.raw(f"Lost the connection to the GCS at {self._head}; reconnecting for up to "
                     f"{cluster.RECONNECT_GRACE:.0f} seconds.\n")

    def failed(self, why: str) -> None:
        self.log.raw(f"{why}\nSome Ray subprocesses exited unexpectedly:\n"
                     "  raylet [exit code=1]\nRemaining processes will be killed.\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tui.sim.ray", allow_abbrev=False,
                                     description="Simulated `ray start` (simulation only).")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", allow_abbrev=False, help="behave like `ray start`")
    role = start.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true")
    role.add_argument("--address", help="HOST:PORT of the head")
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--node-ip-address", default="127.0.0.1")
    start.add_argument("--num-gpus", type=int)
    start.add_argument("--block", action="store_true", help="(the simulation always blocks)")
    start.add_argument("--sim-scenario", choices=SCENARIOS,
                       help="the scenario of this node's workers (default: the driver's)")
    start.add_argument("--sim-gpu-state", help="fake NVML state dir (default: "
                       f"${gpu_state.STATE_ENV} or ~/.specconsole/sim-gpus)")
    args = parser.parse_args(argv)
    if args.address is not None and ":" not in args.address:
        start.error(f"--address must be HOST:PORT, not {args.address!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clock = SimClock(time.time(), 1.0)
    rt = Runtime(clock)
    log = SimLog("ray", clock, prefix="")
    state = gpu_state.state_dir(args.sim_gpu_state)
    devices = gpu_state.ensure_devices(state, args.num_gpus or 8)
    gpus = devices if args.num_gpus is None else args.num_gpus
    ip = args.node_ip_address
    log.raw(f"Local node IP: {ip}\n")
    if args.head:
        try:
            listener = socket.create_server(("", args.port))
        except OSError as exc:
            log.raw(f"Failed to start the GCS on port {args.port}: {exc.strerror}. You can use "
                    "`ray start --port` to specify a different port.\n")
            return 1
        threading.Thread(target=cluster.serve, args=(listener, {}, Gcs()), daemon=True).start()
        head = (ip, args.port)
    else:
        host, _, port = args.address.rpartition(":")
        head = (host, int(port))
    hello = {"op": "hello", "role": "node", "ip": ip, "gpus": gpus, "head": args.head}
    local = {"python": runtime.this_python(), "gpu_state": state, "gpus": max(1, devices),
             "scenario": args.sim_scenario, "ray_ip": ip}
    return RayNode(head, hello, local, rt, log).run()


if __name__ == "__main__":
    sys.exit(main())
