"""Profiles: one TOML file per server to launch, validated into frozen dataclasses.

A profile is written by hand and read by a tired engineer, so every mistake becomes ONE line
naming the file, the line when the text shows it, and the key path (`server.speculative.method`,
`logs.hide[2].pattern`). Validation is a field table per section run by one small generic
validator (tui.core.profile.checks), so adding a key is one line, not a new hand-written check.
Each table is a module of its own registered in TABLES, so adding a table is its module, a line
in TABLES and its field on Profile.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tui.core.errors import ProfileError
from tui.core.profile.alerts import ALERTS_TABLE, AlertsConfig
from tui.core.profile.attach import AttachTarget
from tui.core.profile.checks import (
    Table,
    _check_table,
    _find_line,
    _Invalid,
    _syntax_error,
    expand_vars,
)
from tui.core.profile.container import CONTAINER_TABLE, ContainerConfig
from tui.core.profile.expect import EXPECT_TABLE, ExpectConfig
from tui.core.profile.hosts import (
    CLUSTER_TABLE,
    HOST_TABLE,
    HOSTS_TABLE,
    ClusterConfig,
    HostConfig,
    NodeConfig,
    _check_hosts,
)
from tui.core.profile.logs import LOGS_TABLE, LogsConfig
from tui.core.profile.preflight import PREFLIGHT_TABLE, PreflightConfig
from tui.core.profile.server import SERVER_TABLE, ServerConfig
from tui.core.profile.simulate import SIMULATE_TABLE, SimulateConfig
from tui.core.profile.slurm import SLURM_TABLE, SlurmConfig
from tui.core.profile.smoke import SMOKE_TABLE, SmokeConfig

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# The profile's tables, in the order their names are listed in errors
TABLES: tuple[Table, ...] = (
    HOST_TABLE, HOSTS_TABLE, CLUSTER_TABLE, SERVER_TABLE, PREFLIGHT_TABLE, LOGS_TABLE,
    EXPECT_TABLE, ALERTS_TABLE, SMOKE_TABLE, SIMULATE_TABLE, CONTAINER_TABLE, SLURM_TABLE,
)
_TOP = {table.name: table.check for table in TABLES}


@dataclass(frozen=True, slots=True)
class Profile:
    path: str
    name: str  # the file stem: what runs are named after
    host: HostConfig
    server: ServerConfig
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    expect: ExpectConfig = field(default_factory=ExpectConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    smoke: SmokeConfig = field(default_factory=SmokeConfig)
    simulate: SimulateConfig | None = None
    # several hosts (`[[hosts]]`, the head first; `host` is the head's) and how they cluster
    nodes: tuple[NodeConfig, ...] = ()
    cluster: ClusterConfig | None = None
    container: ContainerConfig | None = None
    attach: AttachTarget | None = None  # a server launched by others (tui.core.attach)
    slurm: SlurmConfig | None = None  # launched as a Slurm job from the login node

    @property
    def key(self) -> str:
        """Identifies the live run of this profile on its host (`demo@local`)."""
        return f"{self.name}@{self.host.target}"



def load_profile(path: str | Path, environ: Mapping[str, str] | None = None) -> Profile:
    """Read and validate a profile file; every failure is a one-line ProfileError."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise ProfileError(str(path), f"cannot read profile: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ProfileError(str(path), f"not UTF-8 text (byte {e.start})") from None
    return loads_profile(text, path, environ)


def loads_profile(text: str, path: str | Path,
                  environ: Mapping[str, str] | None = None) -> Profile:
    """Validate profile text; `path` names the file in errors and gives the profile its name.

    Path-like values (see _EXPANDED) may use `${NAME}` / `${NAME:-default}`, expanded from
    `environ` (default: this process's environment) — the console's side, as for secret_env.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _syntax_error(str(path), text, str(e)) from None
    try:
        from_environ = _expand(data, os.environ if environ is None else environ)
        values = _check_table(data, _TOP, required=("server",))
        values["server"] = replace(values["server"], env_from_environ=from_environ)
        if "simulate" in values and values["server"].model is None:
            raise _Invalid("missing required key 'model' (the simulated engine needs one)",
                           ".server.model")
        _check_hosts(values)
        for table in TABLES:
            if table.beside is not None and table.name in values:
                table.beside(values)
    except _Invalid as e:
        key = e.sub.lstrip(".")
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)  # stays one line
        raise ProfileError(str(path), e.message, key=shown, line=_find_line(text, key)) from None
    sim = values.get("simulate")
    if sim is not None and sim.nvml and not sim.nvml.startswith(("/", "~")):
        values["simulate"] = replace(sim, nvml=os.path.normpath(
            Path(path).resolve().parent / sim.nvml))
    return Profile(path=str(path), name=Path(path).stem, **values)



# Values that name paths or the server's environment: where `${NAME}` is expanded (each table
# names its own). Nothing else is, so argv text and patterns stay literal.
_EXPANDED = tuple((table.name, *path) for table in TABLES for path in table.expanded)


def _expand(data: dict[str, Any], environ: Mapping[str, str]) -> tuple[str, ...]:
    """Expand `${NAME}` in place in the _EXPANDED values (those under `host` in each of the
    `[[hosts]]` tables too); the validator checks types later. Returns the values the
    environment gave to `server.env`, paths aside: the server's secrets (HF_TOKEN)."""
    hosts = data.get("hosts")
    if isinstance(hosts, list):
        for i, table in enumerate(hosts):
            if isinstance(table, dict):
                try:
                    _expand({"host": table}, environ)
                except _Invalid as e:
                    raise _Invalid(e.message, e.sub.replace(".host", f".hosts[{i}]", 1)) \
                        from None
    from_environ: list[str] = []
    for path in _EXPANDED:
        table: Any = data
        for key in path[:-1]:
            table = table.get(key) if isinstance(table, dict) else None
        if not isinstance(table, dict) or path[-1] not in table:
            continue
        value = table[path[-1]]
        where = "." + ".".join(path)
        try:
            if isinstance(value, str):
                table[path[-1]] = expand_vars(value, environ)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, str):
                        where = f".{'.'.join(path)}[{i}]"
                        value[i] = expand_vars(item, environ)
            elif isinstance(value, dict):
                used = from_environ if path == ("server", "env") else None
                for name, item in value.items():
                    if isinstance(item, str):
                        where = f".{'.'.join(path)}.{name}"
                        value[name] = expand_vars(item, environ, used)
        except ValueError as e:
            raise _Invalid(str(e), where) from None
    return tuple(dict.fromkeys(v for v in from_environ if v and not _plainly_public(v)))


# A number or a switch (a port, a count, "true") is no secret, and hiding one (8000) would
# blank out every URL; nor is a path, and hiding one (${HOME}) every traceback's file names.
_PUBLIC_VALUE = re.compile(r"[-+]?\d+(?:\.\d+)?|true|false|yes|no|on|off", re.I)


def _plainly_public(value: str) -> bool:
    return value.startswith(("/", "~")) or _PUBLIC_VALUE.fullmatch(value) is not None

