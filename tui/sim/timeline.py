"""The simulated launch, as one schedule in simulated seconds since the API server started.

Why one table: every simulated process (API server, engine core, workers) reads the same times,
so the log, the GPU memory and the phase durations agree with each other, and a time scale of X
makes the whole 25-minute launch run in 25/X minutes. Durations follow a real Kimi-K2.5 launch
with TP=8 on H200s (weights about 20 minutes over 64 safetensors shards).
"""

from __future__ import annotations

VERSION = "0.16.1rc1+sim"
GIB = 1024**3

# Fake NVML device, as an H200 reports itself (143771 MiB).
DEVICE_NAME = "NVIDIA H200 (simulated)"
DEVICE_TOTAL = 143_771 * 1024**2

# API server
BANNER = 3.5  # imports done, banner + non-default args
RESOLVE_ARCH = 6.0  # model config fetched
ENGINE_CORE_SPAWN = 8.0
# Engine core
ENGINE_CONFIG = 9.2  # "Initializing a V1 LLM engine ..."
WORKERS_SPAWN = 10.0
# Workers
WORKER_INIT = 16.5  # CUDA context, world_size/rank lines
TRITON_IMPORT = 22.5  # the harmless "Failed to import Triton kernels" ERROR
MODEL_IMPORT = 23.0  # the model file is imported (syntax-error dies here)
LOAD_START = 23.5  # "Starting to load model"
WEIGHTS_START = 25.0
SHARDS = 64
WEIGHTS_SECONDS = 1200.0
DRAFTER_START = WEIGHTS_START + WEIGHTS_SECONDS + 1.0  # 1226
DRAFTER_SECONDS = 25.0
COMPILE_START = DRAFTER_START + DRAFTER_SECONDS + 1.0  # 1252
DYNAMO_SECONDS = 18.4
COMPILE_SECONDS = 145.0
KV_CACHE_START = COMPILE_START + COMPILE_SECONDS  # 1397
KV_CACHE_SECONDS = 15.0
GRAPHS_START = KV_CACHE_START + KV_CACHE_SECONDS  # 1412
GRAPHS_SECONDS = 65.0
ENGINE_READY = GRAPHS_START + GRAPHS_SECONDS + 1.0  # 1478: "init engine ... took"
API_READY_DELAY = 2.0  # engine ready -> "Application startup complete." (~1480 s)

# Failures (simulated seconds after the event they follow)
WORKER_IMPORT_STAGGER = 0.08  # rank r hits the broken import r * this later
ENGINE_FAIL_GRACE = 1.0  # engine core waits this long for the other workers, then kills them
ENGINE_FAIL_LOG = 1.5  # worker death -> "EngineCore failed to start."
ENGINE_FAIL_EXIT = 2.4  # worker death -> engine core exit 1
API_FAIL_EXIT = 2.5  # engine core death -> API server traceback, exit 1
OOM_SHARD = 41  # the last rank runs out of memory while loading this shard
HANG_SHARD = 37  # logging and memory growth stop here ...
HANG_EARLY_SHARDS = 7  # ... and the last rank's GPU stops this many shards earlier
ENGINE_KILL_AFTER = 120.0  # engine-killed: serve this long, then SIGKILL the engine core
DEAD_SHUTDOWN = 4.5  # engine death -> API server exits 0 (real vLLM: ~4.8 s)

# Serving
STATS_INTERVAL = 10.0  # vLLM's default log-stats interval

# Real-time floors: a high time scale must still leave a test time to see each state.
MIN_STATS_REAL = 0.5
MIN_SERVE_REAL = 3.0  # engine-killed serves at least this long: three of the 1 s readiness probes
# see it ready even on a loaded box, so the death is "while serving", never a race with READY
MIN_IMPORT_REAL = 1.0  # a worker lives at least this long before the model import can fail
MIN_DEAD_REAL = 1.0  # health answers 503 at least this long before the API server exits

# Memory per worker, GiB
CONTEXT_GIB = 0.62  # CUDA context + NCCL buffers
WEIGHTS_GIB = 72.53
DRAFTER_GIB = 1.58
PROFILE_PEAK_GIB = 4.8  # activation peak of the profiling run, freed afterwards
GRAPHS_GIB = 1.12
KV_BYTES_PER_TOKEN = 70_272  # MLA latent (512 + 64) x 61 layers x bf16

DEFAULT_GPU_UTIL = 0.9  # --gpu-memory-utilization


def shard_time(shard: int, start: float = WEIGHTS_START) -> float:
    """When shard number `shard` (1-based) of the target model finishes loading, the first
    having begun at `start`."""
    return start + WEIGHTS_SECONDS * shard / SHARDS


def weights_gib(shards_done: int) -> float:
    return CONTEXT_GIB + WEIGHTS_GIB * shards_done / SHARDS


def kv_cache_gib(gpu_util: float, drafter: bool) -> float:
    """What vLLM reports as "Available KV cache memory" after the profiling run."""
    budget = gpu_util * DEVICE_TOTAL / GIB
    return budget - (CONTEXT_GIB + WEIGHTS_GIB + PROFILE_PEAK_GIB + (DRAFTER_GIB if drafter else 0))
