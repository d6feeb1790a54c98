"""The simulated SGLang launch, in simulated seconds since the launcher started.

One table for the launcher and every scheduler, as `tui/sim/timeline.py` is for vLLM, whose
model (Kimi-K2.5 at TP 8 on H200s: weights, shards, memory) this shares, loaded the SGLang way.
"""

from __future__ import annotations

from tui.sim import timeline as tl

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
MEM_FRACTION_STATIC = 0.88  # --mem-fraction-static: weights and KV cache, of the device

# Launcher
SERVER_ARGS = 3.0  # imports done: `server_args=ServerArgs(...)`
SCHEDULERS_SPAWN = 4.5
HTTP_DELAY = 2.0  # every scheduler ready -> uvicorn's lines, the port listens
WARMUP_DELAY = 3.0  # uvicorn up -> the warmup `POST /generate`, then "fired up"
# Schedulers
DIST_BEGIN = 12.0  # CUDA context: "Init torch distributed begin."
DIST_END = 14.0
LOAD_BEGIN = 20.0  # "Load weight begin."
MODEL_IMPORT = 20.5  # the model file is imported (syntax-error dies here)
WEIGHTS_START = 22.0  # shard bars: tl.SHARDS over tl.WEIGHTS_SECONDS
LOAD_END = WEIGHTS_START + tl.WEIGHTS_SECONDS + 1.0
KV_CACHE = LOAD_END + 4.0  # "KV Cache is allocated", "Memory pool end"
GRAPHS_START = KV_CACHE + 2.0  # "Capture cuda graph begin", `Capturing batches` bars
GRAPHS_SECONDS = tl.GRAPHS_SECONDS
BATCH_SIZES = (512, *range(496, 15, -16), 8, 4, 2, 1)  # captured largest first
DRAFTER_START = GRAPHS_START + GRAPHS_SECONDS + 1.0  # EAGLE: the draft model, after the target
DRAFTER_SECONDS = tl.DRAFTER_SECONDS
DRAFT_GRAPHS_SECONDS = 20.0
DRAFT_GRAPHS_GIB = 0.3
STATS_INTERVAL = tl.STATS_INTERVAL  # `Decode batch.` lines while serving (rank 0)
FIRST_DECODE = HTTP_DELAY + WARMUP_DELAY + STATS_INTERVAL  # after "fired up"

# Failures
IMPORT_STAGGER = tl.WORKER_IMPORT_STAGGER
QUIT_ACK_REAL = 2.0  # a failing scheduler waits this long (real s) for the launcher's SIGUSR1
QUIT_SIGNAL_REAL = 0.2  # a child that exits lets its SIGQUIT arrive first, within this (real s)
KILL_TREE_REAL = 0.05  # first child gone -> the launcher SIGKILLs the tree and itself (real s)
MIN_FAIL_REAL = 1.5  # a scheduler fails no sooner (real s after launch): a watcher that attaches
# after the launch must see the tree before its first death, whatever the time scale


def kv_cache_gib(mem_fraction: float, drafter: bool) -> float:
    """SGLang's KV pool: the static fraction of the device, less what the weights hold."""
    held = tl.CONTEXT_GIB + tl.WEIGHTS_GIB + (tl.DRAFTER_GIB if drafter else 0.0)
    return max(1.0, mem_fraction * tl.DEVICE_TOTAL / tl.GIB - held)
