"""Profiles: one TOML file per server to launch, validated into frozen dataclasses.

A profile is written by hand and read by a tired engineer, so every mistake becomes ONE line
naming the file, the line when the text shows it, and the key path (`server.speculative.method`,
`logs.hide[2].pattern`). Validation is a field table per section run by one small generic
validator, so adding a key is one line, not a new hand-written check.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tui.core.errors import ProfileError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ENGINES = ("vllm", "sglang")
SPECULATIVE_METHODS = ("eagle3", "eagle", "ngram", "medusa", "mtp", "draft_model", "suffix")
DRAFTER_METHODS = ("eagle3", "eagle", "medusa", "draft_model")
SGLANG_METHODS = ("eagle3", "eagle")  # --speculative-algorithm EAGLE3 / EAGLE
# SGLang's own speculative knobs: --speculative-num-steps, -eagle-topk, -num-draft-tokens
SGLANG_SPECULATIVE_KEYS = ("num_steps", "eagle_topk", "num_draft_tokens")
SCENARIOS = ("ready", "syntax-error", "oom", "hang", "engine-killed")
ROLES = ("head", "worker")
CLUSTER_BACKENDS = ("ray", "native")
CLUSTER_PORTS = {"ray": 6379, "native": 29500}  # Ray's GCS port, torch's usual master port
ON_READY_TIMEOUT = ("keep", "kill")  # what giving up on a launch does to its run
RUNTIMES = ("docker", "podman")
# "image": the image's ENTRYPOINT takes [server]'s arguments (`docker run vllm/vllm-openai
# --model ...`); "command": the server command built from [server] runs in the container
ENTRYPOINTS = ("image", "command")
# an image absent on the host: "missing" pulls it as the launch starts, "never" refuses
PULL_POLICIES = ("missing", "never")
# how the agent reaches a Slurm job's node: "step", a step of the job (`srun --jobid J
# --overlap`, no SSH to compute nodes), the one built so far
SLURM_REACH = ("step",)
# sbatch options the job script writes itself (tui.core.slurm), refused in [slurm].sbatch_args
SLURM_OWNED_OPTIONS = ("--output", "-o", "--error", "-e", "--job-name", "-J", "--parsable",
                       "--wrap", "--test-only", "--chdir", "-D", "--export", "--nodes", "-N")


@dataclass(frozen=True, slots=True)
class HostConfig:
    target: str
    jump: str | None = None
    python: str | None = None  # None: sys.executable for "local", "python3" elsewhere
    workdir: str | None = None
    runs_dir: str = "~/.specconsole/runs"
    known_hosts: str | None = None  # None: ssh's default ~/.ssh/known_hosts
    strict_host_keys: bool = True
    keepalive_interval: float = 5.0
    keepalive_count_max: int = 3
    connect_timeout: float = 15.0


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One host of a launch that spans several (`[[hosts]]`): its role and how the other hosts
    reach it (the cluster's address; ssh may reach it by another name or through a jump)."""

    role: str
    host: HostConfig
    address: str | None = None  # None: host.target

    @property
    def reached_at(self) -> str:
        return self.address or self.host.target


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """How the hosts of a multi-host launch form one server: a Ray cluster, or vLLM's own
    multi-node launch (the other hosts run headless workers)."""

    backend: str
    port: int | None = None  # None: CLUSTER_PORTS[backend]
    join_timeout: float = 300.0
    ray: tuple[str, ...] = ("ray",)  # Ray's command line on the hosts

    @property
    def rendezvous_port(self) -> int:
        return self.port if self.port is not None else CLUSTER_PORTS[self.backend]


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    model: str | None = None
    num_speculative_tokens: int | None = None  # vLLM
    num_steps: int | None = None  # SGLang (SGLANG_SPECULATIVE_KEYS)
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # further keys, passed through verbatim


@dataclass(frozen=True, slots=True)
class ServerConfig:
    engine: str
    model: str | None = None
    port: int = 8000
    listen: str = "0.0.0.0"
    tensor_parallel_size: int = 1
    executable: tuple[str, ...] | None = None  # None: the engine's own (see command.py)
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    secret_env: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None
    # what the local environment gave to `env` through `${NAME}`: kept as secret as secret_env's
    # values (tui.core.command.known_secrets); not a profile key
    env_from_environ: tuple[str, ...] = ()
    speculative: SpeculativeConfig | None = None


@dataclass(frozen=True, slots=True)
class PreflightConfig:
    enabled: bool = True
    compile: bool = True
    compile_files: tuple[str, ...] = ()
    engine_package: bool = True
    gpus_free: bool = True
    port_free: bool = True
    paths_exist: bool = True
    spec_consistent: bool = True


@dataclass(frozen=True, slots=True)
class LogRule:
    pattern: re.Pattern[str]
    label: str


@dataclass(frozen=True, slots=True)
class LogsConfig:
    hide: tuple[LogRule, ...] = ()
    harmless: tuple[LogRule, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpectConfig:
    load_time: float = 1800.0
    stall_timeout: float = 600.0
    # not READY this long after the launch: given up on (wait exits 4, the console alerts)
    ready_timeout: float | None = None
    on_ready_timeout: str = "keep"  # or "kill": the run is killed when it is given up on
    stacks_on_stall: bool = True  # py-spy every process of the run once when it stalls
    # once READY, how often the agent asks the server (/metrics, else /health): a week of
    # supervision must not fill the server's log with the tool's own requests
    serving_probe_interval: float = 10.0


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    """Local commands run on DEAD, STALLED and READY (with the event in SPECCONSOLE_* variables),
    and whether to flash a tmux message; a hook never blocks the console."""

    on_ready: str | None = None
    on_dead: str | None = None
    on_stalled: str | None = None
    hook_timeout: float = 10.0
    tmux: bool = True


@dataclass(frozen=True, slots=True)
class SmokeConfig:
    """One request after READY, to tell "up" from "serving"."""

    enabled: bool = False
    kind: str = "completion"  # or "chat"
    prompt: str = "Say hello in one short sentence."
    max_tokens: int = 16
    timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class SimulateConfig:
    scenario: str = "ready"
    time_scale: float = 60.0
    gpus: int = 8
    gpu_state: str | None = None
    fault_host: str | None = None  # a multi-host launch: only this host plays the scenario
    # the directory of the stand-in NVML the agent loads (a relative path is the profile's)
    nvml: str | None = None


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    """The server runs in a container of `image`, started by the runtime's CLI on the host
    (the agent stays outside it); how it is built: tui.core.container."""

    image: str
    runtime: str = "docker"
    gpus: str | tuple[int, ...] = "all"  # "all", "none", or device indices
    ipc: str | None = None  # "host": the host's IPC namespace (NCCL's shared memory)
    shm_size: str | None = None  # "16g": /dev/shm's size when ipc is not "host"
    volumes: tuple[str, ...] = ()  # "host:container[:opts]"
    run_args: tuple[str, ...] = ()  # further `docker run` arguments, as written
    entrypoint: str = "image"
    python: str = "python3"  # the image's Python: runs SGLang and the simulated engine
    pull: str = "missing"  # PULL_POLICIES


@dataclass(frozen=True, slots=True)
class SlurmConfig:
    """The server runs inside a Slurm job that [host] (the login node) submits with sbatch;
    the job script and the scheduler's words: tui.core.slurm. Unset keys are the cluster's
    defaults (its default partition, its default time limit)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None  # Slurm's own format: "30" (minutes), "4:00:00", "1-12:00"
    nodes: int = 1
    gpus_per_node: int | None = None
    gres: str | None = None  # "gpu:a100:8"; or gpus_per_node, not both
    cpus_per_task: int | None = None
    mem: str | None = None  # per node, as sbatch's --mem: "64G", "4000" (MB)
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()  # further sbatch words, one option each
    job_name: str | None = None  # the profile's name when unset
    reach: str = "step"  # SLURM_REACH
    alert_before: float = 600.0  # the time-left alert, seconds before the job's end

    @property
    def time_limit_s(self) -> float | None:
        return slurm_time_seconds(self.time) if self.time is not None else None


@dataclass(frozen=True, slots=True)
class AttachTarget:
    """A server launched by others, to attach to: a container (name or id, and its runtime)
    or a host pid; `log`: the bare process's log file, when its output does not go to a file
    the agent can find.  Not a profile table: `specconsole attach` builds it (tui.core.attach)."""

    container: str | None = None
    pid: int | None = None
    runtime: str = "docker"
    log: str | None = None

    def __post_init__(self) -> None:
        if (self.container is None) == (self.pid is None):
            raise ValueError("attach to a container or to a pid, one of them")

    @property
    def label(self) -> str:
        """The run name's stem: `attached-<container>` or `attached-pid<pid>`."""
        what = self.container if self.container is not None else f"pid{self.pid}"
        return "attached-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", what) or "target")

    def to_wire(self) -> dict[str, Any]:
        if self.container is not None:
            return {"container": self.container, "runtime": self.runtime}
        return {"pid": self.pid, "log": self.log}


@dataclass(frozen=True, slots=True)
class Profile:
    path: str
    name: str  # the file stem: what runs are named after
    host: HostConfig
    server: ServerConfig
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    expect: ExpectConfig = field(default_factory=ExpectConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    smoke: SmokeConfig = field(default_factory=SmokeConfig)
    simulate: SimulateConfig | None = None
    # several hosts (`[[hosts]]`, the head first; `host` is the head's) and how they cluster
    nodes: tuple[NodeConfig, ...] = ()
    cluster: ClusterConfig | None = None
    container: ContainerConfig | None = None
    attach: AttachTarget | None = None  # a server launched by others (tui.core.attach)
    slurm: SlurmConfig | None = None  # launched as a Slurm job from the login node

    @property
    def key(self) -> str:
        """Identifies the live run of this profile on its host (`demo@local`)."""
        return f"{self.name}@{self.host.target}"


def parse_duration(value: str | float) -> float:
    """Seconds from "25m", "1h30m", "90s", "1.5h", "90" or a number; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a duration, got {_describe(value)}")
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            match = _DURATION.fullmatch(text)
            if not text or match is None:
                raise ValueError(
                    f"invalid duration {value!r} (use e.g. \"25m\", \"1h30m\", \"90s\" or seconds)"
                ) from None
            hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
            seconds = hours * 3600 + minutes * 60 + secs
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {value!r}: not a finite number")
    return seconds


_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def slurm_time_seconds(text: str) -> int:
    """Seconds from Slurm's time format (sbatch --time): "M", "M:S", "H:M:S", "D-H", "D-H:M",
    "D-H:M:S"; ValueError otherwise (so does "0", "infinite" and "unlimited": a launch asks
    for a limit it can be alerted before)."""
    match = _SLURM_TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid Slurm time {text!r} (use minutes \"30\", \"H:MM:SS\" like "
                         "\"4:00:00\", or \"D-HH:MM\" like \"1-12:00\")")
    days, first, second, third = match.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:  # D-H, D-H:M, D-H:M:S
        parts += [0] * (3 - len(parts))
        seconds = int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 3:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 2:
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = parts[0] * 60
    if seconds <= 0:
        raise ValueError(f"Slurm time {text!r} is no limit: give the job's wall time")
    return seconds


def expand_vars(text: str, environ: Mapping[str, str], used: list[str] | None = None) -> str:
    """`${NAME}` and `${NAME:-default}` (the default may hold references itself) from `environ`.

    Only the braced form is expanded, so a literal `$` elsewhere stays as written; an unset
    `${NAME}` without a default is a ValueError naming the variable. Each value taken from
    `environ` is appended to `used` (the values a profile must keep secret).
    """
    out: list[str] = []
    at = 0
    while (start := text.find("${", at)) >= 0:
        out.append(text[at:start])
        name = _ENV_NAME.match(text, start + 2)
        if name is None:
            raise ValueError(f"bad variable reference in {text!r}: expected ${{NAME}}")
        after = name.end()
        if text.startswith("}", after):
            if name.group() not in environ:
                raise ValueError(f"${{{name.group()}}} is not set (export it, or write "
                                 f"${{{name.group()}:-default}})")
            out.append(environ[name.group()])
            if used is not None:
                used.append(environ[name.group()])
            at = after + 1
        elif text.startswith(":-", after):
            end = _closing_brace(text, after + 2)
            default = text[after + 2:end]
            if environ.get(name.group()):
                out.append(environ[name.group()])
                if used is not None:
                    used.append(environ[name.group()])
            else:
                out.append(expand_vars(default, environ, used))
            at = end + 1
        else:
            raise ValueError(f"bad variable reference in {text!r}: expected ${{NAME}} "
                             "or ${NAME:-default}")
    out.append(text[at:])
    return "".join(out)


def _closing_brace(text: str, at: int) -> int:
    depth = 1
    for i in range(at, len(text)):
        if text.startswith("${", i):
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unclosed variable reference in {text!r}")


def load_profile(path: str | Path, environ: Mapping[str, str] | None = None) -> Profile:
    """Read and validate a profile file; every failure is a one-line ProfileError."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise ProfileError(str(path), f"cannot read profile: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ProfileError(str(path), f"not UTF-8 text (byte {e.start})") from None
    return loads_profile(text, path, environ)


def loads_profile(text: str, path: str | Path,
                  environ: Mapping[str, str] | None = None) -> Profile:
    """Validate profile text; `path` names the file in errors and gives the profile its name.

    Path-like values (see _EXPANDED) may use `${NAME}` / `${NAME:-default}`, expanded from
    `environ` (default: this process's environment) — the console's side, as for secret_env.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _syntax_error(str(path), text, str(e)) from None
    try:
        from_environ = _expand(data, os.environ if environ is None else environ)
        values = _check_table(data, _TOP, required=("server",))
        values["server"] = replace(values["server"], env_from_environ=from_environ)
        if "simulate" in values and values["server"].model is None:
            raise _Invalid("missing required key 'model' (the simulated engine needs one)",
                           ".server.model")
        _check_hosts(values)
        if "container" in values and values.get("nodes"):
            raise _Invalid("[container] runs on one host: several [[hosts]] are not "
                           "supported with it yet", ".container")
        if "slurm" in values:
            _check_slurm_beside(values)
    except _Invalid as e:
        key = e.sub.lstrip(".")
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in key)  # stays one line
        raise ProfileError(str(path), e.message, key=shown, line=_find_line(text, key)) from None
    sim = values.get("simulate")
    if sim is not None and sim.nvml and not sim.nvml.startswith(("/", "~")):
        values["simulate"] = replace(sim, nvml=os.path.normpath(
            Path(path).resolve().parent / sim.nvml))
    return Profile(path=str(path), name=Path(path).stem, **values)


# --- the generic validator --------------------------------------------------------------------

class _Invalid(Exception):
    """A bad value; `sub` is the key path below the table being checked (".port", "[2].label")."""

    def __init__(self, message: str, sub: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.sub = sub


Check = Callable[[Any], Any]
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
               list: "an array", dict: "a table"}


def _describe(value: Any) -> str:
    kind = _TYPE_NAMES.get(type(value), "a date/time")
    if isinstance(value, bool):
        return f"{kind} ({str(value).lower()})"
    if isinstance(value, (int, float, str)):
        shown = repr(value)
        return f"{kind} ({shown if len(shown) <= 40 else shown[:37] + '...'})"
    return kind


def _suggest(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _typed(types: tuple[type, ...], name: str) -> Check:
    def check(value: Any) -> Any:
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise _Invalid(f"expected {name}, got {_describe(value)}")
        return value
    return check


_str = _typed((str,), "a string")
_int = _typed((int,), "an integer")
_number = _typed((int, float), "a number")
_bool = _typed((bool,), "a boolean (true or false)")


def _float(value: Any) -> float:
    number = float(_number(value))
    if not math.isfinite(number):
        raise _Invalid(f"expected a finite number, got {value}")
    return number


def _bounded(check: Check, low: float, high: float | None = None, strict: bool = False) -> Check:
    def bounded(value: Any) -> Any:
        value = check(value)
        if (value <= low if strict else value < low) or (high is not None and value > high):
            wanted = (f"between {low} and {high}" if high is not None
                      else f"{'>' if strict else '>='} {low}")
            raise _Invalid(f"must be {wanted}, got {value}")
        return value
    return bounded


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(value: Any) -> str:
        if _str(value) not in choices:
            raise _Invalid(f"unknown value {value!r}{_suggest(value, choices)}; "
                           f"expected one of: {', '.join(choices)}")
        return value
    return check


def _list(item: Check, nonempty: bool = False) -> Check:
    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _Invalid(f"expected an array, got {_describe(value)}")
        if nonempty and not value:
            raise _Invalid("must not be empty")
        out = []
        for index, element in enumerate(value):
            try:
                out.append(item(element))
            except _Invalid as e:
                raise _Invalid(e.message, f"[{index}]{e.sub}") from None
        return tuple(out)
    return check


def _env_name(value: Any) -> str:
    if not _ENV_NAME.fullmatch(_str(value)):
        raise _Invalid(f"{value!r} is not an environment variable name")
    return value


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise _Invalid(f"expected a table of NAME = \"value\", got {_describe(value)}")
    for name, text in value.items():
        try:
            _env_name(name)
            _str(text)
        except _Invalid as e:
            raise _Invalid(e.message, f".{name}") from None
    return dict(value)


def _duration(value: Any) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as e:
        raise _Invalid(str(e)) from None
    if seconds <= 0:
        raise _Invalid(f"must be > 0, got {value!r}")
    return seconds


def _regex(value: Any) -> re.Pattern[str]:
    try:
        return re.compile(_str(value))
    except re.error as e:
        raise _Invalid(f"invalid regex {value!r}: {e}") from None


def _json_value(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError:
        raise _Invalid(f"{_describe(value)} cannot be passed to the engine as JSON") from None
    return value


# Values that name paths or the server's environment: where `${NAME}` is expanded. Nothing
# else is, so argv text and patterns stay literal.
_EXPANDED = (("host", "python"), ("host", "workdir"), ("host", "runs_dir"),
             ("server", "model"), ("server", "executable"), ("server", "env"),
             ("server", "speculative", "model"), ("preflight", "compile_files"),
             ("simulate", "gpu_state"), ("simulate", "nvml"), ("container", "volumes"),
             ("container", "python"))


def _expand(data: dict[str, Any], environ: Mapping[str, str]) -> tuple[str, ...]:
    """Expand `${NAME}` in place in the _EXPANDED values (those under `host` in each of the
    `[[hosts]]` tables too); the validator checks types later. Returns the values the
    environment gave to `server.env`, paths aside: the server's secrets (HF_TOKEN)."""
    hosts = data.get("hosts")
    if isinstance(hosts, list):
        for i, table in enumerate(hosts):
            if isinstance(table, dict):
                try:
                    _expand({"host": table}, environ)
                except _Invalid as e:
                    raise _Invalid(e.message, e.sub.replace(".host", f".hosts[{i}]", 1)) \
                        from None
    from_environ: list[str] = []
    for path in _EXPANDED:
        table: Any = data
        for key in path[:-1]:
            table = table.get(key) if isinstance(table, dict) else None
        if not isinstance(table, dict) or path[-1] not in table:
            continue
        value = table[path[-1]]
        where = "." + ".".join(path)
        try:
            if isinstance(value, str):
                table[path[-1]] = expand_vars(value, environ)
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, str):
                        where = f".{'.'.join(path)}[{i}]"
                        value[i] = expand_vars(item, environ)
            elif isinstance(value, dict):
                used = from_environ if path == ("server", "env") else None
                for name, item in value.items():
                    if isinstance(item, str):
                        where = f".{'.'.join(path)}.{name}"
                        value[name] = expand_vars(item, environ, used)
        except ValueError as e:
            raise _Invalid(str(e), where) from None
    return tuple(dict.fromkeys(v for v in from_environ if v and not _plainly_public(v)))


# A number or a switch (a port, a count, "true") is no secret, and hiding one (8000) would
# blank out every URL; nor is a path, and hiding one (${HOME}) every traceback's file names.
_PUBLIC_VALUE = re.compile(r"[-+]?\d+(?:\.\d+)?|true|false|yes|no|on|off", re.I)


def _plainly_public(value: str) -> bool:
    return value.startswith(("/", "~")) or _PUBLIC_VALUE.fullmatch(value) is not None


def _check_table(data: Any, table: Mapping[str, Check], required: tuple[str, ...] = (),
                 extra: Check | None = None) -> dict[str, Any]:
    """Check each key of `data` against `table`; absent keys keep the dataclass default.

    Keys not in the table are refused with the closest valid key, or, when `extra` is given,
    checked by it and collected under "extra" (pass-through keys).
    """
    if not isinstance(data, dict):
        raise _Invalid(f"expected a table, got {_describe(data)}")
    values: dict[str, Any] = {}
    passed: dict[str, Any] = {}
    for key, value in data.items():
        check = table.get(key, extra)
        if check is None:
            kind = "table" if isinstance(value, dict) else "key"
            hint = _suggest(key, table) or f"; valid keys: {', '.join(table)}"
            raise _Invalid(f"unknown {kind} {key!r}{hint}", f".{key}")
        try:
            (values if key in table else passed)[key] = check(value)
        except _Invalid as e:
            raise _Invalid(e.message, f".{key}{e.sub}") from None
    for key in required:
        if key not in values:
            raise _Invalid(f"missing required key {key!r}", f".{key}")
    if extra is not None:
        values["extra"] = passed
    return values


def _section(cls: type, table: Mapping[str, Check], required: tuple[str, ...] = (),
             extra: Check | None = None,
             post: Callable[[dict[str, Any]], None] | None = None) -> Check:
    def check(value: Any) -> Any:
        values = _check_table(value, table, required, extra)
        if post is not None:
            post(values)
        return cls(**values)
    return check


def _rule(value: Any) -> LogRule:
    if isinstance(value, str):
        return LogRule(_regex(value), value)
    values = _check_table(value, {"pattern": _regex, "label": _str}, required=("pattern",))
    return LogRule(values["pattern"], values.get("label") or values["pattern"].pattern)


def _check_server(values: dict[str, Any]) -> None:
    if values.get("model") is None and values.get("command") is None:
        raise _Invalid("missing required key 'model' (needed unless `command` is given)", ".model")
    if values.get("speculative") is not None:
        _check_engine_speculative(values["engine"], values["speculative"])


def _check_engine_speculative(engine: str, spec: SpeculativeConfig) -> None:
    """Each engine's speculative keys: vLLM's methods and token count are not SGLang's, and
    SGLang's steps, top-k and draft tokens are not vLLM's; SGLang's pass-through keys become
    `--speculative-<key>` flags, so they must be plain values."""
    if engine == "sglang":
        if spec.method not in SGLANG_METHODS:
            raise _Invalid(f"method {spec.method!r} is vLLM's; with engine = \"sglang\" use one "
                           f"of: {', '.join(SGLANG_METHODS)}", ".speculative.method")
        if spec.num_speculative_tokens is not None:
            raise _Invalid("num_speculative_tokens is vLLM's; with engine = \"sglang\" use "
                           f"{', '.join(SGLANG_SPECULATIVE_KEYS)}",
                           ".speculative.num_speculative_tokens")
        for key, value in spec.extra.items():
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise _Invalid(f"expected a string or a number (passed as --speculative-"
                               f"{key.replace('_', '-')}), got {_describe(value)}",
                               f".speculative.{key}")
        return
    for key in SGLANG_SPECULATIVE_KEYS:
        if getattr(spec, key) is not None:
            raise _Invalid(f"{key} is SGLang's (--speculative-{key.replace('_', '-')}); with "
                           f"engine = \"{engine}\" use num_speculative_tokens",
                           f".speculative.{key}")


def _check_speculative(values: dict[str, Any]) -> None:
    if values["method"] in DRAFTER_METHODS and values.get("model") is None:
        raise _Invalid(f"method {values['method']!r} needs the drafter's `model` "
                       "(a path or Hugging Face id)", ".model")


def _check_hosts(values: dict[str, Any]) -> None:
    """Either one `[host]`, or `[[hosts]]` (two or more, one head) with a `[cluster]`; the
    head becomes `host`, first among the nodes."""
    nodes = values.pop("hosts", None)
    if nodes is None:
        if "host" not in values:
            raise _Invalid("missing required table 'host' (or [[hosts]] for several)", ".host")
        if "cluster" in values:
            raise _Invalid("[cluster] needs several hosts: write them as [[hosts]] tables "
                           "with a role each", ".cluster")
        return
    if "host" in values:
        raise _Invalid("write either [host] or [[hosts]], not both", ".hosts")
    if len(nodes) < 2:
        raise _Invalid("[[hosts]] lists one host: write it as [host], or add the others",
                       ".hosts")
    heads = [i for i, n in enumerate(nodes) if n.role == "head"]
    if len(heads) != 1:
        raise _Invalid(f"exactly one host must have role = \"head\", found {len(heads)}",
                       ".hosts")
    targets = [n.host.target for n in nodes]
    for i, target in enumerate(targets):
        if targets.index(target) != i:
            raise _Invalid(f"host {target!r} is listed twice", f".hosts[{i}].target")
    if "cluster" not in values:
        raise _Invalid("several hosts need a [cluster] table (backend = \"ray\" or "
                       "\"native\")", ".cluster")
    if values["server"].engine != "vllm":
        raise _Invalid(f"several hosts are launched with vLLM's multi-node shapes only, not "
                       f"{values['server'].engine!r}", ".server.engine")
    tp = values["server"].tensor_parallel_size
    if values["cluster"].backend == "native" and tp % len(nodes):
        raise _Invalid(f"tensor_parallel_size {tp} does not split over {len(nodes)} hosts",
                       ".server.tensor_parallel_size")
    fault = values["simulate"].fault_host if "simulate" in values else None
    if fault is not None and fault not in targets:
        raise _Invalid(f"unknown host {fault!r}{_suggest(fault, targets)}; the hosts are: "
                       f"{', '.join(targets)}", ".simulate.fault_host")
    head = nodes[heads[0]]
    values["nodes"] = (head, *(n for n in nodes if n is not head))
    values["host"] = head.host


def _gpus(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, list):
        return _list(_bounded(_int, 0))(value)
    if isinstance(value, str) and value in ("all", "none"):
        return value
    raise _Invalid(f"expected \"all\", \"none\" or a list of device indices like [0, 1], "
                   f"got {_describe(value)}")


def _volume(value: Any) -> str:
    parts = _str(value).split(":")
    if not 2 <= len(parts) <= 3 or not all(parts[:2]) or not parts[1].startswith("/"):
        raise _Invalid(f"expected \"host:container[:opts]\" with an absolute container path, "
                       f"got {value!r}")
    return value


_SHM_SIZE = re.compile(r"\d+(?:[bkmg]b?)?", re.I)


def _shm_size(value: Any) -> str:
    if not _SHM_SIZE.fullmatch(_str(value)):
        raise _Invalid(f"expected a size like \"16g\" or \"512m\", got {value!r}")
    return value


def _check_container(values: dict[str, Any]) -> None:
    if values.get("ipc") is not None and values.get("shm_size") is not None:
        raise _Invalid("shm_size has no effect with ipc = \"host\" (the host's /dev/shm is "
                       "used): drop one", ".shm_size")
    for volume in values.get("volumes", ()):
        if _under_run_mount(volume.split(":")[1]):
            raise _Invalid(f"volume {volume!r} mounts over {RUN_MOUNT}, where specconsole "
                           "puts the run's log: mount it elsewhere", ".volumes")
    why = _run_args_conflict(values.get("run_args", ()))
    if why is not None:
        raise _Invalid(why, ".run_args")


RUN_MOUNT = "/run/specconsole"  # where the run's log is, inside the container
# `docker run` words that take a value (`--name X` or `--name=X`) and that specconsole reads
_VALUED = {"--name", "--pid", "--network", "--net", "--entrypoint", "-v", "--volume", "--mount",
           "-e", "--env", "-l", "--label", "--restart", "-p", "--publish"}
# what a word would break, when set at all
_OWNED = {
    "--rm": "the container would be removed as it ends, and its exit code and OOMKilled with it "
            "(specconsole keeps a crashed container until the profile's next launch)",
    "--name": "specconsole names the container after the run (specconsole-<run id>) to find "
              "it again for watch, kill and attach",
    "--entrypoint": "specconsole's wrapper is the entrypoint (it sends the output to the run's "
                    "log): set container.entrypoint = \"command\" and [server] instead",
    "--pid": "the container must have its own process namespace: specconsole pairs the pids "
             "the log prints with the host's through it",
}


def _run_words(words: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """(flag, its value or None) for each flag of `docker run` words as written."""
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=")
        if flag in _VALUED and not eq:
            value, i = (words[i + 1] if i + 1 < len(words) else ""), i + 1
        yield (flag, value if (eq or flag in _VALUED) else None)
        i += 1


def _under_run_mount(path: str) -> bool:
    """A mount at the run's mount point or inside it (one on a parent is laid first and the
    log's file mount over it, so it is no conflict)."""
    path = path.rstrip("/")
    return path == RUN_MOUNT or path.startswith(RUN_MOUNT + "/")


def _mount_targets(flag: str, value: str) -> list[str]:
    """Where `-v host:target[:opts]` or `--mount type=...,target=...` mounts, in the container."""
    if flag in ("-v", "--volume"):
        return value.split(":")[1:2]
    if flag == "--mount":
        return [v for k, _, v in (p.partition("=") for p in value.split(","))
                if k in ("target", "dst", "destination")]
    return []


def _run_args_conflict(words: Sequence[str]) -> str | None:
    """Why a word of run_args breaks what specconsole sets, in words (None when none does)."""
    for flag, value in _run_words(words):
        why = _OWNED.get(flag)
        if flag == "--restart" and value not in ("no", None):
            why = ("a restart policy brings a dead server back behind specconsole's back: its "
                   "death is the run's end (restart it with `r` or `specconsole PROFILE`)")
        elif flag in ("--network", "--net") and value is not None and (
                value == "none" or value.startswith("container:")):
            why = ("the server must be reachable for its health check: use the default "
                   "network, a network of your own or \"host\"")
        elif flag in ("-e", "--env") and value is not None and \
                value.partition("=")[0] == "SPECCONSOLE_RUN_ID":
            why = "specconsole sets SPECCONSOLE_RUN_ID: it finds the run's processes by it"
        elif flag in ("-l", "--label") and value is not None and value.startswith("specconsole."):
            why = "specconsole's own labels (specconsole.*) say which run a container is"
        elif value is not None and any(_under_run_mount(t) for t in _mount_targets(flag, value)):
            why = f"it mounts over {RUN_MOUNT}, where specconsole puts the run's log"
        if why is not None:
            shown = flag if value is None else f"{flag} {value}"
            return f"run_args has {shown!r}, against what specconsole relies on: {why}"
    return None


_SLURM_WORD = re.compile(r"[^\s'\"\\#]+")
_SLURM_MEM = re.compile(r"\d+[KMGT]?", re.I)
_GRES_ONE = r"[A-Za-z0-9_.-]+(?::[A-Za-z0-9_.-]+)*"
_SLURM_GRES = re.compile(rf"{_GRES_ONE}(?:,{_GRES_ONE})*")


def _slurm_word(value: Any) -> str:
    """One word of an #SBATCH line: no spaces, quotes, backslashes or `#` (sbatch reads
    its directives by words; nothing to escape, nothing lost)."""
    if not _SLURM_WORD.fullmatch(_str(value)):
        raise _Invalid(f"expected one word without spaces, quotes or '#', got {value!r}")
    return value


def _slurm_time(value: Any) -> str:
    try:
        slurm_time_seconds(_str(value))
    except ValueError as e:
        raise _Invalid(str(e)) from None
    return value


def _slurm_mem(value: Any) -> str:
    if not _SLURM_MEM.fullmatch(_str(value)):
        raise _Invalid(f"expected a memory size as sbatch takes it (\"64G\", \"4000\" MB), "
                       f"got {value!r}")
    return value


def _slurm_gres(value: Any) -> str:
    if not _SLURM_GRES.fullmatch(_str(value)):
        raise _Invalid(f"expected sbatch's --gres form like \"gpu:8\" or \"gpu:a100:8\", "
                       f"got {value!r}")
    return value


def _sbatch_word(value: Any) -> str:
    word = _slurm_word(value)
    if not word.startswith("-"):
        raise _Invalid(f"expected an sbatch option like \"--exclusive\" or "
                       f"\"--reservation=name\", got {value!r}")
    option = word.split("=", 1)[0]
    if option in SLURM_OWNED_OPTIONS or (len(option) > 2 and option[:2] in SLURM_OWNED_OPTIONS
                                         and not option.startswith("--")):
        hint = " (the job's name is [slurm].job_name)" if option[:2] in ("-J", "--") and (
            "job-name" in option or option.startswith("-J")) else ""
        raise _Invalid(f"{option} is written by specconsole's job script; drop it{hint}")
    return word


def _check_slurm(values: dict[str, Any]) -> None:
    if values.get("gpus_per_node") is not None and values.get("gres") is not None:
        raise _Invalid("give gpus_per_node or gres, not both", ".gres")
    if values.get("nodes", 1) != 1:
        raise _Invalid("a launch through Slurm runs on one node so far; several nodes (one "
                       "agent each) are not supported yet", ".nodes")


def _check_slurm_beside(values: dict[str, Any]) -> None:
    """What [slurm] does not combine with yet, said where it is written."""
    for table, what in (("container", "[container]"), ("nodes", "[[hosts]]")):
        if values.get(table):
            raise _Invalid(f"{what} is not supported inside a Slurm job yet: drop one of "
                           f"{what} and [slurm]", ".slurm")


def _node(value: Any) -> NodeConfig:
    values = _check_table(value, _NODE, required=("role", "target"))
    role, address = values.pop("role"), values.pop("address", None)
    return NodeConfig(role, HostConfig(**values), address)


_POSITIVE = _bounded(_float, 0, strict=True)
_HOST = {
    "target": _str, "jump": _str, "python": _str, "workdir": _str, "runs_dir": _str,
    "known_hosts": _str, "strict_host_keys": _bool, "keepalive_interval": _POSITIVE,
    "keepalive_count_max": _bounded(_int, 1), "connect_timeout": _POSITIVE,
}
_NODE = {**_HOST, "role": _one_of(ROLES), "address": _str}
_CLUSTER = {"backend": _one_of(CLUSTER_BACKENDS), "port": _bounded(_int, 1, 65535),
            "join_timeout": _duration, "ray": _list(_str, nonempty=True)}
_SPECULATIVE = {
    "method": _one_of(SPECULATIVE_METHODS), "model": _str,
    "num_speculative_tokens": _bounded(_int, 1),
} | {key: _bounded(_int, 1) for key in SGLANG_SPECULATIVE_KEYS}
_SERVER = {
    "engine": _one_of(ENGINES),
    "model": _str,
    "port": _bounded(_int, 1, 65535),
    "listen": _str,
    "tensor_parallel_size": _bounded(_int, 1),
    "executable": _list(_str, nonempty=True),
    "args": _list(_str),
    "env": _env,
    "secret_env": _list(_env_name),
    "command": _list(_str, nonempty=True),
    "speculative": _section(SpeculativeConfig, _SPECULATIVE, ("method",), extra=_json_value,
                            post=_check_speculative),
}
_PREFLIGHT = {name: _bool for name in (
    "enabled", "compile", "engine_package", "gpus_free", "port_free", "paths_exist",
    "spec_consistent")} | {"compile_files": _list(_str)}
_LOGS = {"hide": _list(_rule), "harmless": _list(_rule)}
_EXPECT = {"load_time": _duration, "stall_timeout": _duration, "ready_timeout": _duration,
           "on_ready_timeout": _one_of(ON_READY_TIMEOUT), "stacks_on_stall": _bool,
           "serving_probe_interval": _duration}
_ALERTS = {"on_ready": _str, "on_dead": _str, "on_stalled": _str, "hook_timeout": _duration,
           "tmux": _bool}
_SMOKE = {"enabled": _bool, "kind": _one_of(("completion", "chat")), "prompt": _str,
          "max_tokens": _bounded(_int, 1, 4096), "timeout": _duration}
_SIMULATE = {
    "scenario": _one_of(SCENARIOS), "time_scale": _POSITIVE, "gpus": _bounded(_int, 1),
    "gpu_state": _str, "fault_host": _str, "nvml": _str,
}
_CONTAINER = {
    "runtime": _one_of(RUNTIMES), "image": _str, "gpus": _gpus, "ipc": _one_of(("host",)),
    "shm_size": _shm_size, "volumes": _list(_volume), "run_args": _list(_str),
    "entrypoint": _one_of(ENTRYPOINTS), "python": _str, "pull": _one_of(PULL_POLICIES),
}
_SLURM = {
    "partition": _slurm_word, "account": _slurm_word, "qos": _slurm_word, "time": _slurm_time,
    "nodes": _bounded(_int, 1), "gpus_per_node": _bounded(_int, 1), "gres": _slurm_gres,
    "cpus_per_task": _bounded(_int, 1), "mem": _slurm_mem, "constraint": _slurm_word,
    "sbatch_args": _list(_sbatch_word), "job_name": _slurm_word, "reach": _one_of(SLURM_REACH),
    "alert_before": _duration,
}
_TOP = {
    "host": _section(HostConfig, _HOST, ("target",)),
    "hosts": _list(_node, nonempty=True),
    "cluster": _section(ClusterConfig, _CLUSTER, ("backend",)),
    "server": _section(ServerConfig, _SERVER, ("engine",), post=_check_server),
    "preflight": _section(PreflightConfig, _PREFLIGHT),
    "logs": _section(LogsConfig, _LOGS),
    "expect": _section(ExpectConfig, _EXPECT),
    "alerts": _section(AlertsConfig, _ALERTS),
    "smoke": _section(SmokeConfig, _SMOKE),
    "simulate": _section(SimulateConfig, _SIMULATE),
    "container": _section(ContainerConfig, _CONTAINER, ("image",), post=_check_container),
    "slurm": _section(SlurmConfig, _SLURM, post=_check_slurm),
}


# --- where in the text: line numbers by scanning ----------------------------------------------

_HEADER = re.compile(r"\s*(\[\[?)\s*([^\[\]]+?)\s*\]")
_KEY = re.compile(r"\s*([A-Za-z0-9_\-.\"' ]+?)\s*=(.*)")
_ITEM = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|\{[^{}]*\}")
_LAST_PART = re.compile(r"(?:^|\.)[^.\[\]]+$|\[\d+\]$")
_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def _syntax_error(path: str, text: str, message: str) -> ProfileError:
    """tomllib says "(at line L, column C)" or "(at end of document)"; keep both as numbers."""
    at = _AT.search(message)
    line = column = None
    if at is not None:
        message = message[:at.start()]
        if at.group(1):
            line, column = int(at.group(1)), int(at.group(2))
        else:
            lines = text.splitlines() or [""]
            line, column = len(lines), len(lines[-1]) + 1
    return ProfileError(path, f"TOML syntax error: {message}", line=line, column=column)


def _dotted(key: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in key.split("."))


def _key_lines(text: str) -> dict[str, int]:
    """Map key paths ("server.port", "logs.hide[1]") to the line that first defines them.

    A heuristic over the text: headers, `key = value` lines, `[[array]]` tables and the items of
    a multi-line array written one string or inline table at a time. Good enough to point at a
    line; when it cannot, the caller falls back to the enclosing key.
    """
    found: dict[str, int] = {}
    table = ""
    counts: dict[str, int] = {}
    array: tuple[str, int] | None = None  # (path, next item index) inside a multi-line array
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if array is not None:
            if stripped.startswith("]"):
                array = None
            elif not stripped.startswith("#"):
                path, index = array
                for _ in _ITEM.findall(line):
                    found.setdefault(f"{path}[{index}]", number)
                    index += 1
                array = (path, index)
            continue
        header = _HEADER.match(line)
        if header is not None:
            table = _dotted(header.group(2))
            if header.group(1) == "[[":
                counts[table] = counts.get(table, -1) + 1
                table = f"{table}[{counts[table]}]"
            found.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key is not None:
            path = f"{table}.{_dotted(key.group(1))}" if table else _dotted(key.group(1))
            found.setdefault(path, number)
            if re.fullmatch(r"\s*\[\s*(#.*)?", key.group(2)):
                array = (path, 0)
    return found


def _find_line(text: str, key: str) -> int | None:
    """The line of `key`, or of the nearest enclosing key or table the text shows."""
    lines = _key_lines(text)
    while key in lines or _LAST_PART.search(key):
        if key in lines:
            return lines[key]
        key = _LAST_PART.sub("", key)
    return None
