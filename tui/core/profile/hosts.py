"""The hosts of a launch: `[host]`, or `[[hosts]]` (several, one head) with `[cluster]`,
how they form one server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tui.core.profile.checks import (
    _POSITIVE,
    Table,
    _bool,
    _bounded,
    _check_table,
    _duration,
    _int,
    _Invalid,
    _list,
    _one_of,
    _section,
    _str,
    _suggest,
)

ROLES = ("head", "worker")
CLUSTER_BACKENDS = ("ray", "native")
CLUSTER_PORTS = {"ray": 6379, "native": 29500}  # Ray's GCS port, torch's usual master port


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
    # a node of a Slurm job (tui.core.cluster.allocated): its name; `host` is then the login
    # node, through which it is reached as a step of the job
    job_node: str | None = None

    @property
    def reached_at(self) -> str:
        return self.address or self.host.target

    @property
    def where(self) -> str:
        """The host the member runs on, in words: the Slurm node's name, else the target."""
        return self.job_node or self.host.target


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


def _check_hosts(values: dict[str, Any]) -> None:
    """Either one `[host]`, or `[[hosts]]` (two or more, one head) with a `[cluster]`; the
    head becomes `host`, first among the nodes."""
    nodes = values.pop("hosts", None)
    if nodes is None:
        if "host" not in values:
            raise _Invalid("missing required table 'host' (or [[hosts]] for several)", ".host")
        job_nodes = getattr(values.get("slurm"), "nodes", 1)  # the scheduler picks them
        if "cluster" in values and job_nodes == 1 and "slurm" not in values:
            raise _Invalid("[cluster] needs several hosts: write them as [[hosts]] tables "
                           "with a role each", ".cluster")
        if job_nodes > 1:
            _check_cluster(values, job_nodes)
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
    _check_cluster(values, len(nodes))
    fault = values["simulate"].fault_host if "simulate" in values else None
    if fault is not None and fault not in targets:
        raise _Invalid(f"unknown host {fault!r}{_suggest(fault, targets)}; the hosts are: "
                       f"{', '.join(targets)}", ".simulate.fault_host")
    head = nodes[heads[0]]
    values["nodes"] = (head, *(n for n in nodes if n is not head))
    values["host"] = head.host


def _check_cluster(values: dict[str, Any], hosts: int) -> None:
    """What several hosts (or a Slurm job's several nodes) need of the server."""
    if "cluster" not in values:
        return  # said by the table that asks for several
    if values["server"].engine != "vllm":
        raise _Invalid(f"several hosts are launched with vLLM's multi-node shapes only, not "
                       f"{values['server'].engine!r}", ".server.engine")
    tp = values["server"].tensor_parallel_size
    if values["cluster"].backend == "native" and tp % hosts:
        raise _Invalid(f"tensor_parallel_size {tp} does not split over {hosts} hosts",
                       ".server.tensor_parallel_size")


def _node(value: Any) -> NodeConfig:
    values = _check_table(value, _NODE, required=("role", "target"))
    role, address = values.pop("role"), values.pop("address", None)
    return NodeConfig(role, HostConfig(**values), address)


_HOST = {
    "target": _str, "jump": _str, "python": _str, "workdir": _str, "runs_dir": _str,
    "known_hosts": _str, "strict_host_keys": _bool, "keepalive_interval": _POSITIVE,
    "keepalive_count_max": _bounded(_int, 1), "connect_timeout": _POSITIVE,
}
_NODE = {**_HOST, "role": _one_of(ROLES), "address": _str}
_CLUSTER = {"backend": _one_of(CLUSTER_BACKENDS), "port": _bounded(_int, 1, 65535),
            "join_timeout": _duration, "ray": _list(_str, nonempty=True)}

HOST_TABLE = Table("host", _section(HostConfig, _HOST, ("target",)),
                   expanded=(("python",), ("workdir",), ("runs_dir",)))
HOSTS_TABLE = Table("hosts", _list(_node, nonempty=True))
CLUSTER_TABLE = Table("cluster", _section(ClusterConfig, _CLUSTER, ("backend",)))
