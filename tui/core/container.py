"""A containerised server: the `docker run` / `podman run` options a profile's [container]
asks for, as argv elements (never shell text), and the spec the agent starts it from.

The agent (on the host, outside the container) adds what only the host knows: the bind mount
of the run's server.log (that file alone), where the server's output is appended, and, for
entrypoint = "image", the image's own ENTRYPOINT read with `docker image inspect`.
An environment variable is passed as `-e NAME` without a value: the runtime's client takes the
value from its own environment, which the agent sets, so no value is on a command line that
`ps` shows. A secret's value is not passed that way at all (the runtime would keep it in the
container's Config.Env, which `inspect` prints): the agent hands it over in a file the
container's wrapper reads and empties (tui/agent/container.py).

The server inside listens on every address of the container; the port is published on the
host at the profile's `listen` address only (`-p 127.0.0.1:PORT:PORT` for a loopback listen).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from tui.core.profile import ContainerConfig, Profile
from tui.core.protocol import Check

RUN_ID_ENV = "SPECCONSOLE_RUN_ID"  # the agent's rundir.ENV_KEY: every process of a run has it
LABEL_RUN = "specconsole.run_id"
LABEL_PROFILE = "specconsole.profile"
RUN_DIR_MOUNT = "/run/specconsole"  # the host's run directory, inside the container
SHM_CHECK = "shm"
# docker's /dev/shm is 64 MiB unless told; NCCL's shared-memory transport and vLLM's broadcast
# queues between workers need far more: below this, `unhandled system error` and bus errors
MIN_SHM_BYTES = 2 * 2**30
_SIZE = re.compile(r"(\d+)([bkmg]?)b?", re.I)


def container_name(run_id: str) -> str:
    return f"specconsole-{run_id}"


def gpu_args(config: ContainerConfig) -> list[str]:
    """docker: `--gpus all` / `--gpus "device=0,1"` (the quotes are part of the value: the
    comma would otherwise split it); podman: CDI devices, `--device nvidia.com/gpu=all`."""
    gpus = config.gpus
    if gpus == "none":
        return []
    if config.runtime == "podman":
        devices = ["all"] if gpus == "all" else [str(i) for i in gpus]
        return [w for d in devices for w in ("--device", f"nvidia.com/gpu={d}")]
    if gpus == "all":
        return ["--gpus", "all"]
    return ["--gpus", f'"device={",".join(str(i) for i in gpus)}"']


def _publishes_host_network(run_args: Iterable[str]) -> bool:
    return _option(list(run_args), "--network") == "host" or \
        _option(list(run_args), "--net") == "host"


# Where the server binds inside a container whose port is published: every address of the
# container's own network namespace (its loopback is not the host's).
INSIDE_LISTEN = "0.0.0.0"
_ANY_ADDRESS = ("0.0.0.0", "::", "")
_LOOPBACK_NAMES = {"localhost": "127.0.0.1", "ip6-localhost": "::1"}


def publish_args(profile: Profile) -> list[str]:
    """`-p [ADDRESS:]PORT:PORT`: the server's port on the host, at the profile's `listen`
    address only (every address when it listens on all); nothing on the host's network."""
    config = profile.container
    if config is None or _publishes_host_network(config.run_args):
        return []
    port = profile.server.port
    address = _LOOPBACK_NAMES.get(profile.server.listen, profile.server.listen)
    if address in _ANY_ADDRESS:
        return ["-p", f"{port}:{port}"]
    return ["-p", f"[{address}]:{port}:{port}" if ":" in address else f"{address}:{port}:{port}"]


def inside_profile(profile: Profile) -> Profile:
    """The profile the server's command inside the container is built from: listening on
    every address of the container when its port is published (the published address is
    `listen`, on the host); on the host's network, as it is."""
    config = profile.container
    if config is None or _publishes_host_network(config.run_args):
        return profile
    return replace(profile, server=replace(profile.server, listen=INSIDE_LISTEN))


def secret_names(env: Mapping[str, str], secrets: Iterable[str]) -> list[str]:
    """The names in `env` whose value holds a secret (tui.core.command.known_secrets): passed
    to the container in a file, never as `-e NAME`."""
    values = [s for s in secrets if s]
    return [name for name, value in env.items() if any(s in value for s in values)]


def run_options(profile: Profile, run_id: str, env_names: Iterable[str],
                secret_env: Iterable[str] = ()) -> list[str]:
    """Everything between `docker run -d` and the image, except the run's mounts: name,
    labels, --init, environment names (not the secret ones), port, GPUs, IPC, volumes, the
    profile's own."""
    config = profile.container
    assert config is not None, "run_options needs a profile with [container]"
    hidden = set(secret_env)
    names = dict.fromkeys([*(n for n in env_names if n not in hidden), RUN_ID_ENV])
    options = ["--name", container_name(run_id), "--label", f"{LABEL_RUN}={run_id}",
               "--label", f"{LABEL_PROFILE}={profile.key}", "--init"]
    for name in names:
        options += ["-e", name]
    options += publish_args(profile)
    options += gpu_args(config)
    if config.ipc is not None:
        options += ["--ipc", config.ipc]
    if config.shm_size is not None:
        options += ["--shm-size", config.shm_size]
    for volume in config.volumes:
        options += ["-v", volume]
    return [*options, *config.run_args]


def image_args(profile: Profile, argv: list[str]) -> list[str]:
    """What the image's own ENTRYPOINT receives: the server's argv without its executable
    (`vllm serve`, the simulated engine's `python -m tui.sim.engine serve`, SGLang's launcher);
    a raw `server.command` goes to it whole."""
    server = profile.server
    if server.command is not None:
        return list(argv)
    if profile.simulate is not None:
        words = 4 if server.engine == "vllm" else 3  # python -m tui.sim.engine [serve]
    elif server.engine == "sglang":
        words = len(server.executable) if server.executable else 3
    else:
        words = len(server.executable) if server.executable else 2
    return argv[words:]


def container_spec(profile: Profile, run_id: str, server_argv: list[str],
                   env: Mapping[str, str], secrets: Iterable[str] = ()) -> dict[str, object]:
    """The launch spec's `container` part (the agent's tui/agent/container.py reads it);
    `server_argv` is built with the image's Python (ContainerConfig.python) from
    inside_profile; `secrets` are the values (known_secrets) whose variables go by file."""
    config = profile.container
    assert config is not None, "container_spec needs a profile with [container]"
    command = (image_args(profile, server_argv) if config.entrypoint == "image"
               else list(server_argv))
    hidden = secret_names(env, secrets)
    return {"runtime": config.runtime, "name": container_name(run_id),
            "options": run_options(profile, run_id, env, hidden), "image": config.image,
            "entrypoint": config.entrypoint, "command": command,
            "profile_label": f"{LABEL_PROFILE}={profile.key}", "mount": RUN_DIR_MOUNT,
            "pull": config.pull, "python": config.python, "secret_env": hidden}


def shm_bytes(size: str) -> int | None:
    """docker's --shm-size ("16g", "512m", "1048576") in bytes; None when not a size."""
    found = _SIZE.fullmatch(size.strip())
    if found is None:
        return None
    return int(found.group(1)) * 1024 ** "bkmg".index(found.group(2).lower() or "b")


def _option(words: Sequence[str], name: str) -> str | None:
    """The value of `name` in run_args, as `--name value` or `--name=value` (the last wins)."""
    value = None
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(name + "="):
            value = word.partition("=")[2]
    return value


def shm_check(config: ContainerConfig) -> Check:
    """A warning unless the container shares the host's IPC namespace or gets a /dev/shm of at
    least MIN_SHM_BYTES (from container.ipc / shm_size or the same options in run_args)."""
    ipc = _option(config.run_args, "--ipc") or config.ipc
    if ipc == "host":
        return Check(SHM_CHECK, True, "warning", "ipc = \"host\": the host's /dev/shm is shared")
    size = _option(config.run_args, "--shm-size") or config.shm_size
    got = shm_bytes(size) if size is not None else None
    if got is not None and got >= MIN_SHM_BYTES:
        return Check(SHM_CHECK, True, "warning", f"/dev/shm of {size} in the container")
    what = (f"shm_size = \"{size}\" is under {MIN_SHM_BYTES // 2**30} GiB" if size is not None
            else "neither ipc = \"host\" nor shm_size is set: docker's /dev/shm is 64 MiB")
    return Check(SHM_CHECK, False, "warning",
                 f"{what}: NCCL's `unhandled system error` and bus errors are likely — set "
                 "container.ipc = \"host\" or container.shm_size = \"16g\"")


def container_checks(profile: Profile) -> tuple[Check, ...]:
    """Preflight's checks of [container] decided from the profile alone."""
    return () if profile.container is None else (shm_check(profile.container),)


def preflight_spec(profile: Profile) -> dict[str, object] | None:
    """What the agent's preflight checks on the host for [container]: the runtime answers, the
    image is there (or may be pulled), the GPU runtime when GPUs are asked for, lingering for
    rootless podman over SSH; and which containers hold the GPUs or the port."""
    config = profile.container
    if config is None:
        return None
    return {"runtime": config.runtime, "image": config.image, "pull": config.pull,
            "gpus": config.gpus != "none", "over_ssh": profile.host.target != "local"}
