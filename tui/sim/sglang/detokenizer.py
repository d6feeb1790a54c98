"""Simulated SGLang detokenizer (`sglang::detokenizer`): a process of the tree that holds no GPU
and logs nothing; it lives until the launcher ends it (or dies with it: PDEATHSIG)."""

from __future__ import annotations

import contextlib
import sys

from tui.sim import runtime
from tui.sim.runtime import SimClock, Terminated


def main() -> int:
    cfg = runtime.child_config()
    runtime.become(cfg["title"], cfg["parent_pid"])
    with contextlib.suppress(Terminated):
        runtime.Runtime(SimClock(cfg["t0"], cfg["scale"])).forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
