"""`specconsole status`: a line per run and per host (profile, host, run id, state, phase, age).

Each host is asked for its run directories through the agent, and the phase a run reached is
read from the head and tail of its log (a long-serving server's middle is request lines). Hosts
are asked at once; a host that cannot be reached is one line saying so, never a traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime

from tui.core.describe import serving_words
from tui.core.errors import SpecconsoleError
from tui.core.explain import explain
from tui.core.logline import strip_escapes
from tui.core.phases import Phase
from tui.core.profile import Profile
from tui.core.protocol import RunExit, RunRecord
from tui.core.serving import ServingReadout, ServingSample, parse_log_line
from tui.core.slurm import job_words
from tui.core.units import duration
from tui.remote import launcher
from tui.remote import slurm as remote_slurm
from tui.remote.interface import Session
from tui.supervise.runs import Member, Run

HEAD_BYTES = 512 * 1024  # the startup: where the phases are
TAIL_BYTES = 256 * 1024  # the latest lines: the phase a launch still in progress is in
NEWEST = 10  # runs listed for one profile named on the command line


@dataclass(frozen=True, slots=True)
class RunLine:
    """One line of the listing; `run_id` empty: the host had none, or `problem` says why not."""

    profile: str
    host: str
    run_id: str = ""
    state: str = ""
    phase: str = ""
    age: str = ""
    problem: str = ""
    serving: str = ""  # what a READY server does: its figures, one line


def run_state(alive: bool, exit_info: RunExit | None) -> str:
    if alive:
        return "alive"
    if exit_info is not None:
        if exit_info.signal is not None:
            return f"exited (signal {exit_info.signal})"
        return f"exited (code {exit_info.code})"
    return "gone"


def chosen(records: Sequence[RunRecord], every: bool) -> list[RunRecord]:
    """The runs worth a line (newest first): a profile's newest few when it was named, else
    every live run and the newest one, however it ended."""
    if every:
        return list(records[:NEWEST])
    return [r for i, r in enumerate(records) if r.alive or i == 0]


def format_lines(lines: Sequence[RunLine]) -> list[str]:
    """Aligned columns, plain text (profiles, hosts and run ids never drive the terminal)."""
    clean = [replace(line, **{f.name: strip_escapes(getattr(line, f.name))
                              for f in fields(RunLine)}) for line in lines]
    widths = {name: max((len(getattr(line, name)) for line in clean), default=0)
              for name in ("profile", "host", "state", "phase")}
    out = []
    for line in clean:
        head = f"{line.profile:<{widths['profile']}} {line.host:<{widths['host']}}"
        if line.problem:
            out.append(f"{head} {line.problem}")
        elif not line.run_id:
            out.append(f"{head} no runs")
        else:
            out.append(f"{head} {line.run_id} {line.state:<{widths['state']}} "
                       f"{line.phase:<{widths['phase']}} {line.age}".rstrip())
            if line.serving:
                out.append(f"{'':<{widths['profile']}}   serving: {line.serving}")
    return out


async def phase_of(session: Session, record: RunRecord, profile: Profile,
                   ) -> tuple[str, str]:
    """The furthest phase the run's log shows, by the engine's phase rules (`—` when none);
    for a live run past its start-up, what it serves (one line, else empty)."""
    log = f"{record.run_dir}/server.log"
    head = await session.run(["head", "-c", str(HEAD_BYTES), log])
    tail = await session.run(["tail", "-c", str(TAIL_BYTES), log])
    text = head.stdout.decode("utf-8", "replace").splitlines()
    if len(head.stdout) >= HEAD_BYTES:  # more than the head: its tail too, from a whole line
        text += tail.stdout.decode("utf-8", "replace").splitlines()[1:]
    engine = record.served.engine if record.served else profile.server.engine
    phase = explain(text, engine).last_phase
    serving = ""
    if record.alive and phase is not None and phase >= Phase.READY_LOG:
        sample = await serving_of(session, profile, text,
                                  record.served.port if record.served else None)
        serving = serving_words(sample) if sample is not None else ""
    return (phase.label if phase is not None else "—"), serving


async def serving_of(session: Session, profile: Profile, text: Sequence[str],
                     port: int | None = None) -> ServingSample | None:
    """The server's /metrics (asked from its host), with the throughput of its last stats
    line where the metrics need two readings to give it; either alone when that is all."""
    now = time.time()
    logged = next((s for line in reversed(text)
                   if (s := parse_log_line(line, now)) is not None), None)
    try:
        reply = await launcher.http(session, profile, "/metrics", timeout=3.0, port=port)
    except SpecconsoleError:
        return logged
    scraped = ServingReadout().feed_metrics(reply.body, now) if reply.status == 200 else None
    if scraped is None or logged is None:
        return scraped or logged
    return replace(scraped, prompt_tps=scraped.prompt_tps or logged.prompt_tps,
                   gen_tps=scraped.gen_tps or logged.gen_tps)


async def member_lines(name: str, member: Member, every: bool, now: float) -> list[RunLine]:
    sup = member.sup
    host = member.host if member.role == "server" else f"{member.host} {member.role}"
    try:
        session = await sup.connect()
        records = await launcher.list_runs(session, sup.profile)
        lines = []
        for r in chosen(records, every):
            if sup.profile.slurm is not None:  # on the job's node: the scheduler's word
                lines.append(await job_line(session, sup.profile, name, host, r, now))
                continue
            phase, serving = await phase_of(session, r, sup.profile)
            lines.append(RunLine(name, host, r.run_id, run_state(r.alive, r.exit), phase,
                                 duration(max(0.0, now - r.started)) if r.started else "—",
                                 serving=serving if member.role == "server" else ""))
    except SpecconsoleError as exc:  # "host unreachable: …", "authentication refused: …"
        return [RunLine(name, host, problem=f"{exc.title}: {exc}")]
    except OSError as exc:
        return [RunLine(name, host, problem=f"cannot be reached: {exc}")]
    finally:
        await sup.close()
    return lines or [RunLine(name, host)]


async def job_line(session: Session, profile: Profile, name: str, host: str,
                   record: RunRecord, now: float) -> RunLine:
    """A run launched as a Slurm job: its state is the job's as the scheduler tells it (the
    run's processes are on the job's node, not on the login node), with the time left; the
    phase from its log (the run directory is shared with the node)."""
    job_id = await remote_slurm.job_of(session, profile, record.run_dir)
    job = await remote_slurm.show_job(session, job_id) if job_id is not None else None
    state = (job_words(job, datetime.fromtimestamp(now)) if job is not None
             else f"job {job_id} (forgotten by the scheduler)" if job_id is not None
             else "no Slurm job recorded")
    phase, _ = await phase_of(session, replace(record, alive=False), profile)
    age = duration(max(0.0, now - record.started)) if record.started else "—"
    return RunLine(name, host, record.run_id, state, phase, age)


async def status_lines(runs: Sequence[Run], *, every: bool) -> tuple[list[str], bool]:
    """Every member of every run, asked at once; False when a host could not be reached."""
    now = time.time()
    found = await asyncio.gather(*(member_lines(run.name, m, every, now)
                                   for run in runs for m in run.members))
    lines = [line for group in found for line in group]
    return format_lines(lines), not any(line.problem for line in lines)
