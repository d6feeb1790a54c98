"""Domain events in words: one line each, for `wait`, the status line and history.

The same sentences everywhere, so a user who read the console can grep a script's output.
"""

from __future__ import annotations

import signal

from tui.core.failures import hint_for
from tui.core.phases import Phase
from tui.core.protocol import DiskSpace, Killed
from tui.core.rootcause import RootCause
from tui.core.serving import ServingSample
from tui.core.state import (
    CauseUpdated,
    Death,
    Died,
    HelperExited,
    PhaseChanged,
    Ready,
    ReadyTimedOut,
    Stalled,
    State,
    StateChanged,
)
from tui.core.units import duration, size_words

_NATIVE_CRASH = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def death_lines(death: Death) -> list[str]:
    """The DEAD headline and its root cause, as `wait` prints them and the banner shows them."""
    phase = f" while {death.phase.label}" if death.phase is not None else ""
    lines = [f"DEAD: {death.summary()}{phase}"]
    if death.ended_by is not None:  # the scheduler's word: not a crash, whatever the signal
        lines.append(f"root cause: {death.ended_by} (the scheduler's doing, not a crash)")
    elif death.oom_killed:  # the runtime's word: the log's last error is its consequence
        lines.append("root cause: killed by the container's memory limit (OOMKilled): raise "
                     "its --memory in container.run_args, or load less")
    elif death.cause is not None:
        lines += cause_lines(death.cause)
    elif death.signal in _NATIVE_CRASH:
        lines.append(f"root cause: native crash ({_signal_name(death.signal)}), no Python "
                     "traceback; read the log lines just before it")
    elif death.signal is not None:
        lines.append(f"root cause: killed by {_signal_name(death.signal)} from outside the "
                     "process, so no traceback (a user, a scheduler, or the OOM killer: "
                     "see dmesg)")
    else:
        lines.append("root cause: not found in the log (see `specconsole logs --raw`)")
    return lines


def cause_lines(cause: RootCause) -> list[str]:
    """The root-cause line, then the hint its failure class gives (tui.core.failures)."""
    who = f" ({cause.process})" if cause.process else ""
    lines = [f"root cause{who}: {cause.line}"]
    if cause.kind is not None:
        lines.append(f"hint: {hint_for(cause.kind, cause.line)}")
    return lines


def timed_out_words(event: ReadyTimedOut) -> str:
    """`not READY after 40m00s (ready_timeout)`: the banner, the timeline and `wait` alike."""
    return f"not READY after {duration(event.limit.seconds)} ({event.limit.name})"


def timed_out_outcome(event: ReadyTimedOut) -> str:
    """What giving up does to the run: the profile's [expect] on_ready_timeout."""
    if event.limit.kill:
        return 'killing the run (on_ready_timeout = "kill")'
    return 'the run keeps running (on_ready_timeout = "keep")'


def describe(event: object) -> list[str]:
    """Lines worth printing for one domain event (most events print nothing)."""
    if isinstance(event, PhaseChanged) and event.phase is Phase.QUEUED:
        return [f"phase: queued ({event.detail})" if event.detail else "phase: queued"]
    if isinstance(event, PhaseChanged):
        return [f"phase: {event.phase.label} (at {duration(event.since_launch)})"]
    if isinstance(event, Ready):
        return [f"READY after {duration(event.took)}: the health endpoint answers"]
    if isinstance(event, Died):
        return death_lines(event.death)
    if isinstance(event, CauseUpdated) and event.death.cause is not None:
        return cause_lines(event.death.cause)
    if isinstance(event, Stalled):
        cause = event.cause  # a hang marker after READY: the summary names it, its hint here
        return [f"STALLED: {event.summary()}",
                *(f"suspect: {suspect.words()}" for suspect in event.suspects),
                *([f"hint: {hint_for(cause.kind, cause.line)}"]
                  if cause is not None and cause.kind is not None else [])]
    if isinstance(event, ReadyTimedOut):
        return [f"TIMEOUT: {timed_out_words(event)}, still {event.state.value}; "
                f"{timed_out_outcome(event)}"]
    if isinstance(event, HelperExited):
        ex = event.exit
        how = f"signal {ex.signal}" if ex.signal is not None else f"exit code {ex.code}"
        return [f"note: helper process {ex.name} (pid {ex.pid}) ended with {how}"]
    if isinstance(event, StateChanged) and event.state in (State.KILLING, State.STOPPED):
        return [f"state: {event.state.value}"]
    return []


def gpu_verdict(killed: Killed) -> tuple[bool, str]:
    """After a kill: whether the run's GPU memory is free, and that in words."""
    ours = [h for h in killed.gpu_holders if h.get("run", True)]
    if killed.gpu_released is None:
        return True, "GPU memory: unknown (no NVML on the host)"
    if ours:
        return False, "GPU memory NOT released: " + ", ".join(
            f"pid {h.get('pid')} on GPU {h.get('gpu')}" for h in ours)
    return True, "GPU memory released"


def serving_words(s: ServingSample) -> str:
    """The serving figures a reading has, in one line."""
    parts = []
    if s.running is not None or s.waiting is not None:
        parts.append(f"{s.running or 0:.0f} running · {s.waiting or 0:.0f} waiting")
    for label, value in (("prompt", s.prompt_tps), ("generation", s.gen_tps)):
        if value is not None:
            parts.append(f"{label} {value:,.0f} tok/s")
    for label, share in (("KV cache", s.kv_usage), ("prefix hit", s.prefix_hit),
                         ("spec acceptance", s.spec_acceptance)):
        if share is not None:
            parts.append(f"{label} {share * 100:.0f} %")
    if s.preemptions is not None:
        parts.append(f"preemptions {s.preemptions:,.0f}")
    return " · ".join(parts) or "no figures"


def skipped_words(start: int, end: int) -> str:
    """What attaching to a long log left unread, and how to read it."""
    return (f"long log: read its first {size_words(start)} and its end; the "
            f"{size_words(end - start)} between are read back as you scroll up to them")


def disk_words(host: str, disk: DiskSpace) -> tuple[str, str]:
    """(the sentence, its notice level) for a change of the run's log disk: the server appends
    its output there, so a full disk loses lines while the run goes on."""
    free = "?" if disk.free is None else size_words(disk.free)
    if disk.level == "full":
        return (f"{host}: disk full where the run's log is written ({free} free in {disk.path}):"
                " the server's output is being lost; free space there", "warning")
    if disk.level == "low":
        return (f"{host}: disk almost full where the run's log is written ({free} free in "
                f"{disk.path})", "warning")
    return f"{host}: the run's log disk has room again ({free} free)", "info"
