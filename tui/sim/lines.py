"""Text of the vLLM lines the simulation prints, after vllm-reference.md and real logs.

Pure functions: the roles decide when, these decide what it looks like (tqdm bars, the banner,
the engine config dump, the periodic stats lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# `[file.py:line]` of each message, as in a v0.16 log (rules must never rely on them).
SRC_BANNER = "utils.py:302"
SRC_ARGS = "utils.py:238"
SRC_PLUGINS = "__init__.py:41"
SRC_ARCH = "model.py:530"
SRC_MAX_LEN = "model.py:1553"
SRC_SCHEDULER = "scheduler.py:229"
SRC_ENGINE = "core.py:101"
SRC_PARALLEL = "parallel_state.py:1208"
SRC_RANKS = "parallel_state.py:1395"
SRC_TRITON = "gpt_oss_triton_kernels_moe.py:60"
SRC_RUNNER = "gpu_model_runner.py:3341"
SRC_LOADER = "default_loader.py:291"
SRC_LOADED = "gpu_model_runner.py:3420"
SRC_EAGLE = "eagle.py:644"
SRC_BACKENDS = "backends.py:631"
SRC_MONITOR = "monitor.py:34"
SRC_WORKER = "gpu_worker.py:298"
SRC_KV = "kv_cache_utils.py:1229"
SRC_GRAPHS = "gpu_model_runner.py:4390"
SRC_CORE_READY = "core.py:253"
SRC_API = "api_server.py:1818"
SRC_LAUNCHER = "launcher.py:46"
SRC_STATS = "loggers.py:248"
SRC_SPEC = "metrics.py:100"
SRC_EXECUTOR = "multiproc_executor.py:772"
SRC_EXECUTOR_MONITOR = "multiproc_executor.py:249"
SRC_CORE_FAIL = "core.py:1012"
SRC_CLIENT = "core_client.py:564"
SRC_ASYNC = "async_llm.py:480"

FUTURE_WARNINGS = (
    "<frozen importlib._bootstrap_external>:1301: FutureWarning: The cuda.cudart module is "
    "deprecated and will be removed in a future release, please switch to use the "
    "cuda.bindings.runtime module instead.",
    "<frozen importlib._bootstrap_external>:1301: FutureWarning: The cuda.nvrtc module is "
    "deprecated and will be removed in a future release, please switch to use the "
    "cuda.bindings.nvrtc module instead.",
)
DEPRECATED = "`torch_dtype` is deprecated! Use `dtype` instead!"
TRITON_ERROR = (
    "Failed to import Triton kernels. Please make sure your triton version is compatible. "
    "Error: cannot import name 'SparseMatrix' from 'triton_kernels.tensor' "
    "(/usr/local/lib/python3.12/dist-packages/triton_kernels/tensor.py)"
)
ROUTES = ("/openapi.json", "/docs", "/health", "/metrics", "/version", "/v1/models",
          "/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class Spec:
    """The parts of --speculative-config the simulation uses."""

    method: str
    model: str | None
    num_tokens: int

    @property
    def has_drafter(self) -> bool:
        return self.method != "ngram"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Spec:
        return cls(str(data.get("method", "eagle3")), data.get("model"),
                   int(data.get("num_speculative_tokens", 3)))


def architecture(model: str) -> str:
    return "KimiK25ForConditionalGeneration" if "kimi" in model.lower() else "DeepseekV3ForCausalLM"


def drafter_architecture(spec: Spec) -> str:
    return {"eagle3": "Eagle3DeepseekV2ForCausalLM", "eagle": "EagleDeepseekV3ForCausalLM",
            "mtp": "DeepSeekMTPModel"}.get(spec.method, "DeepseekV3ForCausalLM")


def banner(version: str, model: str) -> list[str]:
    return [
        "",
        "       █     █     █▄   ▄█",
        f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
        f"  █▄█▀ █     █     █     █  model   {model}",
        "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
        "",
    ]


def engine_config(version: str, model: str, spec: Spec | None, tp: int, max_len: int) -> str:
    spec_text = "None" if spec is None else (
        f"SpeculativeConfig(method={spec.method!r}, model={spec.model!r}, "
        f"num_spec_tokens={spec.num_tokens})")
    return (
        f"Initializing a V1 LLM engine (v{version}) with config: model={model!r}, "
        f"speculative_config={spec_text}, tokenizer={model!r}, skip_tokenizer_init=False, "
        "tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=True, "
        f"dtype=torch.bfloat16, max_seq_len={max_len}, download_dir=None, load_format=auto, "
        f"tensor_parallel_size={tp}, pipeline_parallel_size=1, data_parallel_size=1, "
        "disable_custom_all_reduce=False, quantization=compressed-tensors, enforce_eager=False, "
        "kv_cache_dtype=auto, device_config=cuda, seed=0, "
        f"served_model_name={model}, enable_prefix_caching=True, enable_chunked_prefill=True, "
        "pooler_config=None, compilation_config={'level': 3, 'mode': 3, "
        "'cudagraph_mode': [2, 1], 'use_inductor_graph_partition': False}"
    )


def shards_bar(label: str, done: int, total: int, elapsed: float) -> str:
    """tqdm in vLLM's checkpoint format: `{desc}: {percentage:3.0f}% Completed | n/total [..]`."""
    pct = 100.0 * done / total
    return f"{label}: {pct:3.0f}% Completed | {done}/{total} [{_times(done, total, elapsed)}]"


def tqdm_bar(desc: str, done: int, total: int, elapsed: float) -> str:
    """tqdm's default `{l_bar}{bar}{r_bar}` with a 10-cell bar."""
    frac = done / total
    cells = frac * 10
    full = int(cells)
    partial = " ▏▎▍▌▋▊▉"[int((cells - full) * 8)] if full < 10 else ""
    bar = ("█" * full + partial).ljust(10)
    return f"{desc}: {frac * 100:3.0f}%|{bar}| {done}/{total} [{_times(done, total, elapsed)}]"


def _times(done: int, total: int, elapsed: float) -> str:
    if done == 0 or elapsed <= 0:
        return f"{_clock(elapsed)}<?, ?it/s"
    per = elapsed / done
    rate = f"{per:.2f}s/it" if per >= 1 else f"{1 / per:5.2f}it/s"
    return f"{_clock(elapsed)}<{_clock(per * (total - done))}, {rate}"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def stats_line(prompt_tps: float, gen_tps: float, running: int, kv_usage: float,
               prefix_hit: float, waiting: int = 0) -> str:
    return (f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
            f"Avg generation throughput: {gen_tps:.1f} tokens/s, Running: {running} reqs, "
            f"Waiting: {waiting} reqs, GPU KV cache usage: {kv_usage:.1f}%, "
            f"Prefix cache hit rate: {prefix_hit:.1f}%")


def spec_line(drafts: int, accepted_per_pos: list[int], seconds: float,
              depth: int | None = None) -> str:
    """vLLM's SpecDecodingLogging line: v0.16's wording, or with `depth` the newer one that
    adds "Current speculative depth"."""
    accepted = sum(accepted_per_pos)
    drafted = drafts * len(accepted_per_pos)
    mean_len = 1 + accepted / drafts if drafts else 0.0
    per_pos = ", ".join(f"{a / drafts if drafts else 0.0:.3f}" for a in accepted_per_pos)
    rate = 100.0 * accepted / drafted if drafted else 0.0
    depth_text = f"Current speculative depth: {depth}, " if depth is not None else ""
    return (f"SpecDecoding metrics: Mean acceptance length: {mean_len:.2f}, {depth_text}"
            f"Accepted throughput: {accepted / seconds:.2f} tokens/s, "
            f"Drafted throughput: {drafted / seconds:.2f} tokens/s, "
            f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
            f"Per-position acceptance rate: {per_pos}, Avg Draft acceptance rate: {rate:.1f}%")
