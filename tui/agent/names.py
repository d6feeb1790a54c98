"""The names vLLM, SGLang and Ray give their processes, read from titles and command lines."""

from __future__ import annotations

import os


def vllm_name(argv: list[str] | None, comm: str, top: bool) -> str:
    """The name vLLM gives a process: its title `VLLM::EngineCore_DP0` -> "EngineCore_DP0";
    SGLang's likewise (`sglang::scheduler_TP3` -> "scheduler_TP3"), its launcher "SGLangServer";
    a Ray actor's by its class (`ray::RayWorkerWrapper.execute_method` -> "RayWorkerWrapper")."""
    argv = argv or []
    first = argv[0].strip() if argv else ""
    for title, engine in (("VLLM::", "VLLM"), ("sglang::", "sglang"), ("ray::", "ray")):
        if first.startswith(title):
            rest = first[len(title):].split()
            return rest[0].split(".")[0] if rest else engine
        if comm.startswith(title):
            return comm[len(title):] or engine
    joined = " ".join(argv)
    if top and _looks_like_server(argv):
        return "SGLangServer" if _is_sglang(argv) else "APIServer"
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
    if "sglang.launch_server" in argv:
        return True
    at = argv.index("--sim-engine") + 1 if "--sim-engine" in argv else 0
    return at > 0 and argv[at:at + 1] == ["sglang"]
