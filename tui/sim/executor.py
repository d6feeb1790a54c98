"""The engine core's side of a server over several hosts (see `tui/sim/cluster.py`).

Native: the engine core listens on the master port, and each node that joins gets its ranks at
once (they wait at the rendezvous for `go`). Ray: the engine core is a driver of the Ray head at
$RAY_ADDRESS and has it place every rank, waiting for GPUs as vLLM waits for its placement group;
on a real Ray cluster ($SPECCONSOLE_SIM_REAL_RAY=1) the ranks are real Ray actors instead
(`tui/sim/ray_actors.py`).
Either way each remote rank is a `RemoteRank`, which the engine core follows like a local
worker's Popen and status pipe.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

from tui.sim import timeline as tl
from tui.sim.cluster import (
    LOST,
    RAY_CONNECT_TIMEOUT,
    RECONNECT_GRACE,
    RETRY,
    SRC_NODES,
    Link,
    Message,
    Options,
    Peer,
    connect,
    serve,
)
from tui.sim.remote_rank import RemoteRank
from tui.sim.runtime import Runtime, SimClock
from tui.sim.simlog import SimLog

REAL_RAY_ENV = "SPECCONSOLE_SIM_REAL_RAY"  # as tui.sim.ray_actors.REAL_RAY_ENV
PG_WAIT_TIMEOUT = 60  # simulated seconds vLLM waits for a placement group (as in vLLM 0.4)
# the fields of the engine core's config that every rank shares; each node adds its own
SHARED = ("t0", "scale", "shift", "scenario", "model", "tp", "spec", "max_model_len",
          "gpu_util", "dist_host", "dist_port")

SRC_PG = "ray_utils.py:392"
SRC_PG_WAIT = "ray_utils.py:274"


class DistNetworkError(RuntimeError):
    """Stands in for torch.distributed.DistNetworkError (the rendezvous port is taken)."""


DistNetworkError.__module__ = "torch.distributed"


class Executor:
    """The engine core's side of a cluster (see the module docstring); `serve` runs its relay."""

    def __init__(self, opts: Options, rt: Runtime, log: SimLog, clock: SimClock) -> None:
        self.opts = opts
        self.rt = rt
        self.log = log
        self.clock = clock
        self.session = f"{os.getpid()}-{time.time():.6f}"
        self.peers: dict[int, Peer] = {}  # native: node rank -> node; Ray: 0 -> the Ray head
        self.ranks: dict[int, RemoteRank] = {}
        self.job = 0
        self.shared: Message = {}  # the worker config a joining node's ranks start with
        self.formed = False
        self._joined = -1  # the join's wake-up pipe, written once the last node said hello

    @classmethod
    def open(cls, cfg: Message, rt: Runtime, log: SimLog, clock: SimClock) -> Executor | None:
        opts = cfg.get("cluster")
        return cls(Options(**opts), rt, log, clock) if opts else None

    def start(self, cfg: Message) -> tuple[range, list[RemoteRank]]:
        """Join the nodes (native) or have the Ray head place the ranks, and start the remote
        ranks; returns the ranks this host runs itself and the remote ones. The schedule of `cfg`
        and of the clock is shifted so that every rank begins it at WORKERS_SPAWN together,
        however long the join took."""
        if self.opts.ray:
            self._place(cfg)
            return range(0), list(self.ranks.values())
        cfg.update(dist_host=self.opts.master_addr, dist_port=self.opts.master_port, shift=0.0)
        self.shared = {k: cfg[k] for k in SHARED}
        self._join()
        self.shift_schedule(cfg)
        for peer in self.peers.values():
            peer.send({"op": "go", "job": self.job, "shift": cfg["shift"]})
        return range(self._per_node), list(self.ranks.values())

    @property
    def _per_node(self) -> int:
        return int(self.shared["tp"]) // self.opts.nnodes

    def close(self) -> None:
        """This engine core exits: native nodes stop their workers and exit 0 (the Ray head
        stops the workers of a driver that disconnects)."""
        if not self.opts.ray:
            for peer in self.peers.values():
                peer.send({"op": "shutdown"})

    def shift_schedule(self, cfg: Message) -> None:
        """Now is WORKERS_SPAWN on the schedule (the stamps go on: see `SimClock`)."""
        since_launch = (time.time() - self.clock.t0) * self.clock.scale
        self.clock.shift = cfg["shift"] = since_launch - tl.WORKERS_SPAWN

    def _join(self) -> None:
        """Listen on the master port (all addresses) until the N-1 other nodes said hello."""
        port = self.opts.master_port
        try:
            listener = socket.create_server(("0.0.0.0", port))
        except OSError as exc:
            code = exc.errno or 0
            raise DistNetworkError(
                "The server socket has failed to listen on any local network address. "
                f"port: {port}, useIpv6: false, code: {-code}, "
                f"name: {errno.errorcode.get(code, '?')}, message: {exc.strerror}") from None
        joined, self._joined = os.pipe()
        threading.Thread(target=serve, args=(listener, {}, self), daemon=True).start()
        self.rt.wait([joined])
        self.formed = True

    def _place(self, cfg: Message) -> None:
        """Connect to the Ray head as a driver and have it place the ranks, waiting for GPUs
        as vLLM waits for its placement group (then failing like vLLM)."""
        if os.environ.get(REAL_RAY_ENV) == "1":  # a real Ray cluster: ranks as Ray actors
            from tui.sim import ray_actors

            self.ranks = ray_actors.place(self, cfg)
            return
        address = os.environ.get("RAY_ADDRESS")
        if not address:
            raise ConnectionError(
                "Could not find any running Ray instance. Please specify the one to connect to "
                "by setting `--address` flag or `RAY_ADDRESS` environment variable.")
        host, _, port = address.rpartition(":")
        self._ray_line(f"Connecting to existing Ray cluster at address: {address}...")
        link = connect((host, int(port)), self.rt, time.time() + RAY_CONNECT_TIMEOUT)
        if link is None:
            raise ConnectionError(f"Failed to connect to GCS at address {address} within "
                                  f"{RAY_CONNECT_TIMEOUT:.0f} seconds.")
        peer = self.peers[0] = Peer(link, f"the Ray cluster at {address}")
        link.send({"op": "hello", "role": "driver"})
        self.job = self._ask(link, "welcome")["job"]
        self._ray_line("Connected to Ray cluster.")
        tp = cfg["tp"]
        self.ranks = {r: RemoteRank(r, self.job, peer) for r in range(tp)}
        cfg["dist_host"] = host
        self.log.info(SRC_PG, "No current placement group found. Creating a new placement group.")
        specs = [{"GPU": 1.0, f"node:{host}": 0.001}, *[{"GPU": 1.0}] * (tp - 1)]
        started, interval = time.time(), 10.0
        while True:
            self.shift_schedule(cfg)
            link.send({"op": "place", "tp": tp, "config": {k: cfg[k] for k in SHARED}})
            if self._ask(link, "placed", "short")["op"] == "placed":
                break
            if interval == 10.0:
                self.log.record("WARNING", SRC_PG, "The number of required GPUs exceeds the "
                                "total number of available GPUs in the placement group.")
            waited = int((time.time() - started) * self.clock.scale)
            if waited >= PG_WAIT_TIMEOUT:
                raise ValueError(
                    f"Cannot provide a placement group requiring {tp} GPUs "
                    f"(placement_group_specs={specs}) within {PG_WAIT_TIMEOUT} seconds.\n"
                    "Tensor parallel size may exceed available GPUs in your cluster. Check "
                    "resources with `ray status` and `ray list nodes`.\nIf running on K8s with "
                    "limited GPUs, consider reducing --tensor-parallel-size to match available "
                    "GPU resources.")
            self.rt.sleep_sim(interval, min_real=RETRY)
            interval *= 2
            self.log.info(SRC_PG_WAIT, (
                "Waiting for creating a placement group of specs for "
                f"{int((time.time() - started) * self.clock.scale)} seconds. specs={specs}. "
                "Check `ray status` and `ray list nodes` to see if you have enough resources, "
                "and make sure the IP addresses used by ray cluster are the same as "
                "VLLM_HOST_IP environment variable specified in each node if you are running "
                "on a multi-node."))
        threading.Thread(target=serve, args=(None, {link: peer}, self), daemon=True).start()

    def _ask(self, link: Link, *ops: str) -> Message:
        """The Ray head's next answer among `ops` (other messages are rank updates)."""
        while True:
            self.rt.wait([link.fileno()])
            msgs = link.read()
            if msgs is None:
                raise ConnectionError(f"Lost the connection to the Ray cluster at {link.peer}.")
            for i, msg in enumerate(msgs):
                if msg.get("op") in ops:
                    for later in msgs[i + 1:]:
                        self.message(None, later)
                    return msg
                self.message(None, msg)

    def _ray_line(self, text: str) -> None:
        """Ray's own logger, as its lines show up in vLLM's output."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        self.log.line(f"{stamp},{int(time.time() * 1000) % 1000:03d}\tINFO worker.py:1832 -- "
                      f"{text}")

    # Handler, on the relay thread
    def greet(self, link: Link, msg: Message) -> Peer | None:
        """A native node's hello: a new node while the cluster forms, or one coming back."""
        node = msg.get("node_rank")
        peer = self.peers.get(node) if isinstance(node, int) else None
        welcome = {"op": "welcome", "session": self.session}
        resume = msg.get("resume")
        if msg.get("op") != "hello":
            problem: str | None = "expected a hello"
        elif resume:
            problem = None if peer is not None and resume.get("session") == self.session \
                else "this head does not know that node's run"
        elif not isinstance(node, int) or not 0 < node < self.opts.nnodes:
            problem = f"node rank {node!r} is not in 1..{self.opts.nnodes - 1}"
        elif peer is not None or self.formed:
            problem = f"node rank {node} has already joined"
        else:
            problem = None
        if problem is not None:
            link.send({"op": "reject", "reason": problem})
            return None
        if peer is not None:
            self.log.info(SRC_NODES, f"Node {node} ({link.peer}) is back.")
            peer.resume(link, welcome)
            return peer
        assert isinstance(node, int)
        peer = self.peers[node] = Peer(link, f"node {node} ({link.peer})")
        link.send(welcome)
        ranks = list(range(node * self._per_node, (node + 1) * self._per_node))
        self.ranks.update((r, RemoteRank(r, self.job, peer)) for r in ranks)
        peer.send({"op": "spawn", "job": self.job, "ranks": ranks, "config": self.shared,
                   "rendezvous": True})
        if len(self.peers) == self.opts.nnodes - 1:
            os.write(self._joined, b"j")
        return peer

    def message(self, owner: Peer | None, msg: Message) -> None:
        rank = self.ranks.get(msg.get("rank", -1))
        if rank is None:
            return
        if msg.get("op") == "said":
            rank.said(str(msg.get("msg")))
        elif msg.get("op") == "exit":
            rank.ended(int(msg.get("code", LOST)))

    def ended(self, owner: Peer, link: Link) -> None:
        if owner.link is not link:
            return
        if self.opts.ray:
            self._lose(owner)
            return
        owner.lost_at = time.time()
        self.log.error(SRC_NODES, f"Lost the connection to {owner.name}; waiting up to "
                       f"{RECONNECT_GRACE:.0f} s for it to come back.")

    def tick(self) -> None:
        for node, peer in list(self.peers.items()):
            if peer.lost_at is not None and time.time() - peer.lost_at > RECONNECT_GRACE:
                del self.peers[node]
                self._lose(peer)

    def _lose(self, peer: Peer) -> None:
        self.log.error(SRC_NODES, f"Gave up on {peer.name}: its workers count as dead.")
        for rank in self.ranks.values():
            if rank.peer is peer:
                rank.ended(LOST)

