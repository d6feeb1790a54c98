"""A node of a server over several hosts: joins the head, runs its ranks, relays them.

`NodeAgent` is the node side of the protocol in `tui/sim/cluster.py`, shared by vLLM's headless
node (`HeadlessNode`, `python -m tui.sim.engine serve ... --headless`) and Ray's nodes
(`tui/sim/ray.py`). Its workers are the usual `tui/sim/worker.py`, with this node's GPUs (its
own --sim-gpu-state) and, when given, its own --sim-scenario.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import time

from tui.sim import failures, gpu_state, lines, runtime
from tui.sim import timeline as tl
from tui.sim.cluster import (
    RECONNECT_GRACE,
    RETRY,
    SRC_NODES,
    Link,
    Message,
    Options,
    connect,
)
from tui.sim.runtime import Runtime, SimClock, Terminated
from tui.sim.simlog import SimLog

RENDEZVOUS_TIMEOUT = 600.0  # a headless node waits this long for its head (torch's default)

SRC_HEADLESS = "serve.py:216"
SRC_HEADLESS_EXIT = "serve.py:247"


class _Proc:
    """A worker this node spawned."""

    def __init__(self, job: int, rank: int, proc: subprocess.Popen[bytes], fd: int,
                 go_fd: int) -> None:
        self.job = job
        self.rank = rank
        self.proc = proc
        self.fd = fd
        self.go_fd = go_fd  # where the rendezvous's shift goes (-1: none to wait for)
        self.buffer = b""
        self.reported = False


class NodeAgent:
    """A node: joins its head, runs the ranks it is given, relays what they say and how they
    end. One thread on purpose: PR_SET_PDEATHSIG follows the thread that spawned a worker.

    Subclasses say how the node speaks (`joined`, `lost`, `failed`, `stopping`) and how its
    workers are started (`title`, `new_session`, `connect_timeout`)."""

    title = "VLLM::Worker_TP{rank}"
    new_session = False
    connect_timeout = RENDEZVOUS_TIMEOUT

    def __init__(self, head: tuple[str, int], hello: Message, local: Message, rt: Runtime,
                 log: SimLog) -> None:
        self.head = head
        self.hello = hello
        self.local = local  # merged into each worker's config: python, gpu_state, gpus, ...
        self.rt = rt
        self.log = log
        self.link: Link | None = None
        self.welcome: Message | None = None
        self.sent: list[Message] = []
        self.workers: dict[tuple[int, int], _Proc] = {}
        self.lost_at = 0.0
        self.retry_at: float | None = None
        self.patched: str | None = None

    @property
    def _head(self) -> str:
        return f"{self.head[0]}:{self.head[1]}"

    def joined(self) -> None:
        """The coordinator welcomed this node for the first time."""

    def lost(self) -> None:
        """The connection to the head ended; reconnecting for RECONNECT_GRACE seconds."""

    def failed(self, why: str) -> None:
        """This node gives up and exits 1."""

    def stopping(self) -> None:
        """The head said shutdown."""

    def run(self) -> int:
        try:
            return self._run()
        except Terminated:
            return 0
        finally:
            self._stop_workers()
            if self.patched:
                failures.remove_patched_model(self.patched)

    def _run(self) -> int:
        self.link = connect(self.head, self.rt, time.time() + self.connect_timeout)
        if self.link is None:
            self.failed(f"Could not reach the head at {self._head} within "
                        f"{self.connect_timeout:.0f} s.")
            return 1
        self.link.send(self.hello)
        while True:
            fds = [w.fd for w in self.workers.values() if w.fd >= 0]
            link = self.link
            ready = self.rt.wait([*fds, link.fileno()] if link else fds, until=self.retry_at)
            for worker in [w for w in self.workers.values() if w.fd in ready]:
                self._drain(worker)
            if link is not None and link.fileno() in ready:
                msgs = link.read()
                if msgs is None:
                    self._lose()
                for msg in msgs or []:
                    if (code := self._handle(msg)) is not None:
                        return code
            if self.retry_at is not None and time.time() >= self.retry_at:
                if time.time() - self.lost_at > RECONNECT_GRACE:
                    self.failed(f"The head at {self._head} did not come back within "
                                f"{RECONNECT_GRACE:.0f} s.")
                    return 1
                self._reconnect()

    def _lose(self) -> None:
        assert self.link is not None
        self.link.close()
        self.link = None
        self.lost_at = time.time()
        self.retry_at = self.lost_at
        self.lost()

    def _reconnect(self) -> None:
        """One attempt; the hello says which run this node belongs to, then it replays."""
        try:
            link = Link(socket.create_connection(self.head, timeout=2.0))
        except OSError:
            self.retry_at = time.time() + RETRY
            return
        self.link, self.retry_at = link, None
        link.send({**self.hello, "resume": self.welcome} if self.welcome else self.hello)
        for msg in self.sent:
            link.send(msg)

    def _send(self, msg: Message) -> None:
        self.sent.append(msg)
        if self.link is not None:
            self.link.send(msg)

    def _handle(self, msg: Message) -> int | None:
        """Act on one message from the head; an exit code when this node is done."""
        op = msg.get("op")
        if op == "welcome":
            first, self.welcome = self.welcome is None, msg
            if first:
                self.joined()
        elif op == "reject":
            self.failed(f"The head at {self._head} refused this node: {msg.get('reason')}.")
            return 1
        elif op == "spawn":
            self._spawn(msg)
        elif op == "signal":
            ranks = msg.get("ranks")
            for w in self.workers.values():
                if w.job == msg.get("job") and (ranks is None or w.rank in ranks) \
                        and w.proc.poll() is None:
                    w.proc.send_signal(int(msg["signal"]))
        elif op == "go":
            for w in self.workers.values():
                if w.job == msg.get("job") and w.go_fd >= 0:
                    with contextlib.suppress(OSError):  # it died meanwhile
                        os.write(w.go_fd, repr(float(msg["shift"])).encode())
                    os.close(w.go_fd)
                    w.go_fd = -1
        elif op == "shutdown":
            self.stopping()
            return 0
        return None

    def _spawn(self, msg: Message) -> None:
        """Start the ranks (a replayed spawn starts nothing twice), waiting for the `go` of a
        rendezvous if asked; this node's --sim-scenario, if any, overrides the driver's, and a
        syntax error needs its own broken model file."""
        config, job = msg["config"], msg["job"]
        scenario = self.local.get("scenario") or config["scenario"]
        if scenario == "syntax-error" and self.patched is None:
            self.patched = failures.write_patched_model(lines.architecture(config["model"]))
        for index, rank in enumerate(msg["ranks"], msg.get("first_gpu", 0)):
            if (job, rank) in self.workers:
                continue
            read_fd, write_fd = os.pipe()
            go_read, go_write = os.pipe() if msg.get("rendezvous") else (None, -1)
            child = {**config, **self.local, "scenario": scenario, "rank": rank,
                     "gpu": index % self.local["gpus"], "local_rank": index,
                     "patched_model": self.patched, "status_fd": write_fd, "go_fd": go_read}
            fds = [write_fd] if go_read is None else [write_fd, go_read]
            proc = runtime.spawn(self.title.format(rank=rank), "tui.sim.worker", child,
                                 pass_fds=fds, new_session=self.new_session)
            for fd in fds:
                os.close(fd)
            self.workers[(job, rank)] = _Proc(job, rank, proc, read_fd, go_write)

    def _drain(self, worker: _Proc) -> None:
        data = os.read(worker.fd, 4096)
        if data:
            worker.buffer += data
            *said, worker.buffer = worker.buffer.split(b"\n")
            for text in said:
                self._send({"op": "said", "job": worker.job, "rank": worker.rank,
                            "msg": text.decode()})
            return
        os.close(worker.fd)
        worker.fd = -1
        self._report(worker, worker.proc.wait())

    def _report(self, worker: _Proc, code: int) -> None:
        if not worker.reported:
            worker.reported = True
            self._send({"op": "exit", "job": worker.job, "rank": worker.rank, "code": code})

    def _stop_workers(self) -> None:
        """TERM every live worker (Ray's left this node's session: nothing else reaches them),
        KILL what is left after 0.5 s, and tell the head how each ended."""
        live = [w for w in self.workers.values() if w.proc.poll() is None]
        for worker in live:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.terminate()
        deadline = time.time() + 0.5
        for worker in live:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
        for worker in self.workers.values():
            if worker.fd >= 0:
                os.close(worker.fd)
                worker.fd = -1
            self._report(worker, worker.proc.wait())


class HeadlessNode(NodeAgent):
    """`vllm serve --headless --node-rank R`: no API server, no engine core, only its ranks;
    vLLM's headless process does not prefix its own lines."""

    def lost(self) -> None:
        self.log.error(SRC_NODES, f"Lost the connection to the head node {self._head}; waiting "
                       f"up to {RECONNECT_GRACE:.0f} s for it to come back.")

    def failed(self, why: str) -> None:
        self.log.error(SRC_NODES, f"{why} Shutting down.")

    def stopping(self) -> None:
        self.log.info(SRC_HEADLESS_EXIT, "Shutting down.")


def run_headless(args: argparse.Namespace, opts: Options, scenario: str | None) -> int:
    """A headless node of the native multi-node launch (see the module docstring)."""
    clock = SimClock(time.time(), args.sim_time_scale)
    rt = Runtime(clock)
    log = SimLog("headless", clock, prefix="")
    state = gpu_state.state_dir(args.sim_gpu_state)
    gpus = gpu_state.ensure_devices(state, args.sim_gpus)
    head = (opts.master_addr, opts.master_port)
    log.info(SRC_HEADLESS, f"Launching vLLM (v{tl.VERSION}) headless multiproc executor, with "
             f"head node address {head[0]}:{head[1]} for torch.distributed process group.")
    hello = {"op": "hello", "role": "node", "node_rank": opts.node_rank}
    local = {"python": runtime.this_python(), "gpu_state": state, "gpus": gpus,
             "scenario": scenario}
    return HeadlessNode(head, hello, local, rt, log).run()
