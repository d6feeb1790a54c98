"""A run in a container: started, waited for, stopped and removed through the runtime's CLI
(`docker` or `podman`), so the agent needs nothing but the runtime's client.

The container's processes are host processes: the agent watches them as it watches a bare
server's, from the container's main process (its host pid, recorded as the run's top).  Their
output goes to the host run directory's server.log directly (that one file is bind-mounted and
the command wrapped in `sh -c 'exec >>LOG 2>&1; ...; exec "$@"'`), so the log tail, its byte
offsets and its reconnect guarantees are the bare run's.

Nothing else of the run directory is in the container: code inside it (a model's remote code, a
compromised image) can write its own log and nothing the host agent takes a pid, an exit, a run
identity or a path from.  A file bind-mounted on its own cannot be replaced from inside (a mount
point is neither renamed nor unlinked), so the log is never swapped for a link.  Secret values
reach the server through a second such file, mode 0600, sourced by the wrapper and emptied at
once (the host's name for it is unlinked as soon as the client returns): the runtime never
stores them where `inspect` shows them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shlex
import signal
import subprocess
import time

from .procfs import own_group, read_stat
from .rundir import ENV_KEY
from .wire import AgentFailure, SpecError, spec_strings, spec_value

CLI_TIMEOUT = 60.0  # seconds for one quick runtime call (inspect, ps, rm)
RUN_TIMEOUT = 300.0  # seconds for `run -d` (it makes the container's layer and network)
LABEL_USER = "specconsole.user"  # whose run: cleanup removes only that user's containers
SECRETS = "secrets.env"  # in the run directory, until the container's client returns
# `ps --filter status=` values of a container that has ended or never ran: podman knows no
# "dead" (it refuses the whole call) and says "stopped" before its cleanup makes it "exited"
ENDED = {"docker": ("exited", "created", "dead"), "podman": ("exited", "created", "stopped")}


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
        self.secret_env = spec_strings(spec, "secret_env")
        self.mount = spec_value(spec, "mount", str, "/run/specconsole")
        self.pull = spec_value(spec, "pull", str, "missing")
        self.python = spec_value(spec, "python", str, "python3")

    def record(self) -> dict:
        """What launch.json keeps: enough for watch and kill to find the container again, and
        for stacks to find py-spy beside the image's Python."""
        return {"runtime": self.runtime, "name": self.name, "image": self.image,
                "python": self.python}


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
    be read) are removed now, as its next launch starts; a running one is left alone, and so
    is another user's (the same profile name on a shared host)."""
    statuses = [w for status in ENDED[box.runtime] for w in ("--filter", f"status={status}")]
    done = cli(box.runtime, "ps", "-aq", "--filter", f"label={box.profile_label}",
               "--filter", f"label={user_label()}", *statuses)
    if done.returncode != 0:
        raise AgentFailure("container", f"`{box.runtime} ps` cannot list the profile's ended "
                           f"containers: {done.stderr.strip() or done.stdout.strip()}")
    found = done.stdout.split()
    if found:
        cli(box.runtime, "rm", *found)
    return found


def user_label() -> str:
    """`specconsole.user=NAME`: the host user this agent runs as (its uid when unnamed)."""
    try:
        name = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        name = str(os.getuid())
    return f"{LABEL_USER}={name}"


def image_present(box: Box) -> bool:
    return cli(box.runtime, "image", "inspect", "-f", "{{.Id}}", box.image).returncode == 0


_LAYER = re.compile(r"^([0-9a-f]{12}): (.*)$")
_LAYER_DONE = ("Pull complete", "Already exists")


class Pull:
    """`<runtime> pull IMAGE` under the monitor, in its own process group, its output (both
    streams) copied line by line to server.log (fd 1) with a line of the monitor's own after
    each layer done (`N/M layers`: docker draws its byte counts only on a terminal).

    While it runs, the monitor's start marker says so (tui/agent/boxmonitor.py): the launch
    returns at once, and a kill TERMs the monitor, whose `stop` ends the pull's whole group."""

    def __init__(self, box: Box) -> None:
        self.box = box
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False

    def stop(self) -> None:
        """A kill during the pull (the monitor's SIGTERM handler): end the pull's group; the
        monitor then records the run as killed and starts no container."""
        self.stopped = True
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(OSError):  # not reaped yet: the group is still the pull's
                os.killpg(self.proc.pid, signal.SIGTERM)

    def run(self) -> None:
        """Pull; AgentFailure with the runtime's last line when it fails."""
        last = self._pull()
        if self.stopped:
            return
        code = self.proc.returncode if self.proc is not None else None
        if code != 0:
            raise AgentFailure("container", f"cannot pull image {self.box.image}: "
                               f"{last or f'exit code {code}'}")

    def _pull(self) -> str:
        image = self.box.image
        say = f"specconsole: pulling image {image} (not on this host): " \
              f"{self.box.runtime} pull {image}\n"
        os.write(1, say.encode())
        try:
            self.proc = subprocess.Popen([self.box.runtime, "pull", image],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, env=client_env(),
                                         **own_group())
        except FileNotFoundError:
            raise AgentFailure("container", f"{self.box.runtime} is not installed on this "
                               "host") from None
        if self.stopped:  # the kill came while it started
            self.stop()
        layers: dict[str, bool] = {}
        last = ""
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            os.write(1, raw)
            line = raw.decode("utf-8", "replace").strip()
            last = line or last
            m = _LAYER.match(line)
            if m is None or m.group(2).startswith("Pulling from"):
                continue
            done = m.group(2).strip() in _LAYER_DONE
            if done and not layers.get(m.group(1)):
                layers[m.group(1)] = True
                n = sum(layers.values())
                os.write(1, f"specconsole: pulling image {image}: {n}/{len(layers)} layers\n"
                         .encode())
            layers.setdefault(m.group(1), done)
        self._reap()
        return last

    def _reap(self) -> None:
        """Wait for the pull. After a stop, its group (the runtime's client, or a wrapper and
        its children) is KILLed once the client ended or a grace passed, while the client is
        not reaped yet: its group's number cannot have been reused."""
        assert self.proc is not None
        if self.stopped:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                st = read_stat(self.proc.pid)
                if st is None or st.dead:
                    break
                time.sleep(0.02)
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


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


def run_argv(box: Box, run_dir: str, inner: list[str], secrets: bool) -> list[str]:
    """`docker run -d ...`: the profile's options, whose run it is (a user label), the run's
    server.log alone bind-mounted (and, with `secrets`, the secrets file), and `inner` (the
    server's argv) run by sh with its output appended to the mounted server.log."""
    log = f"{box.mount}/server.log"
    mounts = ["-v", f"{os.path.join(run_dir, 'server.log')}:{log}"]
    script = f"exec >>{log} 2>&1; "
    if secrets:
        held = f"{box.mount}/{SECRETS}"
        mounts += ["-v", f"{os.path.join(run_dir, SECRETS)}:{held}"]
        script += (f"if [ ! -r {held} ]; then echo 'specconsole: cannot read the secrets file "
                   f"{held} in the container: it runs as a user other than the file owner "
                   "(drop --user from container.run_args, or run it as root)'; exit 126; fi; "
                   f"set -a; . {held}; set +a; : >{held}; ")
    return [box.runtime, "run", "-d", *box.options, "--label", user_label(), *mounts,
            "--entrypoint", "sh", box.image, "-c", script + 'exec "$@"', "sh", *inner]


def write_secrets(path: str, env: dict[str, str], names: list[str]) -> bool:
    """The values of `names` as sh assignments in a new file of mode 0600 (the wrapper sources
    it inside the container); False when there is none to pass."""
    lines = [f"{name}={shlex.quote(env[name])}\n" for name in names if name in env]
    if not lines:
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        data = "".join(lines).encode()
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return True


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
    """Until the container ends: its exit code; None when the runtime could not say (its
    daemon went away, the container was removed under it)."""
    done = cli(runtime, "wait", name, timeout=None)
    if done.returncode != 0:
        return None
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


def answers(runtime: str) -> bool:
    """The runtime's client reaches its daemon (podman: its store)."""
    try:
        return cli(runtime, "version", "--format", "{{.Server.Version}}" if runtime == "docker"
                   else "{{.Version}}").returncode == 0
    except AgentFailure:
        return False


def remove(runtime: str, name: str, force: bool = False) -> bool:
    return cli(runtime, "rm", *(["-f"] if force else []), name).returncode == 0
