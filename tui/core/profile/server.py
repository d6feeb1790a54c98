"""`[server]`: the engine, its model and the server's command line and environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tui.core.profile.checks import (
    Table,
    _bounded,
    _env,
    _env_name,
    _int,
    _Invalid,
    _json_value,
    _list,
    _one_of,
    _section,
    _str,
)
from tui.core.profile.speculative import (
    _SPECULATIVE,
    SpeculativeConfig,
    _check_engine_speculative,
    _check_speculative,
)

ENGINES = ("vllm", "sglang")


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



def _check_server(values: dict[str, Any]) -> None:
    if values.get("model") is None and values.get("command") is None:
        raise _Invalid("missing required key 'model' (needed unless `command` is given)", ".model")
    if values.get("speculative") is not None:
        _check_engine_speculative(values["engine"], values["speculative"])


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

SERVER_TABLE = Table(
    "server", _section(ServerConfig, _SERVER, ("engine",), post=_check_server),
    expanded=(("model",), ("executable",), ("env",), ("speculative", "model")))
