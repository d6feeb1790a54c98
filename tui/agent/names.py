"""The names vLLM, SGLang and Ray give their processes, read from titles and command lines."""

from __future__ import annotations

import os

# The part of this naming that the rest of tui reads too: tui/core/procnames.py holds the same
# table (the agent imports nothing of tui); tests/test_procnames.py keeps the two equal.
# Titles (setproctitle) that carry the process's own name after the prefix, with the name of one
# that carries nothing after it.
ENGINE_TITLES = (("VLLM::", "VLLM"), ("sglang::", "sglang"))
# The top process of a run (the server that answers HTTP), by engine.
TOP_NAMES = {"vllm": "APIServer", "sglang": "SGLangServer"}
# SGLang's launcher by its command line (its words, in order): the real one, and the simulated
# engine playing it.
SGLANG_LAUNCHER = ("sglang.launch_server", "--sim-engine sglang")

_RAY_TITLE = ("ray::", "ray")

# Ray's daemons by the script or module they run (Ray 2.x): the names Ray's own logs and
# `ray status` use for them
_RAY_SCRIPTS = (("ray/_private/log_monitor.py", "log_monitor"),
                ("ray/autoscaler/_private/monitor.py", "monitor"),
                ("ray/dashboard/dashboard.py", "dashboard"),
                ("ray/dashboard/agent.py", "DashboardAgent"),
                ("ray/_private/runtime_env/agent/main.py", "RuntimeEnvAgent"),
                ("ray.util.client.server", "ray_client_server"))
_RAY_BINARIES = ("gcs_server", "raylet", "plasma_store", "redis-server")


# a container's init (`docker run --init`; podman's is catatonit, mounted as /run/podman-init):
# the server is its child, never itself
CONTAINER_INITS = ("docker-init", "podman-init", "tini", "catatonit")


def vllm_name(argv: list[str] | None, comm: str, top: bool) -> str:
    """The name vLLM gives a process: its title `VLLM::EngineCore_DP0` -> "EngineCore_DP0";
    SGLang's likewise (`sglang::scheduler_TP3` -> "scheduler_TP3"), its launcher "SGLangServer";
    a Ray actor's by its class (`ray::RayWorkerWrapper.execute_method` -> "RayWorkerWrapper",
    `ray::DashboardAgent`; a worker without an actor yet, `ray::IDLE`, is "IDLE"); Ray's daemons
    as Ray names them (see ray_name)."""
    argv = argv or []
    first = argv[0].strip() if argv else ""
    for title, engine in (*ENGINE_TITLES, _RAY_TITLE):
        if first.startswith(title):
            rest = first[len(title):].split()
            return rest[0].split(".")[0] if rest else engine
        if comm.startswith(title):
            return comm[len(title):] or engine
    if comm in CONTAINER_INITS or os.path.basename(first) in CONTAINER_INITS:
        return comm
    found = ray_name(argv, first)
    if found is not None:
        return found
    joined = " ".join(argv)
    if top and _looks_like_server(argv):
        return TOP_NAMES["sglang"] if _is_sglang(argv) else TOP_NAMES["vllm"]
    if "multiprocessing.resource_tracker" in joined:
        return "resource_tracker"
    if "from multiprocessing.spawn import" in joined or "multiprocessing.forkserver" in joined:
        return "mp-spawn"
    return comm


def _looks_like_server(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        base = os.path.basename(arg)
        if base == "vllm" and argv[i + 1 : i + 2] == ["serve"]:
            return True
        if arg in ("vllm.entrypoints.openai.api_server", "sglang.launch_server",
                   "tui.sim.engine"):
            return True
    return False


def _is_sglang(argv: list[str]) -> bool:
    """SGLang's launcher, or the simulated engine playing it (`--sim-engine sglang`)."""
    return any(_has_words(argv, command.split()) for command in SGLANG_LAUNCHER)


def _has_words(argv: list[str], words: list[str]) -> bool:
    """`words` appear in argv one after the other."""
    n = len(words)
    return any(argv[i:i + n] == words for i in range(len(argv) - n + 1))


def ray_name(argv: list[str], first: str) -> str | None:
    """Ray's own processes: `ray start` (the command a launch runs), its binaries (gcs_server,
    raylet), its Python daemons by script (log_monitor, monitor, dashboard, DashboardAgent,
    RuntimeEnvAgent before they retitle, ray_client_server), the dashboard's module processes by
    their title (`ray-dashboard-NodeHead-0 (...)`) and their forkserver; None for the rest."""
    if first.startswith("ray-dashboard-"):
        return first.split()[0]
    if not argv:
        return None
    base = os.path.basename(first)
    if base in _RAY_BINARIES:
        return base
    for i, arg in enumerate(argv[:3]):
        if os.path.basename(arg) == "ray" and argv[i + 1 : i + 2] == ["start"]:
            return "ray start"
    for arg in argv[:4]:
        for script, name in _RAY_SCRIPTS:
            if arg.endswith(script) or arg == script:
                return name
    if "multiprocessing.forkserver" in " ".join(argv) and "'ray.dashboard" in " ".join(argv):
        return "ray-dashboard-forkserver"
    return None
