"""The agent's wire protocol: versioned JSON lines decoded into typed events.

The agent (tui/agent/) cannot import this module — it stands alone on the GPU
host — so the version number and message shapes are repeated there; `PROTOCOL_VERSION` must match.
Decoding never raises on a field the agent could not fill: missing values become None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tui.core.errors import AgentError
from tui.core.logline import strip_escapes

PROTOCOL_VERSION = 1

# The bootstrap, run as `python -u -c BOOTSTRAP <sha256> <subcommand>`: stdin brings a length
# line and that many bytes of the agent's archive (0 when the host already keeps it in
# ~/.specconsole/agent/<sha256>.pyz), then the spec as one JSON line, then EOF to stop. So one
# transfer carries code and spec, and secrets travel on stdin, never on a command line. An
# archive the host lacks (or that fails its hash) is an `agent_missing` error: send it again.
AGENT_BOOTSTRAP = (
    "import sys,os,hashlib,json\n"
    "h=sys.argv.pop(1);r=sys.stdin.buffer;n=int(r.readline());b=r.read(n)\n"
    "d=os.path.expanduser('~/.specconsole/agent');p=os.path.join(d,h+'.pyz')\n"
    "def good():\n"
    " try:\n"
    "  with open(p,'rb') as f:return hashlib.sha256(f.read()).hexdigest()==h\n"
    " except OSError:return False\n"
    "def fail(k,m):\n"
    " print(json.dumps({'t':'error','v':1,'kind':k,'message':m}),flush=True);sys.exit(4)\n"
    "if not good() and b and hashlib.sha256(b).hexdigest()==h:\n"
    " t=p+'.%d'%os.getpid()\n"
    " try:\n"
    "  os.makedirs(d,0o700,exist_ok=True)\n"
    "  with open(t,'wb') as f:f.write(b)\n"
    "  os.replace(t,p)\n"
    " except OSError as e:fail('agent_cache','cannot write '+p+': '+str(e.strerror or e))\n"
    "if not good():fail('agent_missing','no agent '+h[:12]+' in '+d)\n"
    "sys.path.insert(0,p)\n"
    "from specconsole_agent.main import main\n"
    "sys.exit(main())"
)


@dataclass(frozen=True, slots=True)
class Hello:
    agent: str
    python: str
    psutil: str | None
    pynvml: str | None
    nvml_ok: bool
    nvml_error: str | None
    gpu_count: int
    host: str
    pidfd: bool
    time: float
    redact: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Secrets:
    """Values of the profile's secret_env read from the server's environment, to redact."""

    redact: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int | None
    name: str
    cmd: str
    state: str | None
    cpu: float | None
    rss: int | None
    started: float | None
    alive: bool
    cpid: int | None = None  # its pid inside a container (what the engine's log prints)


@dataclass(frozen=True, slots=True)
class Procs:
    time: float
    procs: tuple[ProcInfo, ...]


@dataclass(frozen=True, slots=True)
class GpuProc:
    pid: int
    mem: int | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    mem_used: int | None
    mem_total: int | None
    util: int | None
    procs: tuple[GpuProc, ...] = ()
    lost: bool = False  # NVML says the device fell off the bus: its numbers are gone


@dataclass(frozen=True, slots=True)
class Gpus:
    time: float
    gpus: tuple[GpuInfo, ...]


@dataclass(frozen=True, slots=True)
class LogChunk:
    off: int
    end: int
    lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LogSkipped:
    """Attached to a long log: bytes [start, end) were not sent (read back by page on demand)."""

    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ProcExit:
    pid: int
    name: str
    code: int | None
    signal: int | None
    time: float
    top: bool
    cpid: int | None = None  # its pid inside a container
    # forked and never seen as itself (its parent's command line to the end): its name is
    # its parent's, not its own (a worker's compiler child reaped before its exit was read)
    forked: bool = False
    # its parent's name, when the agent watched the parent and the parent is not the server's
    # own command (a wrapper script's children are the server)
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class RunExit:
    pid: int | None
    code: int | None
    signal: int | None
    time: float
    oom_killed: bool = False  # the container's memory limit killed it (the runtime says)
    container: str | None = None


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    path: str
    status: int | None
    time: float


@dataclass(frozen=True, slots=True)
class AgentFault:
    kind: str
    message: str
    module: str | None = None


@dataclass(frozen=True, slots=True)
class Launched:
    """`pulling`: the container's image being pulled first (no container yet: `pid` is the
    agent's monitor, the watch finds the container's processes when they start)."""

    run_id: str
    run_dir: str
    pid: int
    pgid: int | None
    log: str
    pulling: str | None = None


@dataclass(frozen=True, slots=True)
class KillStep:
    step: str
    pids: tuple[int, ...]
    time: float


@dataclass(frozen=True, slots=True)
class Killed:
    remaining: tuple[int, ...]
    gpu_released: bool | None
    gpu_holders: tuple[dict[str, Any], ...]
    time: float


@dataclass(frozen=True, slots=True)
class Served:
    """How a run's server is reached and read, as it was launched (recorded in launch.json):
    attaching probes these, never the profile's current values, which may have changed."""

    engine: str
    port: int
    health: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"engine": self.engine, "port": self.port, "health": list(self.health)}


def _served(d: Any) -> Served | None:
    if not isinstance(d, dict) or not isinstance(d.get("port"), int):
        return None  # a run launched before launch.json recorded it
    return Served(engine=str(d.get("engine") or ""), port=int(d["port"]),
                  health=tuple(str(p) for p in d.get("health") or ()))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class AttachedFacts:
    """What the agent's attach learned of a server specconsole did not launch, as launch.json
    records it under `attached` (tui/agent/attach.py writes it): the process, and for a
    container its runtime, id, name, start, image and compose project. Whose it is, in words:
    tui.core.attach.attached_words."""

    kind: str  # "pid" or "container"
    pid: int | None
    start_ticks: int | None
    started: float | None  # the process's start, epoch seconds
    user: str | None
    pgid: int | None
    sid: int | None
    cmd: str  # redacted by the agent
    log: str | None = None  # the bare process's own log file, read in place
    runtime: str | None = None  # a container's, from here on
    id: str | None = None
    name: str | None = None
    started_at: str | None = None  # the runtime's StartedAt: the same container, not a new one
    image: str | None = None
    compose: str | None = None  # docker compose's project label

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> AttachedFacts:
        """Read leniently: a missing or mistyped fact is None (launch.json is the host's text)."""
        started = d.get("started")
        return cls(kind=str(d.get("kind") or ""), pid=_integer(d.get("pid")),
                   start_ticks=_integer(d.get("start_ticks")),
                   started=float(started) if isinstance(started, (int, float))
                   and not isinstance(started, bool) else None,
                   user=_text(d.get("user")), pgid=_integer(d.get("pgid")),
                   sid=_integer(d.get("sid")), cmd=str(d.get("cmd") or ""),
                   log=_text(d.get("log")), runtime=_text(d.get("runtime")),
                   id=_text(d.get("id")), name=_text(d.get("name")),
                   started_at=_text(d.get("started_at")), image=_text(d.get("image")),
                   compose=_text(d.get("compose")))

    def to_wire(self) -> dict[str, Any]:
        """The facts as the agent writes them (a container's keys only for a container)."""
        wire: dict[str, Any] = {
            "kind": self.kind, "pid": self.pid, "start_ticks": self.start_ticks,
            "started": self.started, "user": self.user, "pgid": self.pgid, "sid": self.sid,
            "cmd": self.cmd, "log": self.log}
        if self.kind == "container":
            wire |= {"runtime": self.runtime, "id": self.id, "name": self.name,
                     "started_at": self.started_at, "image": self.image,
                     "compose": self.compose}
        return wire


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as the agent lists it (`runs`): its launch.json's facts, alive or how it ended."""

    run_id: str
    profile_key: str
    run_dir: str
    started: float | None
    pid: int | None
    alive: bool
    exit: RunExit | None  # exit.json: how its top process (or container) ended
    served: Served | None = None
    # a server specconsole did not launch: what was attached (tui.core.attach.attached_words)
    attached: AttachedFacts | None = None
    restart: int = 0  # a Slurm job's requeues when its server started (the agent's pid file)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RunRecord:
        ended = d.get("exit")
        return cls(run_id=str(d["run_id"]), profile_key=str(d.get("profile_key", "")),
                   run_dir=str(d["run_dir"]), started=d.get("started"), pid=d.get("pid"),
                   alive=bool(d.get("alive")),
                   exit=_run_exit(ended) if isinstance(ended, dict) and ended else None,
                   served=_served(d.get("served")),
                   attached=AttachedFacts.from_wire(d["attached"])
                   if isinstance(d.get("attached"), dict) else None,
                   restart=d["restart"] if isinstance(d.get("restart"), int) else 0)


@dataclass(frozen=True, slots=True)
class Runs:
    runs: tuple[RunRecord, ...]


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A process holding GPU memory, as preflight found it: `leftover` when it carries the id of
    a run that has ended (the console may offer to kill it, by pid and start time)."""

    pid: int
    gpu: int
    mem: int | None
    name: str
    run_id: str | None
    start_ticks: int | None
    leftover: bool
    container: str | None = None  # the id of the container it runs in, if any


@dataclass(frozen=True, slots=True)
class BoxLeftover:
    """A container labelled with the id of a run that has ended, still up (holding GPUs, the
    port, or nothing yet): the console may stop and remove it, by id, only while it still
    carries that run id."""

    runtime: str
    id: str
    name: str
    run_id: str


Leftover = GpuHolder | BoxLeftover


def leftover_words(leftovers: tuple[Leftover, ...] | list[Leftover]) -> str:
    """`pids 1, 2; container specconsole-x`: what a kill of these leftovers acts on."""
    pids = [str(x.pid) for x in leftovers if isinstance(x, GpuHolder)]
    boxes = [x.name for x in leftovers if isinstance(x, BoxLeftover)]
    parts = [f"pids {', '.join(pids)}"] if pids else []
    if boxes:
        parts.append(f"container{'s' if len(boxes) > 1 else ''} {', '.join(boxes)}")
    return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Check:
    check: str
    ok: bool
    severity: str
    message: str
    holders: tuple[GpuHolder, ...] = ()
    containers: tuple[BoxLeftover, ...] = ()  # leftover containers of ended runs


@dataclass(frozen=True, slots=True)
class Preflight:
    checks: tuple[Check, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Stack:
    """One process's Python stacks as py-spy dumped them (`text`), or why not (`error`)."""

    pid: int
    name: str
    state: str | None
    ok: bool
    text: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class StacksDone:
    """Every process was asked; the dumps are saved on the host at `path`."""

    count: int
    path: str
    time: float


@dataclass(frozen=True, slots=True)
class Metrics:
    """The server's /metrics lines the watch asked for (its prefixes), fetched on the GPU host."""

    path: str
    text: str
    time: float


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """The disk holding the run's log changed level: "low", "full" (the server's next lines
    may be lost) or "ok" again; `free` in bytes (None: unknown)."""

    level: str
    free: int | None
    path: str
    time: float


@dataclass(frozen=True, slots=True)
class HttpReply:
    """One request made from the GPU host: status (None: no answer), seconds, body."""

    status: int | None
    seconds: float
    body: str


AgentEvent = (Hello | Secrets | Procs | Gpus | LogChunk | LogSkipped | ProcExit | RunExit | Health
              | AgentFault | Launched | KillStep | Killed | Runs | Preflight | Metrics | HttpReply
              | DiskSpace | Stack | StacksDone)


def _proc(d: dict[str, Any]) -> ProcInfo:
    return ProcInfo(pid=int(d["pid"]), ppid=d.get("ppid"), name=str(d.get("name") or "?"),
                    cmd=str(d.get("cmd") or ""), state=d.get("state"), cpu=d.get("cpu"),
                    rss=d.get("rss"), started=d.get("started"), alive=bool(d.get("alive", True)),
                    cpid=_int_or_none(d.get("cpid")))


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _gpu(d: dict[str, Any]) -> GpuInfo:
    return GpuInfo(index=int(d["index"]), name=str(d.get("name") or "GPU"),
                   mem_used=d.get("mem_used"), mem_total=d.get("mem_total"), util=d.get("util"),
                   procs=tuple(GpuProc(int(p["pid"]), p.get("mem")) for p in d.get("procs") or ()),
                   lost=d.get("lost") is True)


def _hello(d: dict[str, Any]) -> Hello:
    nvml = d.get("nvml") or {}
    return Hello(agent=str(d.get("agent", "?")), python=str(d.get("python", "?")),
                 psutil=d.get("psutil"), pynvml=d.get("pynvml"), nvml_ok=bool(nvml.get("ok")),
                 nvml_error=nvml.get("error"), gpu_count=int(d.get("gpu_count") or 0),
                 host=str(d.get("host", "?")), pidfd=bool(d.get("pidfd")),
                 time=float(d.get("time", 0.0)),
                 redact=tuple(str(v) for v in d.get("redact") or ()))


def _holder(d: dict[str, Any]) -> GpuHolder:
    ticks = d.get("start_ticks")
    return GpuHolder(pid=int(d["pid"]), gpu=int(d.get("gpu") or 0), mem=d.get("mem"),
                     name=str(d.get("name") or "?"), run_id=d.get("run_id"),
                     start_ticks=ticks if isinstance(ticks, int) else None,
                     leftover=bool(d.get("leftover")),
                     container=d.get("container") if isinstance(d.get("container"), str)
                     else None)


def _box_leftover(d: dict[str, Any]) -> BoxLeftover:
    return BoxLeftover(str(d["runtime"]), str(d["id"]), str(d.get("name") or d["id"]),
                       str(d.get("run_id") or "?"))


def _run_exit(d: dict[str, Any]) -> RunExit:
    return RunExit(d.get("pid"), d.get("code"), d.get("signal"), float(d.get("time") or 0.0),
                   d.get("oom_killed") is True,
                   d.get("container") if isinstance(d.get("container"), str) else None)


_DECODERS: dict[str, Any] = {
    "hello": _hello,
    "secrets": lambda d: Secrets(tuple(str(v) for v in d.get("redact") or ())),
    "procs": lambda d: Procs(float(d["time"]), tuple(_proc(p) for p in d.get("procs") or ())),
    "gpus": lambda d: Gpus(float(d["time"]), tuple(_gpu(g) for g in d.get("gpus") or ())),
    "log": lambda d: LogChunk(int(d["off"]), int(d["end"]), tuple(d.get("lines") or ())),
    "log_skipped": lambda d: LogSkipped(int(d["off"]), int(d["end"])),
    "exit": lambda d: ProcExit(int(d["pid"]), str(d.get("name") or "?"), d.get("code"),
                               d.get("signal"), float(d["time"]), bool(d.get("top")),
                               _int_or_none(d.get("cpid")), d.get("forked") is True,
                               d.get("parent") if isinstance(d.get("parent"), str) else None),
    "run_exit": _run_exit,
    "health": lambda d: Health(bool(d["ok"]), str(d.get("path", "")), d.get("status"),
                               float(d["time"])),
    "error": lambda d: AgentFault(str(d.get("kind", "error")), str(d.get("message", "")),
                                  d.get("module")),
    "launched": lambda d: Launched(str(d["run_id"]), str(d["run_dir"]), int(d["pid"]),
                                   _int_or_none(d.get("pgid")), str(d["log"]),
                                   d["pulling"] if isinstance(d.get("pulling"), str)
                                   else None),
    "kill_step": lambda d: KillStep(str(d["step"]), tuple(d.get("pids") or ()),
                                    float(d["time"])),
    "killed": lambda d: Killed(tuple(d.get("remaining") or ()), d.get("gpu_released"),
                               tuple(d.get("gpu_holders") or ()), float(d["time"])),
    "runs": lambda d: Runs(tuple(RunRecord.from_wire(r) for r in d.get("runs") or ())),
    "metrics": lambda d: Metrics(str(d.get("path", "")), str(d.get("text", "")),
                                 float(d["time"])),
    "disk": lambda d: DiskSpace(str(d.get("level", "ok")),
                                d["free"] if isinstance(d.get("free"), int) else None,
                                str(d.get("path", "")), float(d["time"])),
    "http": lambda d: HttpReply(d.get("status"), float(d.get("seconds") or 0.0),
                                str(d.get("body", ""))),
    "stack": lambda d: Stack(int(d["pid"]), str(d.get("name") or "?"), d.get("state"),
                             bool(d.get("ok")), d.get("text"), d.get("error")),
    "stacks_done": lambda d: StacksDone(int(d.get("count") or 0), str(d.get("path", "")),
                                        float(d["time"])),
    "preflight": lambda d: Preflight(tuple(
        Check(str(c["check"]), bool(c["ok"]), str(c.get("severity", "error")),
              str(c.get("message", "")), tuple(_holder(h) for h in c.get("holders") or ()),
              tuple(_box_leftover(b) for b in c.get("containers") or ()))
        for c in d.get("checks") or ())),
}


# Messages whose text is kept byte for byte: log lines (rendered later, escapes stripped there,
# offsets must stay true), metrics and HTTP bodies (parsed, never drawn as they are), stack
# dumps (many lines: each is stripped of escapes where it is drawn).
_RAW = frozenset({"log", "metrics", "http", "stack"})


def _clean(value: Any) -> Any:
    """Every string from the host (process names, error messages, check verdicts) without
    escape sequences or control characters: such text may end up on the screen."""
    if isinstance(value, str):
        return value if value.isprintable() else strip_escapes(value)
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def decode(line: bytes | str, host: str = "agent") -> AgentEvent:
    """Decode one JSON line from the agent; a broken or foreign line is an AgentError."""
    try:
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        version = data.get("v")
        if version != PROTOCOL_VERSION:
            raise AgentError(host, f"agent speaks protocol {version}, this console speaks "
                                   f"{PROTOCOL_VERSION}; the agent sent is not this console's")
        kind = data["t"]
        if kind not in _RAW:
            data = {k: v if k == "redact" else _clean(v) for k, v in data.items()}
        return _DECODERS[kind](data)
    except AgentError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        raise AgentError(host, f"unreadable agent message ({exc!s}): {text[:120]!r}") from None


def agent_stdin(archive: bytes, spec: dict[str, Any]) -> bytes:
    """The bytes that feed AGENT_BOOTSTRAP: length line, the archive (b"" when the host keeps
    it), then the spec as one JSON line."""
    return b"%d\n" % len(archive) + archive + json.dumps(spec).encode() + b"\n"
