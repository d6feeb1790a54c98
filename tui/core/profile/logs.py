"""`[logs]`: the profile's own noise rules, lines hidden and errors known harmless."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tui.core.profile.checks import Table, _check_table, _list, _regex, _section, _str


@dataclass(frozen=True, slots=True)
class LogRule:
    pattern: re.Pattern[str]
    label: str


@dataclass(frozen=True, slots=True)
class LogsConfig:
    hide: tuple[LogRule, ...] = ()
    harmless: tuple[LogRule, ...] = ()



def _rule(value: Any) -> LogRule:
    if isinstance(value, str):
        return LogRule(_regex(value), value)
    values = _check_table(value, {"pattern": _regex, "label": _str}, required=("pattern",))
    return LogRule(values["pattern"], values.get("label") or values["pattern"].pattern)


_LOGS = {"hide": _list(_rule), "harmless": _list(_rule)}

LOGS_TABLE = Table("logs", _section(LogsConfig, _LOGS))
