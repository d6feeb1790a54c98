"""From a profile to the argv that starts the server, and the care its secrets need.

Everything here returns argv lists, never shell text: the only place a command becomes a string
is `shell_join` (shlex), which `tui.remote.session.SSHSession` applies to every remote command,
so a profile value like `$(touch /tmp/pwned)` reaches the server as literal text. Secret values
travel in the agent's stdin spec, never in argv, and are redacted from anything written down:
`known_secrets` is the one list of them that every output path (launch.json, history, the
console, `wait`, `status`, `logs`) redacts with.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime
from secrets import token_hex

from tui.core.errors import ProfileError
from tui.core.profile import Profile, SimulateConfig
from tui.core.protocol import Check, Served

REDACTED = "«redacted»"
# What the agent asks a server until it answers: readiness first, then the OpenAI route.
HEALTH_PATHS = ("/health", "/v1/models")


def served_by(profile: Profile) -> Served:
    """How a server launched from this profile now is reached (recorded with the run)."""
    return Served(engine=profile.server.engine, port=profile.server.port, health=HEALTH_PATHS)


def served_changes(launched: Served, profile: Profile) -> list[str]:
    """What the profile says now that differs from what the run was launched with."""
    now = served_by(profile)
    return [f"{what} {then} (the profile now says {current})"
            for what, then, current in (("engine", launched.engine, now.engine),
                                        ("port", launched.port, now.port))
            if then != current]


def shell_join(argv: Iterable[str]) -> str:
    """argv as one POSIX shell command line, each word quoted so the shell runs it literally.

    The one place a command becomes text: SSHSession sends every remote command through it.
    """
    return shlex.join(argv)


def host_python(profile: Profile) -> str:
    """The interpreter on the host: the profile's, else this one for "local", else python3."""
    if profile.host.python:
        return profile.host.python
    return sys.executable if profile.host.target == "local" else "python3"


def speculative_config_json(profile: Profile) -> str | None:
    """The `--speculative-config` JSON: method, model, tokens, then pass-through keys."""
    spec = profile.server.speculative
    if spec is None:
        return None
    config = {"method": spec.method, "model": spec.model,
              "num_speculative_tokens": spec.num_speculative_tokens}
    return json.dumps({k: v for k, v in config.items() if v is not None} | spec.extra)


def sglang_speculative_args(profile: Profile) -> list[str]:
    """SGLang's speculative flags: algorithm, drafter, its own knobs, then pass-through keys,
    each key `k` as `--speculative-k` (the profile refuses what SGLang would not take)."""
    spec = profile.server.speculative
    if spec is None:
        return []
    flags = {"algorithm": spec.method.upper(), "draft_model_path": spec.model,
             "num_steps": spec.num_steps, "eagle_topk": spec.eagle_topk,
             "num_draft_tokens": spec.num_draft_tokens} | spec.extra
    return [word for key, value in flags.items() if value is not None
            for word in (f"--speculative-{key.replace('_', '-')}", str(value))]


def build_server_argv(profile: Profile, python: str) -> list[str]:
    """The server's argv: the raw `command`, the simulated engine, `vllm serve MODEL ...` or
    `<python> -m sglang.launch_server --model-path MODEL ...`.

    `python` is the host's interpreter: it runs the simulated engine (with tui importable) and
    SGLang, which has no command of its own.
    """
    server = profile.server
    if server.command is not None:
        return list(server.command)
    if server.engine == "sglang":
        return _sglang_argv(profile, python)
    spec = speculative_config_json(profile)
    spec_args = ["--speculative-config", spec] if spec is not None else []
    sized = ["--port", str(server.port), "--tensor-parallel-size", str(server.tensor_parallel_size)]
    sim = profile.simulate
    if sim is not None:  # it binds `listen` as vLLM does (its default is every address too)
        return [python, "-m", "tui.sim.engine", "serve", str(server.model), *sized, "--host",
                server.listen, *spec_args, *server.args, *_sim_args(sim)]
    return [*(server.executable or ("vllm", "serve")), str(server.model), "--port",
            str(server.port), "--host", server.listen,
            "--tensor-parallel-size", str(server.tensor_parallel_size), *spec_args, *server.args]


def _sglang_argv(profile: Profile, python: str) -> list[str]:
    """SGLang's launcher, or the simulated engine in its SGLang mode with the same arguments
    (`--sim-engine` first, so a truncated command line still says which engine it plays)."""
    server = profile.server
    args = ["--model-path", str(server.model), "--host", server.listen, "--port",
            str(server.port), "--tp-size", str(server.tensor_parallel_size),
            *sglang_speculative_args(profile), *server.args]
    sim = profile.simulate
    if sim is None:
        return [*(server.executable or (python, "-m", "sglang.launch_server")), *args]
    return [python, "-m", "tui.sim.engine", "--sim-engine", "sglang", *args, *_sim_args(sim)]


def _sim_args(sim: SimulateConfig) -> list[str]:
    """The simulated engine's own options: scenario, time scale, fake GPUs."""
    argv = ["--sim-scenario", sim.scenario, "--sim-time-scale", str(sim.time_scale),
            "--sim-gpus", str(sim.gpus)]
    return argv + (["--sim-gpu-state", sim.gpu_state] if sim.gpu_state else [])


# Where the simulated workers write their GPU state and the stand-in NVML reads it (the
# simulation's own tui/sim/gpu_state.py names the same variable; a test keeps them equal).
SIM_GPU_STATE_ENV = "SPECCONSOLE_SIM_GPU_STATE"


def sim_gpu_state(sim: SimulateConfig, environ: Mapping[str, str]) -> str:
    """The simulated GPUs' state directory: the profile's, else $SPECCONSOLE_SIM_GPU_STATE,
    else ~/.specconsole/sim-gpus (the simulated engine's own default)."""
    path = sim.gpu_state or environ.get(SIM_GPU_STATE_ENV) or "~/.specconsole/sim-gpus"
    return os.path.abspath(os.path.expanduser(path))


def sim_agent_env(profile: Profile, environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment for a simulated profile: the stand-in NVML that `[simulate]
    nvml` names first on its paths (a `pynvml.py` on PYTHONPATH, a `libnvidia-ml.so.1` on
    LD_LIBRARY_PATH: whichever the directory holds is found), and the GPU state it reads.
    Empty for a real profile: the host's own NVML."""
    sim = profile.simulate
    if sim is None:
        return {}
    env = {SIM_GPU_STATE_ENV: sim_gpu_state(sim, environ), "SPECCONSOLE_SIM_GPUS": str(sim.gpus)}
    if sim.nvml:
        env |= {"PYTHONPATH": sim.nvml, "LD_LIBRARY_PATH": sim.nvml}
    return env


def resolve_secrets(profile: Profile, environ: Mapping[str, str]) -> dict[str, str]:
    """Values of `server.secret_env` from the LOCAL environment; a missing one is an error."""
    values = {}
    for name in profile.server.secret_env:
        if not environ.get(name):
            raise ProfileError(profile.path, f"secret {name} is not set in the local environment; "
                               f"export {name}=... before launching {profile.name}",
                               key="server.secret_env")
        values[name] = environ[name]
    return values


# Flags of the servers' own parsers whose value is a secret: vLLM's FrontendArgs.api_key (one
# or more keys) and EngineArgs.hf_token; SGLang's ServerArgs api_key, admin_api_key and
# ssl_keyfile_password. Each with the variable the engine reads instead (None: only the flag,
# or the YAML file its `--config` names, take it).
SECRET_FLAGS: dict[str, dict[str, str | None]] = {
    "--api-key": {"vllm": "VLLM_API_KEY", "sglang": None},
    "--hf-token": {"vllm": "HF_TOKEN", "sglang": "HF_TOKEN"},  # huggingface_hub reads it
    "--admin-api-key": {"vllm": None, "sglang": None},
    "--ssl-keyfile-password": {"vllm": None, "sglang": None},
}
# a word of an environment variable's name that says its value is a secret (HF_TOKEN,
# VLLM_API_KEY; not TOKENIZERS_PARALLELISM)
_SECRET_NAME = re.compile(r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|APIKEY)(?:_|$)",
                          re.IGNORECASE)
SECRETS_CHECK = "secrets"


def secret_flag_values(argv: Iterable[str]) -> list[str]:
    """The values given to SECRET_FLAGS in argv, as `--flag value [value...]` or `--flag=value`
    (vLLM's --api-key takes several; --hf-token alone, with no value, names none)."""
    values: list[str] = []
    taking = False
    for word in argv:
        if word.startswith("-"):
            flag, has_value, value = word.partition("=")
            taking = flag in SECRET_FLAGS and not has_value
            if flag in SECRET_FLAGS and has_value:
                values.append(value)
        elif taking:
            values.append(word)
    return values


def _server_words(profile: Profile) -> list[str]:
    """Where a secret flag can be written: the raw command and the engine's extra args."""
    return [*(profile.server.command or ()), *profile.server.args]


def known_secrets(profile: Profile, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Every secret value of a profile, the one list all output is redacted with: secret_env's
    values in `environ`, what `${NAME}` brought into server.env, server.env values whose name
    says secret, and the values of SECRET_FLAGS in the server's command line."""
    server = profile.server
    values = [*(environ.get(name, "") for name in server.secret_env), *server.env_from_environ,
              *(v for name, v in server.env.items() if _SECRET_NAME.search(name)),
              *secret_flag_values(_server_words(profile))]
    return tuple(dict.fromkeys(v for v in values if v))


def secret_checks(profile: Profile) -> tuple[Check, ...]:
    """Warnings (one line each, with the fix) for secrets held where they leak: on the
    server's command line (every user of the host reads it in `ps`), or in server.env under a
    secret-looking name (its value then sits in the profile file)."""
    engine = profile.server.engine
    out: list[Check] = []
    flags = dict.fromkeys(w.partition("=")[0] for w in _server_words(profile)
                          if w.partition("=")[0] in SECRET_FLAGS)
    for flag in flags:
        env = SECRET_FLAGS[flag].get(engine)
        fix = (f"drop it and list {env} in secret_env = [\"{env}\"] ({engine} reads it)" if env
               else f"{engine} takes it only as an argument: put it in the YAML file that "
                    "`--config` names, readable by you alone")
        out.append(Check(SECRETS_CHECK, False, "warning",
                         f"{flag} on the command line is visible to every user of the host in "
                         f"`ps`; {fix}"))
    for name in profile.server.env:
        if _SECRET_NAME.search(name) and name not in profile.server.secret_env:
            out.append(Check(SECRETS_CHECK, False, "warning",
                             f"server.env.{name} looks like a secret: remove it from server.env "
                             f"and list it in secret_env = [\"{name}\"] (taken from your shell, "
                             "sent over stdin, redacted everywhere)"))
    return tuple(out)


def redact(text: str, secrets: Iterable[str]) -> str:
    """Replace each secret value of 4+ characters (shorter ones would blank out ordinary text)."""
    for value in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def new_run_id(profile_name: str, now: datetime | float) -> str:
    """`<stem>-<YYYYmmdd-HHMMSS>-<6 hex>`: sortable by time, safe as a directory name."""
    when = now if isinstance(now, datetime) else datetime.fromtimestamp(now)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", profile_name).lstrip(".-") or "run"
    return f"{stem}-{when:%Y%m%d-%H%M%S}-{token_hex(3)}"
