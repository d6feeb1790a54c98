"""`[preflight]`: which checks run on the host before a launch."""

from __future__ import annotations

from dataclasses import dataclass

from tui.core.profile.checks import Table, _bool, _list, _section, _str


@dataclass(frozen=True, slots=True)
class PreflightConfig:
    enabled: bool = True
    compile: bool = True
    compile_files: tuple[str, ...] = ()
    engine_package: bool = True
    gpus_free: bool = True
    port_free: bool = True
    paths_exist: bool = True
    spec_consistent: bool = True



_PREFLIGHT = {name: _bool for name in (
    "enabled", "compile", "engine_package", "gpus_free", "port_free", "paths_exist",
    "spec_consistent")} | {"compile_files": _list(_str)}

PREFLIGHT_TABLE = Table("preflight", _section(PreflightConfig, _PREFLIGHT),
                        expanded=(("compile_files",),))
