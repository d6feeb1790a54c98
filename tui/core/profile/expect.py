"""`[expect]`: how long a launch may take, and what giving up on it does."""

from __future__ import annotations

from dataclasses import dataclass

from tui.core.profile.checks import Table, _bool, _duration, _one_of, _section

ON_READY_TIMEOUT = ("keep", "kill")  # what giving up on a launch does to its run


@dataclass(frozen=True, slots=True)
class ExpectConfig:
    load_time: float = 1800.0
    stall_timeout: float = 600.0
    # not READY this long after the launch: given up on (wait exits 4, the console alerts)
    ready_timeout: float | None = None
    on_ready_timeout: str = "keep"  # or "kill": the run is killed when it is given up on
    stacks_on_stall: bool = True  # py-spy every process of the run once when it stalls
    # once READY, how often the agent asks the server (/metrics, else /health): a week of
    # supervision must not fill the server's log with the tool's own requests
    serving_probe_interval: float = 10.0



_EXPECT = {"load_time": _duration, "stall_timeout": _duration, "ready_timeout": _duration,
           "on_ready_timeout": _one_of(ON_READY_TIMEOUT), "stacks_on_stall": _bool,
           "serving_probe_interval": _duration}

EXPECT_TABLE = Table("expect", _section(ExpectConfig, _EXPECT))
