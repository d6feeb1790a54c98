"""Startup phases of an inference server, recognised from its log lines.

Rules match message text (never `[file.py:line]`, which moves every release) and accept the
wordings of several vLLM versions (see vllm-reference.md, section 1); SGLang has its own table
(section 5). Nearly every line matches
nothing, so rules are bucketed by the message's first character and guarded by a literal needle;
a regex runs only to extract numbers from a line already known to be a phase line.

A hit may name an earlier phase than the last one (a drafter's second "Resolved architecture",
"Loading weights took" after the drafter): consumers keep the furthest phase.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from tui.core.logline import LogLine


@functools.total_ordering
class Phase(enum.Enum):
    """Ordered startup phases; `str()` is the human label ("loading weights")."""

    QUEUED = -1  # a Slurm job waiting in the scheduler's queue: before the server exists
    PULLING = 0  # a container's image absent on the host, pulled before the container starts
    LAUNCH = 1
    CONFIG = 2
    WEIGHTS = 3
    DRAFTER = 4
    COMPILE = 5
    KV_CACHE = 6
    CUDA_GRAPHS = 7
    API_SERVER = 8
    READY_LOG = 9
    SERVING = 10

    @property
    def label(self) -> str:
        return _LABELS[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Phase):
            return NotImplemented
        return self.value < other.value

    def __str__(self) -> str:
        return _LABELS[self]


_LABELS = {
    Phase.QUEUED: "queued",
    Phase.PULLING: "pulling image",
    Phase.LAUNCH: "launching",
    Phase.CONFIG: "reading config",
    Phase.WEIGHTS: "loading weights",
    Phase.DRAFTER: "loading drafter",
    Phase.COMPILE: "compiling",
    Phase.KV_CACHE: "allocating KV cache",
    Phase.CUDA_GRAPHS: "capturing CUDA graphs",
    Phase.API_SERVER: "starting API server",
    Phase.READY_LOG: "application started",
    Phase.SERVING: "serving",
}


@dataclass(frozen=True, slots=True)
class PhaseHit:
    """A line that places the server in `phase`; progress is 0..1 (1.0: the phase's work is
    done), shards is (loaded, total) for checkpoint shards."""

    phase: Phase
    progress: float | None = None
    shards: tuple[int, int] | None = None
    detail: str | None = None
    version: str | None = None


_Handler = Callable[[str], "PhaseHit | None"]


def _fixed(phase: Phase, progress: float | None = None) -> _Handler:
    hit = PhaseHit(phase, progress)
    return lambda _msg: hit


def _detail(phase: Phase, pattern: str, progress: float | None = None,
            fmt: str = "{0}") -> _Handler:
    """The groups of `pattern`, through `fmt`, become the detail."""
    search = re.compile(pattern).search

    def handle(msg: str) -> PhaseHit:
        m = search(msg)
        return PhaseHit(phase, progress, None, fmt.format(*m.groups()) if m else None)
    return handle


_TQDM = re.compile(r"(\d+)%(?:.*?(\d+)/(\d+))?")


def _bar(phase: Phase, with_shards: bool) -> _Handler:
    """A tqdm bar: progress from `n/total`, or from the percentage when there are no counts.
    A log shipper that drops tqdm's carriage returns leaves every redraw on one line: the last
    one is the current state."""
    def handle(msg: str) -> PhaseHit:
        m = None
        for m in _TQDM.finditer(msg):  # noqa: B007 — the last match is wanted
            pass
        if m is None:
            return PhaseHit(phase)
        if m.group(3) is None or not int(m.group(3)):
            return PhaseHit(phase, int(m.group(1)) / 100)
        n, total = int(m.group(2)), int(m.group(3))
        return PhaseHit(phase, n / total, (n, total) if with_shards else None)
    return handle


_BANNER_VERSION = re.compile(r"\bversion\s+(\S+)")
_BANNER_MODEL = re.compile(r"\bmodel\s+(\S+)")
_BLOCKS = "▄█▀"


def _banner(msg: str) -> PhaseHit | None:
    """The ASCII-art banner (v0.16+): one line ends `version X`, the next `model   M`."""
    s = msg.lstrip()
    if not s or s[0] not in _BLOCKS:
        return None
    v = _BANNER_VERSION.search(s)
    if v is not None:
        return PhaseHit(Phase.LAUNCH, version=v.group(1))
    m = _BANNER_MODEL.search(s)
    return PhaseHit(Phase.LAUNCH, detail=m.group(1) if m else None)


def _version(phase: Phase, pattern: str) -> _Handler:
    search = re.compile(pattern).search

    def handle(msg: str) -> PhaseHit:
        m = search(msg)
        return PhaseHit(phase, version=m.group(1) if m else None)
    return handle


def _graphs(msg: str) -> PhaseHit | None:
    if "CUDA graph" not in msg and "cudagraph" not in msg:
        return None
    return _graphs_bar(msg)


_graphs_bar = _bar(Phase.CUDA_GRAPHS, with_shards=False)
_COMPILE_TOTAL = re.compile(r"(?:took|takes) ([\d.]+ s)")


def _compile_total(msg: str) -> PhaseHit:
    """`torch.compile takes X s in total` (<= v0.11) or `torch.compile and initial profiling run
    took X s in total` (v0.16+) close the phase; other torch.compile lines are inside it."""
    m = _COMPILE_TOTAL.search(msg)
    return PhaseHit(Phase.COMPILE, 1.0, None, m.group(1)) if m else _IN_COMPILE


_IN_COMPILE = PhaseHit(Phase.COMPILE)
_ANSWERED = re.compile(r'"POST /\S+ HTTP/1\.\d" [24]\d\d\b')
_SERVING_HIT = PhaseHit(Phase.SERVING)


def _answered(msg: str) -> PhaseHit | None:
    """uvicorn's access line (`127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200 OK`): the
    engine did work for a request, so it serves; a 4xx is a request refused by a server that
    goes on (a traceback logged for one request is not the server's death). A GET is no proof
    (vLLM's API server answers /v1/models after its engine died; /health is the console's own
    probe), nor a 5xx (what it answers once the engine is dead)."""
    return _SERVING_HIT if _ANSWERED.search(msg) is not None else None

# SGLang's launcher warms the server up with one request of its own (entrypoints/http_server.py
# _execute_server_warmup: POST /generate, /encode, or /v1/chat/completions for a VLM), answered
# before "fired up": only an answer on another path shows a client served.
_SGLANG_WARMUP = re.compile(r'"POST /(?:generate|encode|v1/chat/completions)[ ?]')


def _answered_sglang(msg: str) -> PhaseHit | None:
    return _SERVING_HIT if answers_a_client(msg, "sglang") else None


def answers_a_client(text: str, engine: str) -> bool:
    """Does this uvicorn line show a client's POST answered (2xx, or a 4xx refusal by a server
    that goes on)? SGLang's own warm-up request does not count."""
    return _ANSWERED.search(text) is not None and not (
        engine == "sglang" and _SGLANG_WARMUP.search(text) is not None)


_LAYER = re.compile(r"^[0-9a-f]{12}: ")
_PULLING_HIT = PhaseHit(Phase.PULLING)
_LAYERS = re.compile(r"(\d+)/(\d+) layers")


def _layer(msg: str) -> PhaseHit | None:
    """docker's line for one layer, `<12 hex digits>: <status>` (its progress bars are drawn
    only on a terminal; the agent's monitor pipes the pull, so each status is one line)."""
    return _PULLING_HIT if _LAYER.match(msg) is not None else None


def _pull_progress(msg: str) -> PhaseHit:
    """The monitor's own lines (tui/agent/container.py): `specconsole: pulling image X ...`,
    then `... N/M layers` after each layer docker completes."""
    m = _LAYERS.search(msg)
    if m is None or not int(m.group(2)):
        return _PULLING_HIT
    return PhaseHit(Phase.PULLING, int(m.group(1)) / int(m.group(2)), None,
                    f"{m.group(1)}/{m.group(2)} layers")


_ANY = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_."
_HEX = "0123456789abcdef"
# The pull of a container's image (docker, and podman's own words): the agent's monitor runs
# it before the container starts, its output the first lines of server.log.
_PULL_RULES: tuple[tuple[str, str, _Handler], ...] = (
    ("s", "specconsole: pulling image", _pull_progress),
    (_ANY, ": Pulling from ", _fixed(Phase.PULLING)),  # `<tag>: Pulling from <repository>`
    (_HEX, ": Pulling fs layer", _layer),
    (_HEX, ": Waiting", _layer),
    (_HEX, ": Downloading", _layer),
    (_HEX, ": Verifying Checksum", _layer),
    (_HEX, ": Download complete", _layer),
    (_HEX, ": Extracting", _layer),
    (_HEX, ": Pull complete", _layer),
    (_HEX, ": Already exists", _layer),
    ("D", "Digest: sha256:", _fixed(Phase.PULLING)),
    ("S", "Status: Downloaded newer image for", _fixed(Phase.PULLING, 1.0)),
    ("T", "Trying to pull ", _fixed(Phase.PULLING)),
    ("G", "Getting image source signatures", _fixed(Phase.PULLING)),
    ("C", "Copying blob ", _fixed(Phase.PULLING)),
    ("C", "Copying config ", _fixed(Phase.PULLING)),
    ("W", "Writing manifest to image destination", _fixed(Phase.PULLING)),
    ("S", "Storing signatures", _fixed(Phase.PULLING)),
)

# (first characters of the message, needle it must contain, handler); first hit wins.
_RULES: tuple[tuple[str, str, _Handler], ...] = (
    (" ▄█▀", "", _banner),
    ("v", "vLLM API server version", _version(Phase.LAUNCH, r"version\s+(\S+)")),
    ("n", "non-default args", _fixed(Phase.CONFIG)),
    ("R", "Resolved architecture", _detail(Phase.CONFIG, r"Resolved architecture: (\S+)")),
    ("U", "Using max model len", _fixed(Phase.CONFIG)),
    ("C", "Chunked prefill is enabled", _fixed(Phase.CONFIG)),
    ("I", "LLM engine (v", _version(Phase.CONFIG, r"LLM engine \(v([^)\s]+)\)")),
    ("w", "world_size=", _fixed(Phase.CONFIG)),
    ("r", "is assigned as DP rank", _fixed(Phase.CONFIG)),
    ("S", "Starting to load model", _detail(Phase.WEIGHTS, r"Starting to load model (.+?)\.*$")),
    ("I", "Initializing model took", _fixed(Phase.WEIGHTS)),
    ("LM", "shards", _bar(Phase.WEIGHTS, with_shards=True)),
    ("L", "Loading weights took", _detail(Phase.WEIGHTS, r"took ([\d.]+) s", 1.0, "{0} s")),
    ("M", "Model loading took",
     _detail(Phase.WEIGHTS, r"took ([\d.]+) GiB(?: memory)? and ([\d.]+) s", 1.0,
             "{0} GiB in {1} s")),
    ("L", "Loading drafter model", _fixed(Phase.DRAFTER)),
    ("A", "Assuming the EAGLE head", _fixed(Phase.DRAFTER)),
    ("D", "Detected EAGLE model", _fixed(Phase.DRAFTER)),
    ("t", "torch.compile", _compile_total),
    ("U", "torch.compile", _fixed(Phase.COMPILE)),
    ("D", "Dynamo bytecode transform", _fixed(Phase.COMPILE)),
    ("D", "Directly load the compiled graph", _fixed(Phase.COMPILE)),
    ("C", "Compiling a graph", _fixed(Phase.COMPILE)),
    ("C", "Cache the graph", _fixed(Phase.COMPILE)),
    ("W", "Warming up done", _fixed(Phase.COMPILE, 1.0)),
    ("W", "Warming up model", _fixed(Phase.COMPILE)),
    ("[", "compiled", _fixed(Phase.COMPILE)),
    ("[", "warmup run took", _fixed(Phase.COMPILE)),
    ("A", "Available KV cache memory",
     _detail(Phase.KV_CACHE, r"Available KV cache memory: (-?[\d.]+ GiB)")),
    ("GC", "KV cache size", _detail(Phase.KV_CACHE, r"KV cache size: ([\d,]+ tokens)")),
    ("M", "Maximum concurrency", _fixed(Phase.KV_CACHE)),
    ("E", "for KV cache", _fixed(Phase.KV_CACHE)),
    ("#", "GPU blocks", _fixed(Phase.KV_CACHE)),
    ("i", "init engine", _detail(Phase.KV_CACHE, r"took ([\d.]+) s", 1.0, "{0} s")),
    ("C", "Capturing", _graphs),
    ("G", "Graph capturing finished",
     _detail(Phase.CUDA_GRAPHS, r"finished in (\d+) secs, took ([\d.]+) GiB", 1.0,
             "{0} s, {1} GiB")),
    ("S", "Starting vLLM", _detail(Phase.API_SERVER, r"server(?: \d+)? on (\S+)")),
    ("S", "Supported tasks", _fixed(Phase.API_SERVER)),
    ("A", "Available routes", _fixed(Phase.API_SERVER)),
    ("R", "Route: ", _fixed(Phase.API_SERVER)),
    ("S", "Started server process", _fixed(Phase.API_SERVER)),
    ("W", "Waiting for application startup", _fixed(Phase.API_SERVER)),
    ("A", "Application startup complete", _fixed(Phase.READY_LOG)),
    ("U", "Uvicorn running on", _fixed(Phase.READY_LOG)),
    ("AE", "Avg prompt throughput", _fixed(Phase.SERVING)),
    ("S", "SpecDecoding metrics", _fixed(Phase.SERVING)),
    # an offline run (`LLM.generate`, entrypoints/llm.py _run_engine's tqdm bar): generating
    ("P", "Processed prompts", _fixed(Phase.SERVING)),
    ("0123456789", ' HTTP/1.', _answered),
    *_PULL_RULES,
)


_SGLANG_GRAPH = re.compile(r"Capture (?:\w+ )*?(?:cuda|CUDA) graph (begin|end)")
_SGLANG_GRAPH_TIME = re.compile(r"Time elapsed: ([\d.]+ s)")


def _sglang_graph(msg: str) -> PhaseHit | None:
    """`Capture cuda graph begin. ...` / `... end. Time elapsed: X s. ...`; the draft model's
    and newer builds' piecewise captures say `Capture draft cuda graph`,
    `Capture piecewise CUDA graph`."""
    m = _SGLANG_GRAPH.match(msg)
    if m is None:
        return None
    if m.group(1) == "begin":
        return PhaseHit(Phase.CUDA_GRAPHS)
    t = _SGLANG_GRAPH_TIME.search(msg)
    return PhaseHit(Phase.CUDA_GRAPHS, 1.0, None, t.group(1) if t else None)


# SGLang (vllm-reference.md, section 5): no banner, so the first phase is the config; uvicorn
# starting is only the API server's phase, as SGLang is ready after its warmup request ("fired
# up"); a prefill batch or an answered POST may be the warmup's own, a decode batch serves.
_SGLANG_RULES: tuple[tuple[str, str, _Handler], ...] = (
    ("s", "server_args=", _fixed(Phase.CONFIG)),
    ("I", "Init torch distributed", _fixed(Phase.CONFIG)),
    ("L", "Load weight begin", _detail(Phase.WEIGHTS, r"avail mem=([\d.]+ GB)",
                                        fmt="{0} free")),
    ("LM", "shards", _bar(Phase.WEIGHTS, with_shards=True)),
    ("L", "Load weight end", _detail(Phase.WEIGHTS, r"mem usage=([\d.]+ GB)", 1.0)),
    ("K", "KV Cache is allocated", _detail(Phase.KV_CACHE, r"#tokens: (\d+)",
                                            fmt="{0} tokens")),
    ("M", "Memory pool end", _fixed(Phase.KV_CACHE, 1.0)),
    ("C", "graph ", _sglang_graph),
    ("C", "Capturing batches", _bar(Phase.CUDA_GRAPHS, with_shards=False)),
    ("S", "Started server process", _fixed(Phase.API_SERVER)),
    ("W", "Waiting for application startup", _fixed(Phase.API_SERVER)),
    ("A", "Application startup complete", _fixed(Phase.API_SERVER)),
    ("U", "Uvicorn running on", _detail(Phase.API_SERVER, r"running on (\S+)")),
    ("T", "fired up and ready to roll", _fixed(Phase.READY_LOG)),
    ("D", "Decode batch", _fixed(Phase.SERVING)),
    ("0123456789", ' HTTP/1.', _answered_sglang),
    *_PULL_RULES,
)


def _buckets(rules: tuple[tuple[str, str, _Handler], ...]
             ) -> dict[str, tuple[tuple[str, _Handler], ...]]:
    out: dict[str, list[tuple[str, _Handler]]] = {}
    for chars, needle, handler in rules:
        for c in chars:
            out.setdefault(c, []).append((needle, handler))
    return {c: tuple(rules) for c, rules in out.items()}


_VLLM = _buckets(_RULES)
_ENGINES = {"vllm": _VLLM, "sglang": _buckets(_SGLANG_RULES)}


_TABLES = {"vllm": _RULES, "sglang": _SGLANG_RULES}


def phase_needles(engine: str = "vllm") -> tuple[str, ...]:
    """A literal every phase line of `engine` holds (the banner's block characters for the
    rule that has no needle; the answered request's HTTP line): for the chunk scanner."""
    table = _TABLES.get(engine, _RULES)
    return tuple({needle for _, needle, _ in table if needle} | set(_BLOCKS))


def phase_initials(engine: str = "vllm") -> frozenset[str]:
    """The first characters of every message a phase rule can match: `detect_phase` answers
    None for any other line, so a caller with many lines can skip those without asking."""
    return frozenset(_ENGINES.get(engine, _VLLM))


def detect_phase(line: LogLine, engine: str = "vllm") -> PhaseHit | None:
    """The phase this line announces, or None (the answer for nearly every line)."""
    msg = line.message
    # An engine without rules of its own gets vLLM's: uvicorn and tqdm lines are shared.
    rules = _ENGINES.get(engine, _VLLM).get(msg[:1])
    if rules is None:
        return None
    for needle, handler in rules:
        if needle in msg:
            hit = handler(msg)
            if hit is not None:
                return hit
    return None
