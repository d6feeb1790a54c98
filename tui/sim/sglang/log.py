"""SGLang-shaped log lines for one simulated process: `[YYYY-MM-DD HH:MM:SS TP3] msg`.

No level, no source location; the rank tag only in a scheduler of a TP>1 run. Counted with
` [sim#n]` per process like tui/sim/simlog.py (whose writer this is). A scheduler's failure is
ONE record, as SGLang's `logger.error(f"Scheduler hit an exception: {traceback}")` writes it:
the traceback's lines follow the tagged first line untagged, in the same write, uncounted.
"""

from __future__ import annotations

import traceback

from tui.sim.runtime import SimClock
from tui.sim.sglang import lines
from tui.sim.simlog import SimLog


class SGLangLog(SimLog):
    def __init__(self, tag: str, clock: SimClock) -> None:
        super().__init__("sglang", clock)
        self.tag = tag

    def head(self) -> str:
        return f"[{lines.stamp(self.clock)}{self.tag}] "

    def failure(self, message: str, exc: BaseException) -> None:
        """`message` and the traceback after it, in one write, ending in an empty line (the
        traceback's own newline, then the record's)."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.raw(f"{self.head()}{message}{text}\n")
