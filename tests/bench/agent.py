"""4. The agent on the GPU host, watching: CPU (percent of one core) and RSS of the watch agent
while it watches a serving simulated launch (API server, engine core, 8 workers) with 8 fake
GPUs, at the supervisor's default sample rates (processes, GPUs and health every second, the
log every 50 ms). Under the firehose, its cost is measured by firehose.py.

The usual alternative, measured the same way over the same seconds: a loop that spawns `ps`
and an `nvidia-smi`-like process (a Python that asks the same fake NVML for every GPU's memory
and processes) once a second; its own CPU plus its children's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import Figures, agent_process, cpu_share, launched, profile_for, say, supervisor

from tui.core.state import State
from tui.sim.nvml.build import build as build_nvml

# What the alternative runs once a second; it reports its CPU (own + reaped children) as JSON.
_NVIDIA_SMI = """
import pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    print(i, mem.used, mem.total, [(p.pid, p.usedGpuMemory) for p in procs])
pynvml.nvmlShutdown()
"""
_POLL_LOOP = """
import json, resource, subprocess, sys, time
seconds, smi = float(sys.argv[1]), sys.argv[2:]
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
start, used = time.monotonic(), cpu()
while time.monotonic() - start < seconds:
    subprocess.run(["ps", "-eo", "pid,ppid,stat,rss,pcpu,etimes,comm"], capture_output=True)
    subprocess.run(smi, capture_output=True)
    time.sleep(max(0.0, 1 - (time.monotonic() - start) % 1))
print(json.dumps({"cpu_s": cpu() - used, "seconds": time.monotonic() - start}))
"""


def _alternative(seconds: float, gpu_state: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(build_nvml()),
           "SPECCONSOLE_SIM_GPU_STATE": str(gpu_state)}
    return subprocess.Popen([sys.executable, "-c", _POLL_LOOP, str(seconds), sys.executable,
                             "-c", _NVIDIA_SMI], stdout=subprocess.PIPE, text=True, env=env)


async def run(seconds: float) -> Figures:
    with tempfile.TemporaryDirectory() as base:
        tmp = Path(base)
        sup = supervisor(profile_for(tmp, "ready", time_scale=1000), None)
        async with launched(sup):
            deadline = time.monotonic() + 120
            while sup.machine.state is not State.READY and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)  # settled: serving, stats lines every 0.5 s
            assert sup.run is not None
            tree = len(psutil.Process(sup.run.pid).children(recursive=True)) + 1
            agent = agent_process()
            alternative = _alternative(seconds, tmp / "gpus")
            with cpu_share(agent) as cost:
                await asyncio.sleep(seconds)
            out, _ = await asyncio.to_thread(alternative.communicate)
    alt = json.loads(out)
    alt_pct = 100 * alt["cpu_s"] / alt["seconds"]
    say(f"agent watching {tree} processes + 8 fake GPUs: {cost['pct']:.2f} % of a core "
        f"({cost['pct'] * 0.6:.2f} CPU s a minute), RSS {cost['rss_mib']:.0f} MiB; instead, "
        f"`ps` + an nvidia-smi-like Python once a second: {alt_pct:.1f} % of a core "
        f"({alt_pct / max(cost['pct'], 1e-9):.0f}x)")
    return {"agent_cpu_pct_watch": cost["pct"], "agent_rss_mib_watch": cost["rss_mib"],
            "agent_tree": tree, "poll_subprocess_cpu_pct": alt_pct}
