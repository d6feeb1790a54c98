"""`specconsole` command line: argparse subcommands over the supervisor and the pure core.

Every user error ends as one line on stderr and a documented exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from tui.cli.cluster import check_cluster, kill_cluster, launch_cluster
from tui.cli.exit_codes import EXIT_ERROR, EXIT_HANGUP, EXIT_PREFLIGHT, EXIT_USAGE
from tui.cli.follow import OneHost, SeveralHosts, follow
from tui.cli.status import run_state, status_lines
from tui.console.heap import QuietCollector, settle_heap
from tui.core.attach import attach_profile
from tui.core.cluster import is_cluster, member_profile
from tui.core.command import redact
from tui.core.describe import gpu_verdict
from tui.core.errors import PreflightFailed, ProfileError, RunNotFound, SpecconsoleError
from tui.core.explain import explain_file, explanation_lines
from tui.core.logline import strip_escapes
from tui.core.profile import (
    ENGINES,
    RUNTIMES,
    AttachTarget,
    Profile,
    load_profile,
    parse_duration,
)
from tui.core.protocol import leftover_words
from tui.core.stacks import stack_lines
from tui.core.state import LinesAdded, State
from tui.supervise.events import Fatal, Notice, RunStarted
from tui.supervise.group import ClusterRun, run_of
from tui.supervise.history import History, diff
from tui.supervise.runs import HANGUP_SIGNALS, Run
from tui.supervise.supervisor import Supervisor


def _err(message: str) -> None:
    print(f"specconsole: {message}", file=sys.stderr)


class _Printer:
    """One line per event, prefixed with the time since the command started (or JSON)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.t0 = time.monotonic()

    def say(self, text: str, **fields: Any) -> None:
        text = strip_escapes(text)  # process names and remote text never drive the terminal
        if self.as_json:
            print(json.dumps({"t": round(time.monotonic() - self.t0, 3), "msg": text, **fields}),
                  flush=True)
        else:
            print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", flush=True)


# -- wait ------------------------------------------------------------------------------------

def _notices_so_far(events: asyncio.Queue[Any]) -> list[str]:
    """The notices queued while starting, in order; the other events before the run began
    print nothing, so they are taken off the queue with them."""
    texts = []
    while not events.empty():
        event = events.get_nowait()
        if isinstance(event, Notice):
            texts.append(event.text)
        elif isinstance(event, RunStarted):
            break
    return texts


def _leftovers_hint(sup: Supervisor, how: str) -> str:
    """When leftovers of ended runs hold the GPUs: which, and how to clear them."""
    offered = sup.leftovers()
    if not offered:
        return ""
    return (f"leftovers of ended runs hold the GPUs ({leftover_words(offered)}): {how} kills "
            "exactly them, then launches")


def _refused(sup: Supervisor, exc: PreflightFailed) -> PreflightFailed:
    """The refusal, with the flag that clears leftovers when they are what refused."""
    hint = _leftovers_hint(sup, "adding --kill-leftovers")
    return PreflightFailed(f"{exc} — {hint}") if hint else exc


async def cmd_wait(args: argparse.Namespace) -> int:
    profile = _profile(args.profile)
    if is_cluster(profile):
        group = ClusterRun(profile, history=History())
        try:
            return await follow(SeveralHosts(group), args, _Printer(args.json).say,
                                past_ready=args.until == "dead")
        finally:
            await group.close()
    sup = Supervisor(profile, history=History())
    try:
        return await follow(OneHost(sup), args, _Printer(args.json).say,
                            past_ready=args.until == "dead")
    except PreflightFailed as exc:
        raise _refused(sup, exc) from None
    finally:
        await sup.close()


async def cmd_launch(args: argparse.Namespace) -> int:
    profile = _profile(args.profile)
    if is_cluster(profile):
        group = ClusterRun(profile, history=History())
        try:
            return await launch_cluster(group, args)
        finally:
            await group.close()
    sup = Supervisor(profile, history=History())
    events = sup.subscribe()
    try:
        run = await sup.launch(skip_preflight=args.skip_preflight,
                               kill_leftovers=args.kill_leftovers)
        for text in _notices_so_far(events):
            print(strip_escapes(text))
        pid = f"pulling image {run.pulling} first, pid {run.pid}" if run.pulling \
            else f"pid {run.pid}"
        print(f"launched run {run.run_id} on {sup.profile.host.target} ({pid}); "
              f"follow it with: specconsole wait {args.profile}")
        return 0
    except PreflightFailed as exc:
        raise _refused(sup, exc) from None
    finally:
        await sup.close()


# -- status, kill, logs, check -----------------------------------------------------------------

async def cmd_status(args: argparse.Namespace) -> int:
    """A line per run and per host: of the profile named (its newest runs), else of every
    profile in the profile directories (their live runs and the newest one)."""
    paths = [Path(args.profile)] if args.profile else list_profiles()
    if not paths:
        _err("no profile given and none in ./profiles or ~/.config/specconsole/profiles")
        return EXIT_USAGE
    code = 0
    runs = []
    for path in paths:
        try:
            runs.append(run_of(_profile(str(path))))
        except SpecconsoleError as exc:  # a bad profile: bad input (2), like every command
            _err(str(exc))
            code = EXIT_USAGE
    lines, reached = await status_lines(runs, every=bool(args.profile))
    for line in lines:
        print(line)
    return code or (0 if reached else EXIT_ERROR)


async def cmd_kill(args: argparse.Namespace) -> int:
    profile = _chosen(args)
    if is_cluster(profile):
        group = ClusterRun(profile)
        try:
            return await kill_cluster(group, args.grace)
        finally:
            await group.close()
    sup = Supervisor(profile)
    try:
        record = await sup.select()
        owner = sup.run.owner if sup.run is not None else None
        if owner is not None and not args.yes:  # someone else's server: never on a guess
            _err(f"{owner}: not killed; add --yes to kill it")
            return EXIT_USAGE
        job = sup.job
        if job is not None and job.script is None:  # someone else's job: the scheduler's kill
            print(f"cancelling job {job.job_id} (scancel): the scheduler ends its processes "
                  f"on {job.node or '?'}")
            await sup.kill(args.grace)
            print(f"job {job.job_id} has left the queue: its node's slurmd saw every process "
                  "of it end; GPU memory: not read (the node is no longer reached)")
            return 0
        state = "" if record.alive else f" (already ended: {run_state(False, record.exit)};" \
            " sweeping for leftovers)"
        print(f"killing run {record.run_id}{state}: TERM, KILL after {args.grace:g}s, "
              "then sweep by run id")
        killed = await sup.kill(args.grace)
        for step in sup.last_kill_steps:
            print(f"  {step.step}: {', '.join(map(str, step.pids)) or 'nothing to signal'}")
        if killed.remaining:
            print(f"STILL RUNNING: {', '.join(map(str, killed.remaining))}")
            return EXIT_ERROR
        released, gpu = gpu_verdict(killed)
        print(f"no process of the run remains; {gpu}")
        return 0 if released else EXIT_ERROR
    finally:
        await sup.close()


async def cmd_stacks(args: argparse.Namespace) -> int:
    """py-spy's stacks of every process of the profile's live run, read on its host (saved
    there too), where each is stuck first."""
    profile = _profile(args.profile)
    if is_cluster(profile):
        profile = member_profile(profile, args.member)
    sup = Supervisor(profile)
    try:
        record = await sup.select()
        if not record.alive:
            raise RunNotFound(f"run {record.run_id} has ended: no process to take stacks of")
        taken = await sup.stacks(native=args.native)
        print(strip_escapes(f"stacks of run {record.run_id}: {len(taken.stacks)} processes, "
                            f"saved on {profile.host.target} in {taken.path}"))
        for stack in taken.stacks:
            print(strip_escapes(f"  {stack.summary()}"))
        for stack in taken.stacks:
            print()
            for _, text in stack_lines(stack):
                print(strip_escapes(text))
        return 0
    finally:
        await sup.close()


async def cmd_logs(args: argparse.Namespace) -> int:
    """The run's log through the agent (which knows the secrets to redact, even when this
    shell does not): up to its size when asked, or followed. A multi-host profile's log is
    one member's (--member, the server's by default)."""
    profile = _chosen(args)
    if is_cluster(profile):
        profile = member_profile(profile, args.member)
    sup = Supervisor(profile, whole_log=True)
    events = sup.subscribe()
    try:
        record = await sup.select()
        size = None
        if not args.follow:
            result = await (await sup.connect()).run(
                ["stat", "-L", "-c", "%s", f"{record.run_dir}/server.log"])
            size = int(result.stdout or b"0") if result.returncode == 0 else 0
            if size == 0:
                return 0
        await sup.attach(record)
        while True:
            event = await events.get()
            if isinstance(event, LinesAdded):
                chunk = event.chunk
                for i in range(len(chunk)):
                    _print_line(chunk.line(i).plain, chunk.rule(i), args.raw, sup.secrets)
                # log_end moves a whole chunk at a time, before its lines are queued: the
                # end is reached once they are all printed
                if size is not None and sup.log_end >= size and events.empty():
                    return 0
            elif isinstance(event, Fatal):
                _err(event.text)
                return EXIT_ERROR
    finally:
        await sup.close()


def _print_line(text: str, rule: Any, raw: bool, secrets: Sequence[str]) -> None:
    """A log line as text: hidden by a rule unless raw, a harmless one labelled."""
    if raw or rule is None or rule.kind == "harmless":
        label = f"  [{rule.label}]" if rule is not None and rule.kind == "harmless" else ""
        print(redact(text, secrets) + label, flush=True)


async def cmd_check(args: argparse.Namespace) -> int:
    profile = _profile(args.profile)
    if is_cluster(profile):
        group = ClusterRun(profile)
        try:
            return await check_cluster(group)
        finally:
            await group.close()
    sup = Supervisor(profile)
    try:
        try:
            checks = await sup.run_preflight()
        except PreflightFailed:
            checks = sup.last_checks
            _print_checks(checks)
            hint = _leftovers_hint(sup, f"`specconsole launch {args.profile} --kill-leftovers`")
            if hint:
                print(hint)
            return EXIT_PREFLIGHT
        _print_checks(checks)
        return 0
    finally:
        await sup.close()


def _print_checks(checks: Sequence[Any]) -> None:
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.severity == "error" else "warn")
        print(f"{mark} {c.check}: {c.message}")


# -- attach ------------------------------------------------------------------------------------

async def cmd_attach_wait(args: argparse.Namespace) -> int:
    """`attach --wait`: follow the attached server as `wait` follows a launched one."""
    sup = Supervisor(_chosen(args), history=History())
    ns = argparse.Namespace(launch=False, skip_preflight=True, kill_leftovers=False,
                            timeout=args.timeout, json=args.json)
    try:
        return await follow(OneHost(sup), ns, _Printer(args.json).say,
                            past_ready=args.until == "dead")
    finally:
        await sup.close()


def cmd_attach(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    """Watch a server specconsole did not launch: the console, or `--wait` as `wait` does."""
    if args.wait:
        return cmd_attach_wait(args)
    profile = _chosen(args)
    return _run_console([run_of(profile, history=History())], launch=False,
                        profile_args=[profile.name])


def _chosen(args: argparse.Namespace) -> Profile:
    """The profile named, or the in-memory one of `--container`/`--pid` (tui.core.attach)."""
    container, pid = getattr(args, "container", None), getattr(args, "pid", None)
    job = getattr(args, "slurm_job", None)
    if container is None and pid is None and job is None:
        if not getattr(args, "profile", None):
            raise ProfileError("<command line>", "name a profile, or --container/--pid/"
                                                 "--slurm-job")
        return _profile(args.profile)
    if getattr(args, "profile", None):
        raise ProfileError("<command line>", "a profile or --container/--pid/--slurm-job, "
                                             "not both")
    if pid is not None and pid <= 1:
        raise ProfileError("<command line>", f"--pid must be a process id above 1 (got {pid})")
    if job is not None and not job.isdigit():
        raise ProfileError("<command line>", f"--slurm-job must be a job id (got {job!r})")
    target = AttachTarget(container=container, pid=pid, runtime=args.runtime, log=args.log,
                          slurm_job=job)
    return attach_profile(target, host=args.host, engine=args.engine, port=args.port,
                          runs_dir=args.runs_dir, python=args.python)


def _target_args(sp: argparse.ArgumentParser, required: bool = False) -> None:
    """--container/--pid and how to reach and read the server: attach's words, also taken by
    kill, logs and status (in place of a profile)."""
    which = sp.add_mutually_exclusive_group(required=required)
    which.add_argument("--container", help="a running container's name or id (not launched "
                                           "by specconsole: docker run, compose)")
    which.add_argument("--pid", type=int, help="a server process on the host (started by hand, "
                                               "by systemd)")
    which.add_argument("--slurm-job", metavar="J", help="a running Slurm job someone submitted: "
                                                        "its server, found on its node (--host: "
                                                        "the login node)")
    sp.add_argument("--host", default="local", help="where it runs: an SSH target, or local")
    sp.add_argument("--engine", default="vllm", choices=ENGINES, help="whose log it is")
    sp.add_argument("--port", type=int, default=8000, help="the server's port (health)")
    sp.add_argument("--runtime", default="docker", choices=RUNTIMES)
    sp.add_argument("--log", help="--pid: its log file (else the file its stdout goes to)")
    sp.add_argument("--runs-dir", help="where the attached run's record is kept on the host")
    sp.add_argument("--python", help="the host's Python for the agent")


# -- history -----------------------------------------------------------------------------------

def cmd_history(args: argparse.Namespace) -> int:
    """Past launches (newest first), or what changed between two of them."""
    history = History()
    try:
        return _history(history, args)
    except LookupError as exc:
        _err(str(exc).strip("'\""))
        return EXIT_USAGE
    except (sqlite3.Error, OSError) as exc:
        _err(f"{history.path}: {exc}")
        return EXIT_ERROR


def _history(history: History, args: argparse.Namespace) -> int:
    if args.diff:
        a, b = (history.get(run_id) for run_id in args.diff)
        missing = [r for r, x in zip(args.diff, (a, b), strict=True) if x is None]
        if missing or a is None or b is None:
            _err(f"no launch {', '.join(missing)} in {history.path}")
            return EXIT_USAGE
        changes = diff(a, b)
        print(f"{a.run_id} → {b.run_id}")
        for line in changes or ["nothing changed"]:
            print(f"  {line}")
        return 0
    key = _profile(args.profile).key if args.profile else None
    launches = history.launches(key, limit=args.limit)
    if not launches:
        print(f"no launches recorded{' of ' + key if key else ''} ({history.path})")
        return 0
    for launch in launches:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(launch.started))
        version = f" vllm {launch.engine_version}" if launch.engine_version else ""
        job = f"  {launch.job_summary()}" if launch.job_id is not None else ""
        print(strip_escapes(f"{when}  {launch.run_id}  {launch.profile}{version}  "
                            f"{launch.summary()}{job}"))
    return 0


# -- explain, demo ---------------------------------------------------------------------------

def cmd_explain(args: argparse.Namespace) -> int:
    path = Path(args.logfile)
    survived: frozenset[str] = frozenset()
    if args.profile is not None:  # what its good launches survived is no cause
        profile = _profile(args.profile)
        history = History()
        try:
            survived = history.survived(profile.key, profile.host.target)
        except (sqlite3.Error, OSError) as exc:
            _err(f"launch history not read ({history.path}): {exc}; explaining without it")
    try:
        with _progress(path) as advance:
            result = explain_file(path, engine=args.engine, on_progress=advance,
                                  survived=survived)
    except OSError as exc:
        _err(f"{path}: {exc.strerror}")
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
        return 0
    for line in explanation_lines(result):
        print(line)
    for rule, count in sorted(result.hidden.items()):
        print(f"hidden:        {count:6d}  {rule}")
    return 0


@contextlib.contextmanager
def _progress(path: Path) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar (rich's) on stderr while a big file is read, only on a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console  # here, not at the top: every command pays for a top import
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    with Progress("explain", BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(path.name, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


async def cmd_demo_headless(args: argparse.Namespace) -> int:
    """The demo as `wait` prints it: for scripts, CI and terminals without a screen."""
    from tui.sim.demo import demo_profile

    profile = demo_profile(args.scenario, args.time_scale, args.engine)
    sup = Supervisor(profile, history=History())
    out = _Printer(False)
    try:
        # engine-killed dies while serving: keep watching past READY to show the death
        ns = argparse.Namespace(launch=True, skip_preflight=False, timeout=None,
                                kill_leftovers=False)
        with _cancelled_on_hangup() as hung_up:
            try:
                code = await follow(OneHost(sup), ns, out.say,
                                    past_ready=args.scenario == "engine-killed")
            except asyncio.CancelledError:
                if not hung_up:
                    raise
                return EXIT_HANGUP
        if sup.machine.state is State.READY:
            out.say("the simulated server is serving; stopping it (the demo cleans up)")
        return code
    finally:
        if sup.run is not None:  # even on Ctrl-C: the demo leaves nothing running
            await asyncio.shield(sup.kill(2.0))
        await sup.close()


@contextlib.contextmanager
def _cancelled_on_hangup() -> Iterator[list[int]]:
    """SIGHUP (the terminal gone) or SIGTERM cancel the current task, so that its `finally`
    cleans up; the list it yields holds the signal once one came."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    came: list[int] = []

    def hung_up(signum: int) -> None:
        came.append(signum)
        task.cancel()

    for signum in HANGUP_SIGNALS:
        loop.add_signal_handler(signum, hung_up, signum)
    try:
        yield came
    finally:
        for signum in HANGUP_SIGNALS:
            loop.remove_signal_handler(signum)


def cmd_demo(args: argparse.Namespace) -> int | Coroutine[Any, Any, int]:
    if args.headless:
        return cmd_demo_headless(args)
    from tui.sim.demo import demo_profile

    profile = demo_profile(args.scenario, args.time_scale, args.engine)
    return _run_console([run_of(profile, history=History())], launch=True, demo=True,
                        kill_grace=2.0, profile_args=[
                            f"demo --engine {args.engine} --scenario {args.scenario}"])


# -- the console -----------------------------------------------------------------------------

def cmd_console(args: argparse.Namespace) -> int:
    """`specconsole PROFILE`: attach to its live run or preflight and launch; several
    profiles: the same for each, in the fleet view; no profile: pick one from the profile
    directories."""
    names: list[str] = args.profile
    if not names:
        from tui.console.screens.picker import PickerApp

        chosen = PickerApp(list_profiles()).run()
        if chosen is None:
            return 0
        names = [str(chosen)]
    history = History()
    runs = [run_of(_profile(name), history=history) for name in names]
    keys = [m.sup.profile.key for run in runs for m in run.members]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        _err(f"{', '.join(twice)} named twice: one console watches a run once")
        return EXIT_USAGE
    return _run_console(runs, launch=not args.no_launch, kill_leftovers=args.kill_leftovers,
                        profile_args=names)


def _run_console(runs: list[Run], *, launch: bool, profile_args: list[str], demo: bool = False,
                 kill_grace: float = 10.0, kill_leftovers: bool = False) -> int:
    from tui.console.app import ConsoleApp

    heap = QuietCollector()
    app = ConsoleApp(runs, launch=launch, demo=demo, kill_grace=kill_grace,
                     profile_arg=profile_args, kill_leftovers=kill_leftovers, heap=heap)
    settle_heap()
    try:
        with heap:  # full collections at quiet moments while the console runs
            message = app.run()
    finally:
        if demo and not app.demo_stopped:  # the demo leaves nothing running, even on ^C
            for member in (m for run in runs for m in run.members if m.sup.run is not None):
                asyncio.run(_stop_demo(member.sup.profile))
    with contextlib.suppress(OSError):  # after a hangup there is no terminal to say it on
        for line in (message or "").splitlines():
            print(f"specconsole: {strip_escapes(line)}")
    return app.return_code or 0


async def _stop_demo(profile: Profile) -> None:
    sup = Supervisor(profile)
    try:
        await sup.select()
        await sup.kill(2.0)
    except SpecconsoleError as exc:
        _err(f"could not stop the simulated server: {exc}")
    finally:
        await sup.close()


def list_profiles() -> list[Path]:
    """Every profile in ./profiles and ~/.config/specconsole/profiles, by name."""
    return sorted((p for d in PROFILE_DIRS if d.is_dir() for p in d.glob("*.toml")),
                  key=lambda p: (p.stem, str(p)))


# -- parsing ---------------------------------------------------------------------------------

COMMANDS = ("launch", "wait", "status", "kill", "logs", "stacks", "check", "explain", "history",
            "demo", "console", "attach")
PROFILE_DIRS = (Path("profiles"), Path("~/.config/specconsole/profiles").expanduser())


def _profile(name: str) -> Profile:
    """A profile by path, or by name from ./profiles or ~/.config/specconsole/profiles."""
    path = Path(name)
    if not path.exists() and path.parent == Path("."):
        stem = path.name.removesuffix(".toml")
        path = next((d / f"{stem}.toml" for d in PROFILE_DIRS if (d / f"{stem}.toml").exists()),
                    path)
    return load_profile(path)


def _duration_arg(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0 (got {text!r})")
    return seconds


def _grace_arg(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds (got {text})")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specconsole",
        description="Launch and supervise LLM inference servers on GPU hosts over SSH.",
        epilog="exit codes: 0 ready, 1 error, 2 bad input, 3 dead, 4 timeout, 5 stalled, "
               "6 preflight refused")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help_: str, fn: Callable[..., Any]) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(fn=fn)
        return sp

    sp = add("launch", "preflight, then start the server detached on its host",
             cmd_launch)
    sp.add_argument("profile")
    sp.add_argument("--skip-preflight", action="store_true")
    sp.add_argument("--kill-leftovers", action="store_true",
                    help="when leftovers of ended runs hold the GPUs, kill exactly them first")

    sp = add("wait", "follow the run until ready (0), dead (3), timeout, stall",
             cmd_wait)
    sp.add_argument("profile")
    sp.add_argument("--launch", action="store_true", help="launch when no run is alive")
    sp.add_argument("--until", choices=["ready", "dead"], default="ready",
                    help="ready: exit at READY (0); dead: watch on past READY until the run "
                         "dies (3) or stalls (5), for scripts and alerts")
    sp.add_argument("--timeout", type=_duration_arg, default=None,
                    help="give up after this long (in place of expect.ready_timeout), e.g. 40m")
    sp.add_argument("--json", action="store_true", help="one JSON object per line")
    sp.add_argument("--skip-preflight", action="store_true")
    sp.add_argument("--kill-leftovers", action="store_true",
                    help="when leftovers of ended runs hold the GPUs, kill exactly them first")

    sp = add("status", "a line per run and host (one profile, or all of them)", cmd_status)
    sp.add_argument("profile", nargs="?")

    sp = add("kill", "TERM the run, KILL after the grace, sweep by run id",
             cmd_kill)
    sp.add_argument("profile", nargs="?")
    sp.add_argument("--grace", type=_grace_arg, default=10.0, help="seconds between TERM and KILL")
    sp.add_argument("--yes", action="store_true",
                    help="an attached server (not launched by specconsole): kill it anyway")
    _target_args(sp)

    sp = add("attach", "watch a server specconsole did not launch: a container or a pid",
             cmd_attach)
    _target_args(sp, required=True)
    sp.add_argument("--wait", action="store_true", help="no console: follow it as `wait` does")
    sp.add_argument("--until", choices=["ready", "dead"], default="ready")
    sp.add_argument("--timeout", type=_duration_arg, default=None)
    sp.add_argument("--json", action="store_true", help="--wait: one JSON object per line")

    sp = add("logs", "the run's log, noise-filtered (or --raw); --follow",
             cmd_logs)
    sp.add_argument("profile", nargs="?")
    _target_args(sp)
    sp.add_argument("--raw", action="store_true")
    sp.add_argument("--follow", action="store_true")
    sp.add_argument("--member", default="server",
                    help="several hosts: whose log (server, ray-head, ray-node-1, node-1, ...)")

    sp = add("stacks", "py-spy the Python stacks of every process of the live run", cmd_stacks)
    sp.add_argument("profile")
    sp.add_argument("--native", action="store_true", help="native frames too (py-spy --native)")
    sp.add_argument("--member", default="server",
                    help="several hosts: whose processes (server, ray-head, node-1, ...)")

    sp = add("check", "run the profile's preflight checks only", cmd_check)
    sp.add_argument("profile")

    sp = add("explain", "post-mortem of a saved log: outcome, phase, root cause",
             cmd_explain)
    sp.add_argument("logfile")
    sp.add_argument("--engine", default="vllm", choices=ENGINES)
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--profile", help="the profile the log is of: errors its launches logged "
                    "and survived to READY (the launch history) are not taken for the cause")

    sp = add("history", "past launches and how they ended; --diff A B: what changed",
             cmd_history)
    sp.add_argument("profile", nargs="?")
    sp.add_argument("--diff", nargs=2, metavar=("A", "B"), help="two run ids (or prefixes)")
    sp.add_argument("--limit", type=int, default=20)

    sp = add("demo", "the simulated engine, locally: no GPU, no SSH, no setup",
             cmd_demo)
    sp.add_argument("--scenario", default="ready",
                    choices=["ready", "syntax-error", "oom", "hang", "engine-killed"])
    sp.add_argument("--engine", default="vllm", choices=ENGINES,
                    help="the server the simulated engine plays")
    sp.add_argument("--time-scale", type=float, default=75.0)
    sp.add_argument("--headless", action="store_true",
                    help="print the story line by line instead of opening the console")

    sp = add("console", "the console (the default): one profile, or a fleet of several",
             cmd_console)
    sp.add_argument("profile", nargs="*")
    sp.add_argument("--no-launch", action="store_true",
                    help="attach to the newest run only; never launch")
    sp.add_argument("--kill-leftovers", action="store_true",
                    help="when leftovers of ended runs hold the GPUs, kill exactly them first")
    return p


def _with_default_command(argv: list[str], commands: set[str]) -> list[str]:
    """`specconsole` → the picker, `specconsole PROFILE [...]` → `console PROFILE [...]`."""
    if not argv:
        return ["console"]
    if argv[0] not in commands and not argv[0].startswith("-"):
        return ["console", *argv]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_with_default_command(
        list(sys.argv[1:] if argv is None else argv), set(COMMANDS)))
    try:
        result = args.fn(args)
        if isinstance(result, Coroutine):
            result = asyncio.run(result)
        return int(result)
    except (PreflightFailed, RunNotFound) as exc:
        _err(str(exc))
        return EXIT_PREFLIGHT if isinstance(exc, PreflightFailed) else EXIT_ERROR
    except SpecconsoleError as exc:
        _err(str(exc))
        return EXIT_USAGE if exc.title == "profile error" else EXIT_ERROR
    except KeyboardInterrupt:
        _err("interrupted; the server (if any) keeps running")
        return 130


if __name__ == "__main__":
    sys.exit(main())
