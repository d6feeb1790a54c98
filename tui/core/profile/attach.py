"""What to attach to: a server launched by others (`specconsole attach`, not a table)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class AttachTarget:
    """A server launched by others, to attach to: a container (name or id, and its runtime)
    or a host pid, or a Slurm job someone submitted (its server's pid is found on the job's
    node when attaching: `pid` then); `log`: the bare process's log file, when its output does
    not go to a file the agent can find.  Not a profile table: `specconsole attach` builds it
    (tui.core.attach)."""

    container: str | None = None
    pid: int | None = None
    runtime: str = "docker"
    log: str | None = None
    slurm_job: str | None = None

    def __post_init__(self) -> None:
        if (self.container is None) == (self.pid is None and self.slurm_job is None):
            raise ValueError("attach to a container, a pid or a Slurm job, one of them")

    @property
    def label(self) -> str:
        """The run name's stem: `attached-<container>`, `attached-job<job>` or
        `attached-pid<pid>`."""
        what = (self.container if self.container is not None
                else f"job{self.slurm_job}" if self.slurm_job is not None else f"pid{self.pid}")
        return "attached-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", what) or "target")

    def to_wire(self) -> dict[str, Any]:
        if self.container is not None:
            return {"container": self.container, "runtime": self.runtime}
        return {"pid": self.pid, "log": self.log}

