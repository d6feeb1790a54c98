"""Attaching to a server specconsole did not launch (`specconsole attach`): a container started
by someone else (`docker run`, compose) or a bare process (by hand, by systemd).

The target is given on the command line, not in a profile file: a pid or a colleague's
container is a thing of the moment, and a profile's [container] keys (image, gpus, volumes)
all say how to *start* one.  The command line's words become an in-memory Profile whose
`attach` names the target, so the supervisor, the console and `wait`/`status`/`logs`/`kill`
follow it on the paths a launched run takes; only the launch is replaced by the agent's
`attach`, which records a run directory for it without starting anything.
"""

from __future__ import annotations

from tui.core.profile import (
    AttachTarget,
    HostConfig,
    PreflightConfig,
    Profile,
    ServerConfig,
    SmokeConfig,
)
from tui.core.protocol import AttachedFacts
from tui.core.units import duration


def attach_profile(target: AttachTarget, *, host: str = "local", engine: str = "vllm",
                   port: int = 8000, runs_dir: str | None = None,
                   python: str | None = None) -> Profile:
    """The in-memory profile of an attached server: its host, engine (which reads its log) and
    port (health probes); no preflight and no smoke request (the server is someone else's)."""
    host_config = HostConfig(target=host, python=python,
                             **({"runs_dir": runs_dir} if runs_dir else {}))
    return Profile(path=f"<attach {target.label}>", name=target.label, host=host_config,
                   server=ServerConfig(engine=engine, model="(attached)", port=port),
                   preflight=PreflightConfig(enabled=False), smoke=SmokeConfig(enabled=False),
                   attach=target)


def attached_words(facts: AttachedFacts, now: float) -> str:
    """Whose the attached server is, for the confirmation before a kill: "container vllm-a
    (image vllm/vllm-openai, compose project infer), started 2h04m ago, runs as user alice —
    not launched by specconsole"."""
    started = facts.started
    ago = f", started {duration(max(0.0, now - started))} ago" if started is not None else ""
    user = f", runs as user {facts.user}" if facts.user else ""
    if facts.kind == "container":
        extra = [f"image {facts.image}"] if facts.image else []
        if facts.compose:
            extra.append(f"compose project {facts.compose}")
        detail = f" ({', '.join(extra)})" if extra else ""
        what = f"container {facts.name or facts.id or '?'}{detail}"
    else:
        cmd = facts.cmd
        what = f"pid {facts.pid}" + (f" ({cmd[:60]})" if cmd else "")
    return f"{what}{ago}{user} — not launched by specconsole"
