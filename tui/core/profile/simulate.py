"""`[simulate]`: the simulated engine and GPUs (`specconsole demo`, the tests)."""

from __future__ import annotations

from dataclasses import dataclass

from tui.core.profile.checks import _POSITIVE, Table, _bounded, _int, _one_of, _section, _str

SCENARIOS = ("ready", "syntax-error", "oom", "hang", "engine-killed")


@dataclass(frozen=True, slots=True)
class SimulateConfig:
    scenario: str = "ready"
    time_scale: float = 60.0
    gpus: int = 8
    gpu_state: str | None = None
    fault_host: str | None = None  # a multi-host launch: only this host plays the scenario
    # the directory of the stand-in NVML the agent loads (a relative path is the profile's)
    nvml: str | None = None



_SIMULATE = {
    "scenario": _one_of(SCENARIOS), "time_scale": _POSITIVE, "gpus": _bounded(_int, 1),
    "gpu_state": _str, "fault_host": _str, "nvml": _str,
}

SIMULATE_TABLE = Table("simulate", _section(SimulateConfig, _SIMULATE),
                       expanded=(("gpu_state",), ("nvml",)))
