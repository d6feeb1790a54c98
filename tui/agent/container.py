"""A run in a container: started, waited for, stopped and removed through the runtime's CLI
(`docker` or `podman`), so the agent needs nothing but the runtime's client.

The container's processes are host processes: the agent watches them as it watches a bare
server's, from the container's main process (its host pid, recorded as the run's top).  Their
output goes to the host run directory's server.log directly (the directory is bind-mounted and
the command wrapped in `sh -c 'exec "$@" >>LOG 2>&1'`), so the log tail, its byte offsets and
its reconnect guarantees are the bare run's.
"""

from __future__ import annotations

import json
import os
import subprocess

from .rundir import ENV_KEY
from .wire import AgentFailure, SpecError, spec_strings, spec_value

CLI_TIMEOUT = 60.0  # seconds for one quick runtime call (inspect, ps, rm)
# `ps --filter status=` values of a container that has ended or never ran: podman knows no
# "dead" (it refuses the whole call) and says "stopped" before its cleanup makes it "exited"
ENDED = {"docker": ("exited", "created", "dead"), "podman": ("exited", "created", "stopped")}
PULLING = "pulling"  # in the run directory while the monitor pulls the image


class Box:
    """The launch spec's `container` part (built by tui.core.container), checked."""

    def __init__(self, spec: dict) -> None:
        self.runtime = spec_value(spec, "runtime", str)
        if self.runtime not in ("docker", "podman"):
            raise SpecError(f"unknown container runtime {self.runtime!r}")
        self.name = spec_value(spec, "name", str)
        self.image = spec_value(spec, "image", str)
        self.entrypoint = spec_value(spec, "entrypoint", str, "image")
        self.options = spec_strings(spec, "options")
        self.command = spec_strings(spec, "command")
        self.profile_label = spec_value(spec, "profile_label", str)
        self.mount = spec_value(spec, "mount", str, "/run/specconsole")
        self.pull = spec_value(spec, "pull", str, "missing")

    def record(self) -> dict:
        """What launch.json keeps: enough for watch and kill to find the container again."""
        return {"runtime": self.runtime, "name": self.name, "image": self.image}


def client_env() -> dict[str, str]:
    """The runtime client's environment for its own calls: without the run id, so that a
    `docker wait` is never taken for a process of the run (and swept by a kill)."""
    return {k: v for k, v in os.environ.items() if k != ENV_KEY}


def cli(runtime: str, *args: str, timeout: float | None = CLI_TIMEOUT,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([runtime, *args], capture_output=True, text=True, timeout=timeout,
                              env=client_env() if env is None else env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise AgentFailure("container", f"{runtime} is not installed on this host (or not on "
                           "the agent's PATH)") from None
    except subprocess.TimeoutExpired:
        raise AgentFailure("container", f"`{runtime} {args[0]}` did not answer in "
                           f"{timeout:g} s: is its daemon running?") from None


def remove_ended(box: Box) -> list[str]:
    """The profile's earlier containers that have ended (kept so that their exit reason could
    be read) are removed now, as its next launch starts; a running one is left alone."""
    statuses = [w for status in ENDED[box.runtime] for w in ("--filter", f"status={status}")]
    done = cli(box.runtime, "ps", "-aq", "--filter", f"label={box.profile_label}", *statuses)
    if done.returncode != 0:
        raise AgentFailure("container", f"`{box.runtime} ps` cannot list the profile's ended "
                           f"containers: {done.stderr.strip() or done.stdout.strip()}")
    found = done.stdout.split()
    if found:
        cli(box.runtime, "rm", *found)
    return found


def pull_if_absent(box: Box, run_dir: str) -> None:
    """`<runtime> pull IMAGE` when the image is not on the host (unless container.pull is
    "never"), its progress appended to server.log (the monitor's stdout and stderr); the launch
    waits while the PULLING marker is in the run directory."""
    if cli(box.runtime, "image", "inspect", "-f", "{{.Id}}", box.image).returncode == 0:
        return
    if box.pull == "never":
        raise AgentFailure("container", f"image {box.image} is not on this host and "
                           "container.pull = \"never\"")
    marker = os.path.join(run_dir, PULLING)
    with open(marker, "w"):
        pass
    try:
        os.write(2, f"specconsole: image {box.image} is not on this host: "
                    f"{box.runtime} pull {box.image}\n".encode())
        done = subprocess.run([box.runtime, "pull", box.image], stdin=subprocess.DEVNULL,
                              stdout=1, stderr=subprocess.PIPE, text=True, env=client_env())
    except FileNotFoundError:
        raise AgentFailure("container", f"{box.runtime} is not installed on this host") \
            from None
    finally:
        os.unlink(marker)
    os.write(2, done.stderr.encode())
    if done.returncode != 0:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        raise AgentFailure("container", f"cannot pull image {box.image}: "
                           f"{said[-1] if said else f'exit code {done.returncode}'}")


def image_entrypoint(box: Box) -> list[str]:
    """The image's own ENTRYPOINT (then its CMD when [server] gives no arguments)."""
    done = cli(box.runtime, "image", "inspect", "-f",
               "{{json .Config.Entrypoint}}\n{{json .Config.Cmd}}", box.image)
    if done.returncode != 0:
        raise AgentFailure("container", f"cannot inspect image {box.image!r}: "
                           f"{done.stderr.strip() or done.stdout.strip()}")
    entry, _, cmd = done.stdout.strip().partition("\n")
    words = [w for w in (json.loads(entry) or []) if isinstance(w, str)]
    if not box.command:
        words += [w for w in (json.loads(cmd or "null") or []) if isinstance(w, str)]
    if not words:
        raise AgentFailure("container", f"image {box.image!r} has no ENTRYPOINT: set "
                           "container.entrypoint = \"command\"")
    return words


def run_argv(box: Box, run_dir: str, inner: list[str]) -> list[str]:
    """`docker run -d ...`: the profile's options, the run directory mounted, and `inner` (the
    server's argv) run by sh with its output appended to the mounted server.log."""
    log = f"{box.mount}/server.log"
    return [box.runtime, "run", "-d", *box.options, "-v", f"{run_dir}:{box.mount}",
            "--entrypoint", "sh", box.image, "-c", f'exec "$@" >>{log} 2>&1', "sh", *inner]


def state(runtime: str, name: str) -> dict | None:
    """The container's State (Pid, Running, ExitCode, OOMKilled, ...); None when it is gone."""
    done = cli(runtime, "inspect", "-f", "{{json .State}}", name)
    if done.returncode != 0:
        return None
    try:
        value = json.loads(done.stdout)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def wait(runtime: str, name: str) -> int | None:
    """Until the container ends: its exit code (None when the runtime could not say)."""
    done = cli(runtime, "wait", name, timeout=None)
    try:
        return int(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def stop(runtime: str, name: str, grace: float) -> str:
    """TERM to the container's main process, KILL after `grace` seconds (the runtime's own
    escalation); the runtime's complaint, if any."""
    done = cli(runtime, "stop", "--time", str(max(0, round(grace))), name,
               timeout=grace + CLI_TIMEOUT)
    return "" if done.returncode == 0 else done.stderr.strip()


def remove(runtime: str, name: str) -> bool:
    return cli(runtime, "rm", name).returncode == 0
