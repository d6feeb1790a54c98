"""One simulated server over several hosts: its options, the node protocol, the relay loop.

vLLM spans hosts in two shapes; both are simulated with one protocol:
- native (`--nnodes N --node-rank R --master-addr A --master-port M`): the head's engine core
  (`executor.py`) listens on M and waits for the N-1 `--headless` nodes (`node.py`) to join
  (torch's rendezvous); node R runs ranks [R*TP/N, (R+1)*TP/N) as its `VLLM::Worker_TP<r>`s.
- Ray (`--distributed-executor-backend ray`, the nodes are `tui/sim/ray.py`): the engine core is
  a driver of the Ray head at $RAY_ADDRESS, which places the ranks over its registered nodes.

Protocol, JSON lines over TCP: a node says `hello`; its coordinator answers `welcome` (with a
session) or `reject`; then `spawn` (ranks, worker config) and `signal` (to some ranks) go to
the node, and `said` (a worker's status-pipe message, "kv" or "ready") and `exit` (its exit code)
come back, so the engine core treats a remote worker as a local one (`RemoteRank`, a Popen
look-alike whose messages arrive through a pipe). A native node's ranks start as soon as it
joins (their first lines say it joined) and wait for `go` (the schedule's shift, see
`SimClock`), sent once every node has joined: torch's rendezvous. `shutdown` ends a node when
its head exits.

Outages: there is no application heartbeat. TCP keepalive (idle 60 s, then 6 probes 10 s apart)
and a 120 s TCP_USER_TIMEOUT notice a dead peer, so a link down for ~15 s breaks nothing. A
connection that does end has RECONNECT_GRACE seconds to come back: the node reconnects with its
session and both sides replay what they sent (receivers ignore repeats). After that the node
stops its workers and exits 1, and the coordinator counts the node's ranks dead (exit code -1).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from tui.sim.runtime import Runtime

Message = dict[str, Any]

RECONNECT_GRACE = 10.0  # seconds a dropped connection has to come back
RETRY = 0.5  # seconds between connection attempts
RAY_CONNECT_TIMEOUT = 10.0  # a driver or a Ray node waits this long for the Ray head
LOST = -1  # the exit code of the ranks of a node that never came back
_TCP_OPTIONS = (("TCP_NODELAY", 1), ("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10),
                ("TCP_KEEPCNT", 6), ("TCP_USER_TIMEOUT", 120_000))

SRC_NODES = "multiproc_executor.py:143"


@dataclass(frozen=True)
class Options:
    """The multi-node options of `vllm serve`, with vLLM's names and defaults."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    headless: bool = False
    distributed_executor_backend: str | None = None

    @property
    def ray(self) -> bool:
        return self.distributed_executor_backend == "ray"

    def engine_config(self) -> Message | None:
        """What the engine core needs to know (None: everything runs on this host)."""
        return asdict(self) if self.ray or self.nnodes > 1 else None


def parse_options(extra: list[str], tp: int) -> Options:
    """Read them from the options the serve parser left over (so that "non-default args" shows
    them as vLLM does); exit 2 on a rank outside the cluster or a TP the nodes cannot share."""
    parser = argparse.ArgumentParser(prog="python -m tui.sim.engine serve", add_help=False,
                                     allow_abbrev=False)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29501)
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--distributed-executor-backend")
    opts = Options(**vars(parser.parse_known_args(extra)[0]))
    if not 0 <= opts.node_rank < opts.nnodes:
        parser.error(f"--node-rank {opts.node_rank} is not in 0..{opts.nnodes - 1} "
                     f"(--nnodes {opts.nnodes})")
    if tp % opts.nnodes:
        parser.error(f"--tensor-parallel-size {tp} is not divisible by --nnodes {opts.nnodes}: "
                     "every node hosts the same number of ranks")
    if opts.headless and opts.node_rank == 0:
        parser.error("--headless is for --node-rank 1 and up: node 0 runs the API server")
    return opts


def explicit_scenario(argv: list[str]) -> str | None:
    """The --sim-scenario written on a node's command line (None: its workers play the
    scenario of the head that spawns them)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--sim-scenario")
    scenario: str | None = parser.parse_known_args(argv)[0].sim_scenario
    return scenario


# ----------------------------------------------------------------------------- links


class Link:
    """One JSON-lines TCP connection; sends are thread-safe, one thread reads."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _TCP_OPTIONS:
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        self.sock = sock
        host, port = sock.getpeername()[:2]
        self.peer = f"{host}:{port}"
        self._buffer = b""
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: Message) -> None:
        """Best effort: a failed send shows up as the end of the connection on the read side."""
        data = (json.dumps(msg) + "\n").encode()
        with self._lock, contextlib.suppress(OSError):
            self.sock.sendall(data)

    def read(self) -> list[Message] | None:
        """The whole messages readable now; None once the connection has ended (or spoke
        something other than the protocol)."""
        try:
            data = self.sock.recv(65536)
            if not data:
                return None
            self._buffer += data
            *whole, self._buffer = self._buffer.split(b"\n")
            msgs = [json.loads(line) for line in whole if line]
        except (OSError, ValueError):
            return None
        return msgs if all(isinstance(m, dict) for m in msgs) else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def connect(address: tuple[str, int], rt: Runtime, until: float) -> Link | None:
    """Connect, retrying until the peer listens (as torch's rendezvous does) or epoch `until`."""
    while True:
        try:
            return Link(socket.create_connection(address, timeout=2.0))
        except OSError:
            if time.time() >= until:
                return None
            rt.wait(until=min(until, time.time() + RETRY))


class Peer:
    """A node as its coordinator sees it: its link (replaced when the node comes back) and
    what was sent to it, replayed then."""

    def __init__(self, link: Link, name: str) -> None:
        self.link = link
        self.name = name
        self.sent: list[Message] = []
        self.lost_at: float | None = None
        self._lock = threading.Lock()

    def send(self, msg: Message) -> None:
        with self._lock:
            self.sent.append(msg)
            self.link.send(msg)

    def resume(self, link: Link, welcome: Message) -> None:
        with self._lock:
            self.link, self.lost_at = link, None
            link.send(welcome)
            for msg in self.sent:
                link.send(msg)


class Handler(Protocol):
    """What `serve` calls, from its thread."""

    def greet(self, link: Link, msg: Message) -> Any: ...  # a new link's owner, None: drop it
    def message(self, owner: Any, msg: Message) -> None: ...
    def ended(self, owner: Any, link: Link) -> None: ...
    def tick(self) -> None: ...  # about every second


def serve(listener: socket.socket | None, owners: dict[Link, Any], handler: Handler) -> None:
    """Accept and read links forever (a daemon thread): each new link's first message goes to
    `handler.greet`, which names its owner; a link that takes over an owner's place (a node
    coming back) replaces the old one."""
    sel = selectors.DefaultSelector()
    if listener is not None:
        sel.register(listener, selectors.EVENT_READ)
    for link, owner in owners.items():
        sel.register(link, selectors.EVENT_READ, owner)

    def drop(link: Link) -> None:
        sel.unregister(link)
        link.close()

    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is listener:
                with contextlib.suppress(OSError):
                    sel.register(Link(listener.accept()[0]), selectors.EVENT_READ)
                continue
            link, owner = key.fileobj, key.data
            assert isinstance(link, Link)
            msgs = link.read()
            if msgs is None:
                drop(link)
                if owner is not None:
                    handler.ended(owner, link)
                continue
            for msg in msgs:
                if owner is not None:
                    handler.message(owner, msg)
                    continue
                owner = handler.greet(link, msg)
                if owner is None:
                    drop(link)
                    break
                for old in [k.fileobj for k in sel.get_map().values()
                            if k.data is owner and k.fileobj is not link]:
                    assert isinstance(old, Link)
                    drop(old)
                sel.modify(link, selectors.EVENT_READ, owner)
        handler.tick()


