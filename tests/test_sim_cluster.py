"""The simulated engine over two "hosts" of this machine (tui/sim/cluster.py, tui/sim/ray.py):
vLLM's native multi-node launch and a Ray cluster, each node with its own fake GPUs and log.

Every process gets this test's SPECCONSOLE_RUN_ID; Ray's workers leave their node's session, so
killing process groups is not enough: the fixture also kills whatever still carries the id.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import RUN_ID_ENV, carriers, free_port, wait_for
from test_sim import gpu_holders, in_order, load_fake_nvml

from tui.sim.cluster import parse_options

ROOT = Path(__file__).resolve().parent.parent
MODEL = "/models/Kimi-K2.5"
SCALE = 300.0  # the simulated load takes about 5 s
GIB = 1024**3
SYNTAX_ERROR = "SyntaxError: trailing comma not allowed without surrounding parentheses"


class Cluster:
    """The processes of one test, each with its own log file under tmp_path."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.run_id = f"sim-cluster-{uuid.uuid4().hex}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(self.tmp),
               RUN_ID_ENV: self.run_id, **(env or {})}
        with open(self.tmp / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.tmp, env=env, start_new_session=True)
        return self.procs[name]

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def wait_log(self, name: str, text: str, timeout: float = 30) -> str:
        return wait_for(lambda: text in (log := self.log(name)) and log, timeout, repr(text))

    def gpus(self, host: str) -> Path:
        return self.tmp / f"gpus-{host}"

    def serve(self, host: str, port: int, scenario: str, *cluster: str) -> list[str]:
        """The command line the launcher emits for one host of the server."""
        return ["-m", "tui.sim.engine", "serve", MODEL, "--port", str(port),
                "--tensor-parallel-size", "4", *cluster, "--sim-scenario", scenario,
                "--sim-time-scale", str(SCALE), "--sim-gpus", "2",
                "--sim-gpu-state", str(self.gpus(host))]

    def ray(self, host: str, *how: str) -> list[str]:
        return ["-m", "tui.sim.ray", "start", *how, "--node-ip-address=127.0.0.1",
                "--num-gpus", "2", "--block", "--sim-gpu-state", str(self.gpus(host))]

    def terminate_all(self) -> None:
        """SIGTERM to each top process: each must end and take its workers along."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            assert proc.wait(timeout=15) is not None, name
        wait_for(lambda: not carriers(self.run_id), 5, "no process of the run left")

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for pid in carriers(self.run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    group = Cluster(tmp_path)
    try:
        yield group
    finally:
        group.close()


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def native(master: int, rank: int) -> list[str]:
    out = ["--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1",
           "--master-port", str(master)]
    return [*out, "--headless"] if rank else out


def held(monkeypatch: pytest.MonkeyPatch, state: Path) -> dict[int, tuple[int, list[int]]]:
    """{gpu: (used bytes, holder pids)} in one host's fake NVML."""
    found = gpu_holders(load_fake_nvml(monkeypatch, state))
    return {gpu: (used, [pid for pid, _ in procs]) for gpu, (used, procs) in found.items()}


def titled(proc: psutil.Process) -> list[tuple[str, psutil.Process]]:
    return sorted(((p.cmdline()[0], p) for p in proc.children()), key=lambda t: (t[0], t[1].pid))


def test_native_two_nodes_reach_ready_each_with_its_ranks_gpus_and_log(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    port, master = free_port(), free_port()
    head = cluster.start("head", cluster.serve("a", port, "ready", *native(master, 0)))
    node = cluster.start("node", cluster.serve("b", port, "ready", *native(master, 1)))
    wait_for(lambda: health(port) == 200, 60, "/health 200")

    (core,) = psutil.Process(head.pid).children()
    assert core.cmdline()[0] == "VLLM::EngineCore_DP0"
    local = titled(core)
    remote = titled(psutil.Process(node.pid))
    assert [t for t, _ in local] == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
    assert [t for t, _ in remote] == ["VLLM::Worker_TP2", "VLLM::Worker_TP3"]
    assert {os.getpgid(p.pid) for _, p in remote} == {node.pid}  # the node's own children

    head_log, node_log = cluster.log("head"), cluster.log("node")
    assert "'nnodes': 2, 'node_rank': 0, 'master_addr': '127.0.0.1'" in head_log
    assert node_log.startswith("INFO ")  # vLLM's headless process does not prefix its lines
    in_order(node_log, [
        "Launching vLLM (v0.16.1rc1+sim) headless multiproc executor, with head node address "
        f"127.0.0.1:{master} for torch.distributed process group.",
        f"(Worker_TP2 pid={remote[0][1].pid}) ",
        f"world_size=4 rank=2 local_rank=0 distributed_init_method=tcp://127.0.0.1:{master}"])
    assert f"world_size=4 rank=3 local_rank=1 distributed_init_method=tcp://127.0.0.1:{master}" \
        in node_log
    assert f"(Worker_TP1 pid={local[1][1].pid}) " in head_log
    assert "(Worker_TP2" not in head_log and "(Worker_TP0" not in node_log
    for host, workers in (("a", local), ("b", remote)):
        gpus = held(monkeypatch, cluster.gpus(host))
        assert [pids for _, pids in gpus.values()] == [[w.pid] for _, w in workers], host
        assert all(used > 100 * GIB for used, _ in gpus.values()), gpus

    cluster.terminate_all()
    assert head.returncode == 0 and node.returncode == 0
    for host in ("a", "b"):
        assert all(used == 0 for used, _ in held(monkeypatch, cluster.gpus(host)).values())


def test_ray_two_nodes_reach_ready_with_workers_in_sessions_of_their_own(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    port, ray_port = free_port(), free_port()
    ray_head = cluster.start("ray-head", cluster.ray("a", "--head", f"--port={ray_port}"))
    cluster.wait_log("ray-head", "Ray runtime started.")
    ray_node = cluster.start("ray-node", cluster.ray("b", f"--address=127.0.0.1:{ray_port}"))
    cluster.wait_log("ray-node", "Ray runtime started.")
    server = cluster.start("server", cluster.serve(
        "a", port, "ready", "--distributed-executor-backend", "ray"),
        env={"RAY_ADDRESS": f"127.0.0.1:{ray_port}"})
    wait_for(lambda: health(port) == 200, 60, "/health 200")

    (core,) = psutil.Process(server.pid).children()
    assert not core.children()  # every rank is a Ray worker
    marker = set(carriers(cluster.run_id))
    for name, top, host, ranks in (("ray-head", ray_head, "a", (0, 1)),
                                   ("ray-node", ray_node, "b", (2, 3))):
        workers = titled(psutil.Process(top.pid))
        assert [t for t, _ in workers] == ["ray::RayWorkerWrapper"] * 2, name
        for _, worker in workers:
            assert os.getsid(worker.pid) == os.getpgid(worker.pid) == worker.pid  # setsid
            assert worker.pid in marker  # found by the run's marker only
            assert Path(f"/proc/{worker.pid}/comm").read_text().strip() == "ray::RayWorkerW"
        log = cluster.log(name)
        for _, worker in workers:
            assert f"(RayWorkerWrapper pid={worker.pid}, ip=127.0.0.1) INFO " in log, name
        for rank in ranks:
            assert f"world_size=4 rank={rank} local_rank={rank % 2} " in log, name
        gpus = held(monkeypatch, cluster.gpus(host))
        assert sorted(p for _, pids in gpus.values() for p in pids) == \
            sorted(w.pid for _, w in workers)
    server_log = cluster.log("server")
    in_order(server_log, [f"Connecting to existing Ray cluster at address: 127.0.0.1:{ray_port}",
                          "Connected to Ray cluster.",
                          "No current placement group found. Creating a new placement group.",
                          "init engine (profile, create kv cache, warmup model) took"])
    assert "RayWorkerWrapper" not in server_log and "(Worker_TP" not in server_log

    cluster.terminate_all()
    assert server.returncode == ray_head.returncode == ray_node.returncode == 0


@pytest.mark.parametrize("backend", ["native", "ray"])
def test_a_syntax_error_given_to_the_second_node_only_fails_the_run_from_there(
        cluster: Cluster, backend: str) -> None:
    port, master = free_port(), free_port()
    if backend == "native":
        server = cluster.start("server", cluster.serve("a", port, "ready", *native(master, 0)))
        second = cluster.start("second", cluster.serve("b", port, "syntax-error",
                                                       *native(master, 1)))
    else:
        cluster.start("ray-head", cluster.ray("a", "--head", f"--port={master}"))
        cluster.wait_log("ray-head", "Ray runtime started.")
        second = cluster.start("second", [*cluster.ray("b", f"--address=127.0.0.1:{master}"),
                                          "--sim-scenario", "syntax-error"])
        cluster.wait_log("second", "Ray runtime started.")
        server = cluster.start("server", cluster.serve(
            "a", port, "ready", "--distributed-executor-backend", "ray"),
            env={"RAY_ADDRESS": f"127.0.0.1:{master}"})
    assert server.wait(timeout=60) == 1

    prefix = r"\(Worker_TP[23] pid=\d+\)" if backend == "native" \
        else r"\(RayWorkerWrapper pid=\d+, ip=127\.0\.0\.1\)"
    second_log = cluster.log("second")
    assert re.search(rf"^{prefix} ERROR .*\] {SYNTAX_ERROR}$", second_log, re.M), second_log
    assert re.search(rf'^{prefix} ERROR .*\]   File ".*/specconsole-sim-{second.pid}/'
                     r'kimi_k25_patched\.py", line \d+$', second_log, re.M)
    server_log = cluster.log("server")
    in_order(server_log, ["(EngineCore_DP0 pid=", "died unexpectedly (exit code: 1), shutting "
                          "down executor.", "EngineCore failed to start.",
                          "RuntimeError: Engine core initialization failed."])
    assert re.search(r"Worker proc Worker_TP[23] died unexpectedly \(exit code: 1\)", server_log)
    for head in ("server", "ray-head") if backend == "ray" else ("server",):
        assert "SyntaxError" not in cluster.log(head), head
    deaths = [json.loads(line) for line in
              (cluster.gpus("b") / "deaths.jsonl").read_text().splitlines()]
    assert {d["name"] for d in deaths} <= {"Worker_TP2", "Worker_TP3"} and deaths
    assert not (cluster.gpus("a") / "deaths.jsonl").exists()
    if backend == "native":  # the head's engine core told its node to shut down
        assert second.wait(timeout=15) == 0
        assert "Shutting down." in cluster.log("second")
    cluster.terminate_all()
    assert not (cluster.tmp / f"specconsole-sim-{second.pid}").exists()


def test_a_headless_node_comes_back_after_a_dropped_connection_then_gives_up(
        cluster: Cluster) -> None:
    """A fake head: the node reconnects with the session it was welcomed with, and once the head
    is gone for good it says so and exits 1 after the grace (10 s)."""
    port, master = free_port(), free_port()
    with socket.create_server(("127.0.0.1", master)) as listener:
        listener.settimeout(30)
        node = cluster.start("node", cluster.serve("b", port, "ready", *native(master, 1)))
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as reader:
            assert json.loads(reader.readline()) == {"op": "hello", "role": "node",
                                                     "node_rank": 1}
            conn.sendall(b'{"op": "welcome", "session": "s1"}\n')
            conn.shutdown(socket.SHUT_RDWR)
        again, _ = listener.accept()
        with again, again.makefile("rb") as reader:
            assert json.loads(reader.readline()) == {
                "op": "hello", "role": "node", "node_rank": 1,
                "resume": {"op": "welcome", "session": "s1"}}
            again.sendall(b'{"op": "welcome", "session": "s1"}\n')
    log = cluster.log("node")
    assert f"Lost the connection to the head node 127.0.0.1:{master}; waiting up to 10 s " \
        "for it to come back." in log
    assert node.poll() is None
    assert node.wait(timeout=20) == 1
    assert f"The head at 127.0.0.1:{master} did not come back within 10 s. Shutting down." \
        in cluster.log("node")


def test_a_ray_cluster_with_too_few_gpus_fails_the_way_vllm_does(cluster: Cluster) -> None:
    port, ray_port = free_port(), free_port()
    cluster.start("ray-head", cluster.ray("a", "--head", f"--port={ray_port}"))
    cluster.wait_log("ray-head", "Ray runtime started.")
    server = cluster.start("server", cluster.serve(
        "a", port, "ready", "--distributed-executor-backend", "ray"),
        env={"RAY_ADDRESS": f"127.0.0.1:{ray_port}"})
    assert server.wait(timeout=30) == 1
    in_order(cluster.log("server"), [
        "WARNING", "The number of required GPUs exceeds the total number of available GPUs in "
        "the placement group.", "Waiting for creating a placement group of specs for",
        "EngineCore failed to start.", "ValueError: Cannot provide a placement group requiring "
        "4 GPUs", "RuntimeError: Engine core initialization failed."])
    assert "RayWorkerWrapper" not in cluster.log("ray-head")  # nothing was placed
    cluster.terminate_all()


@pytest.mark.parametrize(("argv", "error"), [
    (["--nnodes", "2"], "--tensor-parallel-size 3 is not divisible by --nnodes 2"),
    (["--nnodes", "3", "--node-rank", "3"], "--node-rank 3 is not in 0..2"),
    (["--headless"], "--headless is for --node-rank 1 and up"),
])
def test_a_node_rank_or_tp_the_nodes_cannot_share_is_refused(
        argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_options(argv, tp=3)
    assert exited.value.code == 2 and error in capsys.readouterr().err
