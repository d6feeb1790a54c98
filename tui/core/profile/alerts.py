"""`[alerts]`: local hooks on DEAD, STALLED, READY and a Slurm job's nearing end, and tmux."""

from __future__ import annotations

from dataclasses import dataclass

from tui.core.profile.checks import Table, _bool, _duration, _section, _str


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    """Local commands run on DEAD, STALLED and READY (with the event in SPECCONSOLE_* variables),
    and whether to flash a tmux message; a hook never blocks the console."""

    on_ready: str | None = None
    on_dead: str | None = None
    on_stalled: str | None = None
    on_ending: str | None = None  # a Slurm job nears its time limit ([slurm].alert_before)
    hook_timeout: float = 10.0
    tmux: bool = True



_ALERTS = {"on_ready": _str, "on_dead": _str, "on_stalled": _str, "on_ending": _str,
           "hook_timeout": _duration, "tmux": _bool}

ALERTS_TABLE = Table("alerts", _section(AlertsConfig, _ALERTS))
