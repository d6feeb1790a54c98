"""A containerised server: the `docker run` / `podman run` options a profile's [container]
asks for, as argv elements (never shell text), and the spec the agent starts it from.

The agent (on the host, outside the container) adds what only the host knows: the run
directory's bind mount, where the server's output is appended to server.log, and, for
entrypoint = "image", the image's own ENTRYPOINT read with `docker image inspect`.
Every environment variable is passed as `-e NAME` without a value: the runtime's client takes
the value from its own environment, which the agent sets, so no value (a secret) is ever on a
command line that `ps` shows.
"""

from __future__ import annotations

from collections.abc import Iterable

from tui.core.profile import ContainerConfig, Profile

RUN_ID_ENV = "SPECCONSOLE_RUN_ID"  # the agent's rundir.ENV_KEY: every process of a run has it
LABEL_RUN = "specconsole.run_id"
LABEL_PROFILE = "specconsole.profile"
RUN_DIR_MOUNT = "/run/specconsole"  # the host's run directory, inside the container


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
    words = list(run_args)
    return any(w in ("--network=host", "--net=host") or
               (w in ("--network", "--net") and i + 1 < len(words) and words[i + 1] == "host")
               for i, w in enumerate(words))


def run_options(profile: Profile, run_id: str, env_names: Iterable[str]) -> list[str]:
    """Everything between `docker run -d` and the image, except the run directory's mount:
    name, labels, --init, environment names, port, GPUs, IPC, volumes, the profile's own."""
    config = profile.container
    assert config is not None, "run_options needs a profile with [container]"
    names = dict.fromkeys([*env_names, RUN_ID_ENV])
    options = ["--name", container_name(run_id), "--label", f"{LABEL_RUN}={run_id}",
               "--label", f"{LABEL_PROFILE}={profile.key}", "--init"]
    for name in names:
        options += ["-e", name]
    if not _publishes_host_network(config.run_args):
        port = profile.server.port
        options += ["-p", f"{port}:{port}"]
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
                   env_names: Iterable[str]) -> dict[str, object]:
    """The launch spec's `container` part (the agent's tui/agent/container.py reads it);
    `server_argv` is built with the image's Python (ContainerConfig.python)."""
    config = profile.container
    assert config is not None, "container_spec needs a profile with [container]"
    command = (image_args(profile, server_argv) if config.entrypoint == "image"
               else list(server_argv))
    return {"runtime": config.runtime, "name": container_name(run_id),
            "options": run_options(profile, run_id, env_names), "image": config.image,
            "entrypoint": config.entrypoint, "command": command,
            "profile_label": f"{LABEL_PROFILE}={profile.key}", "mount": RUN_DIR_MOUNT}
