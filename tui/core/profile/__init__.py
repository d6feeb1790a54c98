"""Profiles: one TOML file per server to launch, validated into frozen dataclasses.

One module per table (hosts, server, speculative, preflight, logs, expect, alerts, smoke,
simulate, container, slurm; attach is not a table), the mechanism they share (checks) and the loader
that registers them and reads a file (loader). What callers use is importable from here.
"""

from tui.core.profile.alerts import AlertsConfig
from tui.core.profile.attach import AttachTarget
from tui.core.profile.checks import Check, Table, expand_vars, parse_duration
from tui.core.profile.container import (
    ENTRYPOINTS,
    PULL_POLICIES,
    RUN_MOUNT,
    RUNTIMES,
    ContainerConfig,
)
from tui.core.profile.expect import ON_READY_TIMEOUT, ExpectConfig
from tui.core.profile.hosts import (
    CLUSTER_BACKENDS,
    CLUSTER_PORTS,
    ROLES,
    ClusterConfig,
    HostConfig,
    NodeConfig,
)
from tui.core.profile.loader import TABLES, Profile, load_profile, loads_profile
from tui.core.profile.logs import LogRule, LogsConfig
from tui.core.profile.preflight import PreflightConfig
from tui.core.profile.server import ENGINES, ServerConfig
from tui.core.profile.simulate import SCENARIOS, SimulateConfig
from tui.core.profile.slurm import SlurmConfig, slurm_time_seconds
from tui.core.profile.smoke import SmokeConfig
from tui.core.profile.speculative import (
    DRAFTER_METHODS,
    SGLANG_METHODS,
    SGLANG_SPECULATIVE_KEYS,
    SPECULATIVE_METHODS,
    SpeculativeConfig,
)

__all__ = [
    "CLUSTER_BACKENDS", "CLUSTER_PORTS", "DRAFTER_METHODS", "ENGINES", "ENTRYPOINTS",
    "ON_READY_TIMEOUT", "PULL_POLICIES", "ROLES", "RUNTIMES", "RUN_MOUNT", "SCENARIOS",
    "SGLANG_METHODS", "SGLANG_SPECULATIVE_KEYS", "SPECULATIVE_METHODS", "TABLES",
    "AlertsConfig", "AttachTarget", "Check", "ClusterConfig", "ContainerConfig", "ExpectConfig",
    "HostConfig", "LogRule", "LogsConfig", "NodeConfig", "PreflightConfig", "Profile",
    "ServerConfig", "SimulateConfig", "SlurmConfig", "SmokeConfig", "SpeculativeConfig",
    "Table", "expand_vars", "load_profile", "loads_profile", "parse_duration",
    "slurm_time_seconds",
]
