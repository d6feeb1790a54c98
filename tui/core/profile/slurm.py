"""`[slurm]`: the server launched as a Slurm job from the login node ([host]); the job script
and the scheduler's words are tui.core.slurm's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tui.core.profile.checks import (
    Table,
    _bounded,
    _duration,
    _int,
    _Invalid,
    _list,
    _one_of,
    _section,
    _str,
)

# how the agent reaches a Slurm job's node: "step", a step of the job (`srun --jobid J
# --overlap`, no SSH to compute nodes: any stock Slurm); "ssh", SSH to the node (through the
# login node when [host] is remote), where the site lets a job's owner in (pam_slurm_adopt)
SLURM_REACH = ("step", "ssh")
# sbatch options the job script writes itself (tui.core.slurm), refused in sbatch_args
SLURM_OWNED_OPTIONS = ("--output", "-o", "--error", "-e", "--job-name", "-J", "--parsable",
                       "--wrap", "--test-only", "--chdir", "-D", "--export", "--nodes", "-N")


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """The server runs inside a Slurm job that [host] (the login node) submits with sbatch.
    Unset keys are the cluster's defaults (its default partition, its default time limit)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # Slurm's own format: "30" (minutes), "4:00:00", "1-12:00"
    nodes: int = 1  # several: one member per node, as [cluster] says (tui.core.cluster)
    gpus_per_node: int | None = None
    gres: str | None = None  # "gpu:a100:8"; or gpus_per_node, not both
    cpus_per_task: int | None = None
    mem: str | None = None  # per node, as sbatch's --mem: "64G", "4000" (MB)
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()  # further sbatch words, one option each
    job_name: str | None = None  # the profile's name when unset
    reach: str = "step"  # SLURM_REACH: how the agent reaches the job's node
    alert_before: float = 600.0  # the time-left alert, seconds before the job's end

    @property
    def time_limit_s(self) -> float | None:
        return slurm_time_seconds(self.time) if self.time is not None else None


_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def slurm_time_seconds(text: str) -> int:
    """Seconds from Slurm's time format (sbatch --time): "M", "M:S", "H:M:S", "D-H", "D-H:M",
    "D-H:M:S"; ValueError otherwise (so does "0", "infinite" and "unlimited": a launch asks
    for a limit it can be alerted before)."""
    match = _SLURM_TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid Slurm time {text!r} (use minutes \"30\", \"H:MM:SS\" like "
                         "\"4:00:00\", or \"D-HH:MM\" like \"1-12:00\")")
    days, first, second, third = match.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:  # D-H, D-H:M, D-H:M:S
        parts += [0] * (3 - len(parts))
        seconds = int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 3:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = parts[0] * 60
    if seconds <= 0:
        raise ValueError(f"Slurm time {text!r} is no limit: give the job's wall time")
    return seconds


_SLURM_WORD = re.compile(r"[^\s'\"\\#]+")
_SLURM_MEM = re.compile(r"\d+[KMGT]?", re.I)
_GRES_ONE = r"[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)*"
_SLURM_GRES = re.compile(rf"{_GRES_ONE}(?:,{_GRES_ONE})*")


def _slurm_word(value: Any) -> str:
    """One word of an #SBATCH line: no spaces, quotes, backslashes or `#` (sbatch reads
    its directives by words; nothing to escape, nothing lost)."""
    if not _SLURM_WORD.fullmatch(_str(value)):
        raise _Invalid(f"expected one word without spaces, quotes or '#', got {value!r}")
    return value


def _slurm_time(value: Any) -> str:
    try:
        slurm_time_seconds(_str(value))
    except ValueError as e:
        raise _Invalid(str(e)) from None
    return value


def _slurm_mem(value: Any) -> str:
    if not _SLURM_MEM.fullmatch(_str(value)):
        raise _Invalid(f"expected a memory size as sbatch takes it (\"64G\", \"4000\" MB), "
                       f"got {value!r}")
    return value


def _slurm_gres(value: Any) -> str:
    if not _SLURM_GRES.fullmatch(_str(value)):
        raise _Invalid(f"expected sbatch's --gres form like \"gpu:8\" or \"gpu:a100:8\", "
                       f"got {value!r}")
    return value


def _sbatch_word(value: Any) -> str:
    word = _slurm_word(value)
    if not word.startswith("-"):
        raise _Invalid(f"expected an sbatch option like \"--exclusive\" or "
                       f"\"--reservation=name\", got {value!r}")
    option = word.split("=", 1)[0]
    if option in SLURM_OWNED_OPTIONS or (len(option) > 2 and option[:2] in SLURM_OWNED_OPTIONS
                                         and not option.startswith("--")):
        hint = " (the job's name is [slurm].job_name)" if option[:2] in ("-J", "--") and (
            "job-name" in option or option.startswith("-J")) else ""
        raise _Invalid(f"{option} is written by specconsole's job script; drop it{hint}")
    return word


def _check_slurm(values: dict[str, Any]) -> None:
    if values.get("gpus_per_node") is not None and values.get("gres") is not None:
        raise _Invalid("give gpus_per_node or gres, not both", ".gres")


def _check_beside(values: dict[str, Any]) -> None:
    """What [slurm] does not combine with (yet), said where it is written: the scheduler picks
    the hosts (`nodes`, not [[hosts]]); several nodes are one server as [cluster] says."""
    for table, what in (("container", "[container]"), ("nodes", "[[hosts]]")):
        if values.get(table):
            raise _Invalid(f"{what} is not supported inside a Slurm job yet: drop one of "
                           f"{what} and [slurm]", ".slurm")
    nodes = values["slurm"].nodes
    if nodes > 1 and "cluster" not in values:
        raise _Invalid(f"{nodes} nodes need a [cluster] table saying how they form one server "
                       "(backend = \"ray\" or \"native\")", ".slurm.nodes")
    if nodes == 1 and "cluster" in values:
        raise _Invalid("[cluster] needs several nodes: set [slurm] nodes", ".cluster")


_SLURM = {
    "partition": _slurm_word, "account": _slurm_word, "qos": _slurm_word, "time": _slurm_time,
    "nodes": _bounded(_int, 1), "gpus_per_node": _bounded(_int, 1), "gres": _slurm_gres,
    "cpus_per_task": _bounded(_int, 1), "mem": _slurm_mem, "constraint": _slurm_word,
    "sbatch_args": _list(_sbatch_word), "job_name": _slurm_word, "reach": _one_of(SLURM_REACH),
    "alert_before": _duration,
}

SLURM_TABLE = Table("slurm", _section(SlurmConfig, _SLURM, post=_check_slurm),
                    beside=_check_beside)
