"""When a log line was written, from vLLM's own `MM-DD HH:MM:SS` stamp (or SGLang's
`[YYYY-MM-DD HH:MM:SS`, whose year is ignored: both are read the same way).

A console that attaches to a run long after launch reads the whole log at once; stamping each
phase with the moment it was *read* would make every duration zero. The stamp is the host's
local time in a zone we are not told, so the clock is anchored on the launch time (epoch, from
launch.json): the first stamp fixes the zone offset, rounded to 15 minutes.
"""

from __future__ import annotations

import calendar
import re
import time
from datetime import datetime

_STAMP = re.compile(r"(?:\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) |\[\d{4}-)"
                    r"(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")
ZONE_STEP_S = 900


class LogClock:
    def __init__(self, launched_at: float) -> None:
        self.launched_at = launched_at
        self.year = time.gmtime(launched_at).tm_year
        self.launch_month = time.gmtime(launched_at).tm_mon
        self.shift: float | None = None

    def time_of(self, raw: str) -> float | None:
        """Epoch seconds of the line's stamp, or None when it has none (or a nonsense one)."""
        m = _STAMP.search(raw)
        if m is None:
            return None
        month, day, hour, minute, second = map(int, m.groups())
        year = self.year + (1 if month < self.launch_month else 0)  # December → January
        try:
            stamp = datetime(year, month, day, hour, minute, second)
        except ValueError:
            return None
        naive = calendar.timegm(stamp.timetuple())
        if self.shift is None:
            self.shift = round((self.launched_at - naive) / ZONE_STEP_S) * ZONE_STEP_S
        return naive + self.shift
