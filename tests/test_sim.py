"""The simulated vLLM (tui/sim): real processes, real signals, real HTTP, the fake NVML.

Each test starts `python -m tui.sim.engine serve ...` in its own session with its own log, port,
TMPDIR and GPU state dir (parallel-safe), at a time scale that keeps it to a few seconds, and
kills the whole process group in a finally.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest
from helpers import alive, free_port, wait_for

from tui.sim import FAKENVML_DIR, runtime, timeline
from tui.sim.failures import BROKEN_LINE

ROOT = Path(__file__).resolve().parent.parent
MODEL = "/models/Kimi-K2.5"
SPEC = {"method": "eagle3", "model": "/models/Kimi-K2.5-eagle3", "num_speculative_tokens": 5}
GIB = 1024**3
SEQ = re.compile(r" \[sim#(\d+)\]$")
PREFIX = re.compile(r"^\((\w+) pid=(\d+)\) ")





class Sim:
    """One simulated server, its log and its fake GPUs, in its own session."""

    def __init__(self, tmp_path: Path, scenario: str, scale: float, tp: int, gpus: int) -> None:
        self.port = free_port()
        self.state = tmp_path / "gpus"
        self.log_path = tmp_path / "server.log"
        argv = [sys.executable, "-m", "tui.sim.engine", *self.server_args(tp),
                "--sim-scenario", scenario, "--sim-time-scale", str(scale),
                "--sim-gpus", str(gpus), "--sim-gpu-state", str(self.state)]
        env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, cwd=tmp_path, env=env,
                                         start_new_session=True)

    def server_args(self, tp: int) -> list[str]:
        """The engine's own arguments: vLLM's, on self.port."""
        return ["serve", MODEL, "--port", str(self.port), "--tensor-parallel-size", str(tp),
                "--speculative-config", json.dumps(SPEC), "--trust-remote-code"]

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str, timeout: float) -> str:
        return wait_for(lambda: text in (log := self.log()) and log, timeout, repr(text))

    def get(self, path: str) -> tuple[int | None, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""
        except OSError:
            return None, b""

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=2) as r:
            return r.status, json.loads(r.read())

    def logged_pids(self) -> set[int]:
        """Every process that wrote a prefixed line."""
        return {int(m.group(2)) for ln in self.log().splitlines() if (m := PREFIX.match(ln))}

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    sims: list[Sim] = []

    def start(scenario: str, scale: float, tp: int = 2, gpus: int = 2) -> Sim:
        sims.append(Sim(tmp_path, scenario, scale, tp, gpus))
        return sims[-1]

    yield start
    for sim in sims:
        sim.kill_group()


def load_fake_nvml(monkeypatch: pytest.MonkeyPatch, state: Path) -> ModuleType:
    """A fresh copy of the fake pynvml (under another name: nvidia-ml-py is installed too)."""
    monkeypatch.setenv("SPECCONSOLE_SIM_GPU_STATE", str(state))
    spec = importlib.util.spec_from_file_location(f"fake_pynvml_{id(state)}",
                                                  Path(FAKENVML_DIR) / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def gpu_holders(nvml: ModuleType) -> dict[int, tuple[int, list[tuple[int, int]]]]:
    """{gpu: (used bytes, [(pid, bytes), ...])} as the fake NVML reports it now."""
    nvml.nvmlInit()
    try:
        out = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            out[i] = (nvml.nvmlDeviceGetMemoryInfo(handle).used,
                      [(p.pid, p.usedGpuMemory) for p in procs])
        return out
    finally:
        nvml.nvmlShutdown()


def vllm_proc(line: str) -> str:
    """The process of a vLLM line: its prefix's; unprefixed lines belong to the API server
    (uvicorn) or to Worker_TP0 (tqdm)."""
    prefix = PREFIX.match(line)
    return prefix.group(1) if prefix else ("APIServer" if line.startswith("INFO:  ")
                                           else "Worker_TP0")


def check_sequences(text: str, proc_of: Callable[[str], str] = vllm_proc
                    ) -> dict[str, list[int]]:
    """Per process (`proc_of` a line), the [sim#n] numbers in file order must be exactly 1..n:
    nothing lost or doubled."""
    seqs: dict[str, list[int]] = defaultdict(list)
    for line in text.splitlines():
        seq = SEQ.search(line)
        if seq is None:
            continue
        seqs[proc_of(line)].append(int(seq.group(1)))
    for proc, numbers in seqs.items():
        assert numbers == list(range(1, len(numbers) + 1)), proc
    return seqs


def in_order(text: str, markers: list[str]) -> None:
    at = 0
    for marker in markers:
        found = text.find(marker, at)
        assert found >= 0, f"{marker!r} missing or out of order"
        at = found + len(marker)


def test_ready_serves_is_named_like_vllm_and_sigterm_ends_the_tree(
        start_sim: Callable[..., Sim], monkeypatch: pytest.MonkeyPatch) -> None:
    sim = start_sim("ready", scale=1000)
    wait_for(lambda: sim.get("/health")[0] == 200, 15, "/health 200")
    log = sim.wait_log("SpecDecoding metrics: Mean acceptance length:", 5)
    in_order(log, [
        "version 0.16.1rc1+sim", "non-default args: {'model_tag': '/models/Kimi-K2.5'",
        "Resolved architecture: KimiK25ForConditionalGeneration",
        "(EngineCore_DP0 pid=", "<frozen importlib._bootstrap_external>:1301: FutureWarning: "
        "The cuda.cudart module is deprecated",
        "speculative_config=SpeculativeConfig(method='eagle3', "
        "model='/models/Kimi-K2.5-eagle3', num_spec_tokens=5)",
        "world_size=2 rank=", "Failed to import Triton kernels. Please make sure your triton "
        "version is compatible. Error: cannot import name 'SparseMatrix' from "
        "'triton_kernels.tensor'", "Starting to load model /models/Kimi-K2.5...",
        "Loading safetensors checkpoint shards:  50% Completed | 32/64 [",
        "Loading safetensors checkpoint shards: 100% Completed | 64/64 [",
        "Loading weights took", "Loading drafter model...",
        "Assuming the EAGLE head shares the same vocab embedding", "Model loading took",
        "torch.compile and initial profiling run took", "Available KV cache memory:",
        "GPU KV cache size:", "Maximum concurrency for 262,144 tokens per request:",
        "Capturing CUDA graphs (decode, FULL): 100%", "Graph capturing finished in",
        "init engine (profile, create kv cache, warmup model) took",
        "Supported tasks: ['generate']", f"Starting vLLM server on http://0.0.0.0:{sim.port}",
        f"INFO:     Started server process [{sim.proc.pid}]",
        "INFO:     Waiting for application startup.", "INFO:     Application startup complete.",
        "Engine 000: Avg prompt throughput:", "SpecDecoding metrics:"])
    assert "`torch_dtype` is deprecated!" in log

    status, models = sim.get("/v1/models")
    assert status == 200 and json.loads(models)["data"][0]["id"] == MODEL
    status, reply = sim.post("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 4})
    assert status == 200 and len(reply["choices"][0]["text"].split()) == 4
    status, metrics = sim.get("/metrics")
    drafts = re.search(rb"^vllm:spec_decode_num_drafts_total\{.*\} (\S+)$", metrics, re.M)
    assert status == 200 and drafts and float(drafts.group(1)) > 0
    assert b'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name=' \
           b'"/models/Kimi-K2.5",position="4"}' in metrics

    # The tree, named as vLLM names it: title in cmdline()[0], 15-char comm.
    top = psutil.Process(sim.proc.pid)
    (core,) = top.children()
    assert core.cmdline()[0] == "VLLM::EngineCore_DP0" and core.name() == "VLLM::EngineCore_DP0"
    assert Path(f"/proc/{core.pid}/comm").read_text().strip() == "VLLM::EngineCor"
    assert core.exe() == top.exe()  # still this Python
    workers = sorted(core.children(), key=lambda p: p.cmdline()[0])
    assert [w.cmdline()[0] for w in workers] == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
    assert {Path(f"/proc/{w.pid}/comm").read_text().strip() for w in workers} == \
        {"VLLM::Worker_TP"}
    tree = [top, core, *workers]
    assert {os.getpgid(p.pid) for p in tree} == {sim.proc.pid}
    assert f"(EngineCore_DP0 pid={core.pid}) " in log and f"(Worker_TP1 pid={workers[1].pid}) " \
        in log

    nvml = load_fake_nvml(monkeypatch, sim.state)
    held = gpu_holders(nvml)
    for gpu, worker in enumerate(workers):
        used, procs = held[gpu]
        assert procs == [(worker.pid, used)] and used > 100 * GIB

    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(timeout=30) == 0
    wait_for(lambda: not any(alive(p.pid) for p in tree), 10, "the tree to end")
    assert all(used == 0 and not procs for used, procs in gpu_holders(nvml).values())
    log = sim.log()
    assert log.rstrip().endswith(f"INFO:     Finished server process [{sim.proc.pid}] [sim#"
                                 f"{check_sequences(log)['APIServer'][-1]}]")


def test_syntax_error_worker_dies_first_with_pythons_own_traceback(
        start_sim: Callable[..., Sim], tmp_path: Path) -> None:
    sim = start_sim("syntax-error", scale=300)
    assert sim.proc.wait(timeout=10) == 1
    log = sim.log()
    lines = log.splitlines()
    where = next(i for i, ln in enumerate(lines) if "kimi_k25_patched.py\", line " in ln)
    found = re.search(r'^\((Worker_TP\d) pid=\d+\) ERROR .*\]   File "(.+)", line (\d+)$',
                      lines[where])
    assert found, lines[where]
    worker, path, line = found.groups()
    assert path == str(tmp_path / f"specconsole-sim-{sim.proc.pid}" / "kimi_k25_patched.py")
    assert int(line) > 1 and lines[where + 1].endswith("    " + BROKEN_LINE)
    assert re.search(rf"^\({worker} pid=\d+\) ERROR .*\] SyntaxError: trailing comma not "
                     "allowed without surrounding parentheses$", "\n".join(lines[where:]), re.M)
    in_order(log, [
        f"({worker} pid=", "WorkerProc failed to start.", "SyntaxError: ",
        "(EngineCore_DP0 pid=", "died unexpectedly (exit code: 1), shutting down executor.",
        "EngineCore failed to start.", "Exception: WorkerProc initialization failed",
        "Process EngineCore_DP0:\nTraceback (most recent call last):",
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}"])
    assert "Starting to load model" not in log
    assert not (tmp_path / f"specconsole-sim-{sim.proc.pid}").exists()
    assert not any(alive(pid) for pid in sim.logged_pids())
    check_sequences(log)


def test_oom_while_loading_weights(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("oom", scale=1000)
    assert sim.proc.wait(timeout=10) == 1
    log = sim.log()
    assert re.search(r"^\(Worker_TP1 pid=\d+\) ERROR .*\] torch\.OutOfMemoryError: CUDA out of "
                     r"memory\. Tried to allocate 3\.50 GiB\. GPU 1 has a total capacity", log,
                     re.M)
    in_order(log, ["Starting to load model", "| 40/64 [", "torch.OutOfMemoryError",
                   "Worker proc Worker_TP1 died unexpectedly (exit code: 1)",
                   "EngineCore failed to start.", "RuntimeError: Engine core initialization"])
    assert "Loading weights took" not in log
    assert not any(alive(pid) for pid in sim.logged_pids())


def test_engine_killed_health_503_then_exit_zero(start_sim: Callable[..., Sim]) -> None:
    sim = start_sim("engine-killed", scale=1000)
    wait_for(lambda: sim.get("/health")[0] == 200, 15, "/health 200")
    top = psutil.Process(sim.proc.pid)
    (core,) = top.children()
    workers = core.children()
    wait_for(lambda: sim.get("/health")[0] == 503, 10, "/health 503")
    assert sim.proc.poll() is None  # the API server still answers, its engine is gone
    assert not alive(core.pid)
    assert sim.proc.wait(timeout=10) == 0
    assert not any(alive(p.pid) for p in workers)
    in_order(sim.log(), [
        "Application startup complete.",
        "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        "INFO:     Application shutdown complete."])


def test_hang_freezes_log_and_memory_then_group_sigterm_leaves_nothing(
        start_sim: Callable[..., Sim], monkeypatch: pytest.MonkeyPatch) -> None:
    sim = start_sim("hang", scale=1000, tp=3, gpus=4)
    sim.wait_log("| 37/64 [", 10)
    nvml = load_fake_nvml(monkeypatch, sim.state)
    at = {shard: int(timeline.weights_gib(shard) * GIB) for shard in (30, 37)}
    hung = {0: at[37], 1: at[37], 2: at[30], 3: 0}  # TP2's GPU stopped 7 shards earlier
    wait_for(lambda: {g: used for g, (used, _) in gpu_holders(nvml).items()} == hung, 5,
             "every rank to reach its hang point")
    before, size = gpu_holders(nvml), sim.log_path.stat().st_size
    time.sleep(0.6)  # ~10 simulated minutes
    assert gpu_holders(nvml) == before and sim.log_path.stat().st_size == size
    tree = [psutil.Process(sim.proc.pid), *psutil.Process(sim.proc.pid).children(recursive=True)]
    assert len(tree) == 5 and all(alive(p.pid) for p in tree)

    os.killpg(sim.proc.pid, signal.SIGTERM)
    assert sim.proc.wait(timeout=5) == 0
    wait_for(lambda: not any(alive(p.pid) for p in tree), 1.0, "the group to end")
    assert all(used == 0 for used, _ in gpu_holders(nvml).values())
    assert not [f for f in sim.state.iterdir() if f.name.startswith("holder-")]


def test_killing_only_the_api_server_takes_its_children_along(
        start_sim: Callable[..., Sim]) -> None:
    """PR_SET_PDEATHSIG: unlike a real vLLM, the simulation never leaves orphans behind."""
    sim = start_sim("ready", scale=60)
    top = psutil.Process(sim.proc.pid)
    tree = wait_for(lambda: len(kids := top.children(recursive=True)) == 3 and kids, 10,
                    "the engine core and two workers")
    sim.proc.kill()
    sim.proc.wait(timeout=5)
    wait_for(lambda: not any(alive(p.pid) for p in tree), 2, "the children to die")


def test_fake_nvml_stands_alone_and_counts_only_live_holders(tmp_path: Path) -> None:
    """Imported as plain `pynvml` with nothing but its directory on sys.path (-S: no site)."""
    state = tmp_path / "gpus"
    state.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    zombie = subprocess.Popen(["true"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 5,
                 "a zombie")
        holders = {sleeper.pid: (1, 5 * GIB), zombie.pid: (1, 7 * GIB), dead.pid: (0, 9 * GIB)}
        for pid, (gpu, used) in holders.items():
            (state / f"holder-{pid}.json").write_text(
                json.dumps({"pid": pid, "gpu": gpu, "used": used, "util": 40}))
        probe = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import pynvml\n"
            "out = {'version': pynvml.__version__, 'file': pynvml.__file__}\n"
            "try:\n    pynvml.nvmlInit()\n"
            "except pynvml.NVMLError as e:\n    out['error'] = [e.value, str(e)]\n"
            "open(sys.argv[2] + '/devices.json', 'w').write(json.dumps("
            "{'count': 2, 'name': 'NVIDIA H200 (simulated)', 'total': 141 * 2**30}))\n"
            "pynvml.nvmlInit()\n"
            "out['driver'] = pynvml.nvmlSystemGetDriverVersion()\n"
            "out['gpus'] = []\n"
            "for i in range(pynvml.nvmlDeviceGetCount()):\n"
            "    h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
            "    m = pynvml.nvmlDeviceGetMemoryInfo(h)\n"
            "    out['gpus'].append([pynvml.nvmlDeviceGetName(h), m.used, m.free, m.total,\n"
            "        pynvml.nvmlDeviceGetUtilizationRates(h).gpu,\n"
            "        [[p.pid, p.usedGpuMemory] for p in "
            "pynvml.nvmlDeviceGetComputeRunningProcesses(h)],\n"
            "        pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)])\n"
            "pynvml.nvmlShutdown()\n"
            "try:\n    pynvml.nvmlDeviceGetCount()\n"
            "except pynvml.NVMLError as e:\n    out['after_shutdown'] = str(e)\n"
            "print(json.dumps(out))\n")
        env = {**os.environ, "SPECCONSOLE_SIM_GPU_STATE": str(state)}
        env.pop("PYTHONPATH", None)
        done = subprocess.run([sys.executable, "-S", "-c", probe, FAKENVML_DIR, str(state)],
                              env=env, capture_output=True, text=True, timeout=10, check=True)
        out = json.loads(done.stdout)
    finally:
        sleeper.kill()
        sleeper.wait()
        zombie.wait()
    assert out["version"] == "sim" and out["file"] == str(Path(FAKENVML_DIR) / "pynvml.py")
    assert out["error"] == [9, "Driver Not Loaded"]
    assert out["driver"] and out["after_shutdown"] == "Uninitialized"
    total = 141 * GIB
    assert out["gpus"] == [
        ["NVIDIA H200 (simulated)", 0, total, total, 0, [], []],
        ["NVIDIA H200 (simulated)", 5 * GIB, total - 5 * GIB, total, 40,
         [[sleeper.pid, 5 * GIB]], []]]
    # The holders of the zombie and of the dead process were deleted on the way.
    assert sorted(f.name for f in state.iterdir()) == ["devices.json",
                                                       f"holder-{sleeper.pid}.json"]


def test_spawned_child_is_a_working_python(capfd: pytest.CaptureFixture[str]) -> None:
    """argv[0] is the title, yet the child is this interpreter with this package importable
    (and, from 3.11, this venv: PYTHONEXECUTABLE keeps sys.executable and sys.prefix)."""
    child = runtime.spawn("VLLM::Probe", "site", {"python": sys.executable})
    assert child.wait(timeout=10) == 0
    out = capfd.readouterr().out
    assert f"    {str(ROOT)!r}," in out
    if sys.version_info >= (3, 11) and sys.prefix != sys.base_prefix:
        site_packages = next(p for p in sys.path if p.endswith("site-packages"))
        assert f"    {site_packages!r}," in out


def test_the_simulation_is_stdlib_only() -> None:
    """It runs under whatever Python the agent finds on the host: no psutil, textual, asyncssh."""
    probe = ("import sys, tui.sim.engine, tui.sim.engine_core, tui.sim.worker\n"
             "print(sorted(m for m in ('psutil', 'textual', 'asyncssh', 'pynvml') "
             "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, timeout=30, check=True)
    assert done.stdout.strip() == "[]"
