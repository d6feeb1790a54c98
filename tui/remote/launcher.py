"""Launch, find, preflight and kill runs on a host through the agent.

What to run comes from the pure core (tui.core.command); this module only turns a profile into
agent specs and the agent's answers into typed results.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tui.core.command import (
    SIM_GPU_STATE_ENV,
    build_server_argv,
    host_python,
    known_secrets,
    new_run_id,
    resolve_secrets,
    secret_checks,
    served_by,
    sim_agent_env,
)
from tui.core.container import (
    container_checks,
    container_spec,
    inside_profile,
    preflight_spec,
)
from tui.core.errors import AgentError
from tui.core.profile import Profile
from tui.core.protocol import (
    AgentFault,
    BoxLeftover,
    Check,
    GpuHolder,
    HttpReply,
    Killed,
    KillStep,
    Launched,
    Leftover,
    Preflight,
    RunRecord,
    Runs,
    Stack,
    StacksDone,
)
from tui.core.specconfig import speculative_checks
from tui.remote.agent_link import AgentTarget, call_agent, stream_agent
from tui.remote.interface import Session


def agent_target(profile: Profile) -> AgentTarget:
    """The agent's interpreter; a simulated run's agent also gets the stand-in NVML and the
    simulated GPUs' state the profile names (tui.core.command.sim_agent_env)."""
    return AgentTarget(host_python(profile), sim_agent_env(profile, os.environ))


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything sent to the host for one launch; `secrets` (known_secrets) never leave this
    process in logs, and the agent redacts them from launch.json."""

    run_id: str
    argv: list[str]
    env: dict[str, str]
    secrets: tuple[str, ...]
    # [container]: how the agent starts it (tui.core.container.container_spec); argv then is
    # the server's command inside the container
    container: dict[str, Any] | None = None


def plan_launch(profile: Profile, environ: Mapping[str, str],
                now: float | None = None) -> LaunchPlan:
    secrets = resolve_secrets(profile, environ)
    env = {"PYTHONUNBUFFERED": "1", **profile.server.env, **secrets}
    if SIM_GPU_STATE_ENV in (sim := sim_agent_env(profile, environ)):
        env[SIM_GPU_STATE_ENV] = sim[SIM_GPU_STATE_ENV]
    run_id = new_run_id(profile.name, now if now is not None else time.time())
    box = profile.container
    known = known_secrets(profile, environ)
    if box is None:
        return LaunchPlan(run_id, build_server_argv(profile, host_python(profile)), env, known)
    argv = build_server_argv(inside_profile(profile), box.python)
    return LaunchPlan(run_id, argv, env, known,
                      container_spec(profile, run_id, argv, env, known))


async def launch(session: Session, profile: Profile, plan: LaunchPlan) -> Launched:
    spec = {"run_id": plan.run_id, "runs_dir": profile.host.runs_dir,
            "profile_key": profile.key, "argv": plan.argv, "env": plan.env,
            "redact": list(plan.secrets), "cwd": profile.host.workdir,
            "served": served_by(profile).to_wire(), "container": plan.container}
    # a container's image absent on the host: the launch returns as its pull starts, which
    # the watch then shows (the phase "pulling image")
    for ev in await call_agent(session, agent_target(profile), "launch", spec, 120):
        if isinstance(ev, Launched):
            return ev
    raise AgentError(session.host, "the agent did not confirm the launch")


async def attach(session: Session, profile: Profile, now: float) -> RunRecord:
    """The run record of the server `profile.attach` names (tui.core.attach): made by the
    agent without launching anything, or the live one a previous attach made."""
    target = profile.attach
    if target is None:
        raise ValueError(f"{profile.key} names nothing to attach to")
    spec = {"runs_dir": profile.host.runs_dir, "run_id": new_run_id(profile.name, now),
            "profile_key": profile.key, "target": target.to_wire(),
            "served": served_by(profile).to_wire(),
            "redact": list(known_secrets(profile, os.environ))}
    for ev in await call_agent(session, agent_target(profile), "attach", spec):
        if isinstance(ev, Runs) and ev.runs:
            return ev.runs[0]
    raise AgentError(session.host, "the agent did not confirm the attach")


async def http(session: Session, profile: Profile, path: str,
               body: dict[str, Any] | None = None, timeout: float = 30.0,
               port: int | None = None) -> HttpReply:
    """One request to the server, made from the GPU host (the port need not be reachable from
    here): GET, or POST of `body` as JSON; on `port` (a run's, as launched), else the
    profile's."""
    spec = {"port": port or profile.server.port, "path": path, "json": body,
            "timeout": timeout}
    for ev in await call_agent(session, agent_target(profile), "http", spec):
        if isinstance(ev, HttpReply):
            return ev
    raise AgentError(session.host, "the agent did not answer the request")


async def list_runs(session: Session, profile: Profile) -> tuple[RunRecord, ...]:
    spec = {"runs_dir": profile.host.runs_dir, "profile_key": profile.key}
    for ev in await call_agent(session, agent_target(profile), "runs", spec):
        if isinstance(ev, Runs):
            return ev.runs
    return ()


async def latest_run(session: Session, profile: Profile) -> RunRecord | None:
    runs = await list_runs(session, profile)
    return runs[0] if runs else None


async def preflight(session: Session, profile: Profile) -> tuple[Check, ...]:
    pf = profile.preflight
    spec = {
        "compile_files": list(pf.compile_files) if pf.compile else [],
        "engine_package": profile.server.engine if pf.compile and pf.engine_package
        and profile.simulate is None else None,
        "check_gpus": pf.gpus_free,
        "runs_dir": profile.host.runs_dir,  # to tell a leftover of an ended run from a live one
        "port": profile.server.port if pf.port_free else None,
        "paths": _paths_to_check(profile) if pf.paths_exist else [],
        # "GPUs free" covers "enough GPUs": a CPU-only profile switches both off
        "expect_gpus": profile.server.tensor_parallel_size if pf.gpus_free else None,
        "stacks": profile.expect.stacks_on_stall,  # is py-spy there to take them?
        "container": preflight_spec(profile),  # the runtime, the image, leftover containers
    }
    for ev in await call_agent(session, agent_target(profile), "preflight", spec):
        if isinstance(ev, Preflight):
            return (ev.checks + container_checks(profile) + speculative_checks(profile)
                    + secret_checks(profile))
    raise AgentError(session.host, "the agent did not answer the preflight")


def _paths_to_check(profile: Profile) -> list[str]:
    if profile.simulate is not None or profile.server.command:
        return []
    paths = [profile.server.model] if profile.server.model else []
    spec = profile.server.speculative
    if spec is not None and spec.model:
        paths.append(spec.model)
    return [p for p in paths if p.startswith(("/", "~", "."))]


async def kill(session: Session, profile: Profile, run_dir: str, grace: float,
               on_step: Callable[[KillStep], None] | None = None,
               ) -> tuple[list[KillStep], Killed]:
    """TERM, KILL after the grace, sweep; each step reported to `on_step` as it happens (the
    user watches the escalation), then what remains."""
    return await _kill(session, profile, "kill", {"run_dir": run_dir, "grace": grace}, grace,
                       on_step)


async def kill_holders(session: Session, profile: Profile, leftovers: Sequence[Leftover],
                       grace: float, on_step: Callable[[KillStep], None] | None = None,
                       ) -> tuple[list[KillStep], Killed]:
    """Kill exactly these leftovers the preflight named: the agent signals a GPU holder only
    while it is the same process (pid and start time) and still holds GPU memory, and stops
    then removes a container only while it still carries the same run id."""
    targets = [{"pid": x.pid, "start_ticks": x.start_ticks} for x in leftovers
               if isinstance(x, GpuHolder)]
    boxes = [{"runtime": x.runtime, "id": x.id, "run_id": x.run_id} for x in leftovers
             if isinstance(x, BoxLeftover)]
    return await _kill(session, profile, "kill_pids",
                       {"targets": targets, "containers": boxes, "grace": grace}, grace,
                       on_step)


async def _kill(session: Session, profile: Profile, command: str, spec: dict[str, Any],
                grace: float, on_step: Callable[[KillStep], None] | None,
                ) -> tuple[list[KillStep], Killed]:
    steps: list[KillStep] = []

    async def run() -> Killed | None:
        async for ev in stream_agent(session, agent_target(profile), command, spec):
            if isinstance(ev, KillStep):
                steps.append(ev)
                if on_step is not None:
                    on_step(ev)
            elif isinstance(ev, Killed):
                return ev
            elif isinstance(ev, AgentFault):  # e.g. no NVML to verify with: nothing signalled
                raise AgentError(session.host, f"{ev.kind}: {ev.message}")
        return None

    try:
        killed = await asyncio.wait_for(run(), grace + 60)
    except asyncio.TimeoutError:
        killed = None
    if killed is None:
        raise AgentError(session.host, "the agent did not report the end of the kill")
    return steps, killed


async def stacks(session: Session, profile: Profile, run_dir: str, native: bool = False,
                 ) -> tuple[list[Stack], StacksDone]:
    """py-spy's dump of every process of the run, and where the host saved them."""
    got: list[Stack] = []
    async for ev in stream_agent(session, agent_target(profile), "stacks",
                                 {"run_dir": run_dir, "native": native}):
        if isinstance(ev, Stack):
            got.append(ev)
        elif isinstance(ev, StacksDone):
            return got, ev
        elif isinstance(ev, AgentFault):
            raise AgentError(session.host, ev.message)
    raise AgentError(session.host, "the agent did not finish the stacks")
