"""Text of the SGLang lines the simulation prints, after vllm-reference.md, section 5.

Pure functions: the processes decide when, these decide what it looks like.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tui.sim.runtime import SimClock

SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
SCHEDULER_FAILED = "Scheduler hit an exception: "
READY = "The server is fired up and ready to roll!"
DRAFTERS = {"EAGLE3": "LlamaForCausalLMEagle3", "EAGLE": "LlamaForCausalLMEagle"}


@dataclass(frozen=True)
class Spec:
    """The speculative arguments the simulation uses (SGLang's defaults for EAGLE when unset:
    3 steps, top-k 1, 4 draft tokens)."""

    algorithm: str
    draft_model: str | None
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Spec | None:
        if not data:
            return None
        given = {k: v for k, v in data.items() if v is not None}
        return cls(**given)

    def as_json(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "draft_model": self.draft_model,
                "num_steps": self.num_steps, "eagle_topk": self.eagle_topk,
                "num_draft_tokens": self.num_draft_tokens}


def stamp(clock: SimClock) -> str:
    """SGLang's `%Y-%m-%d %H:%M:%S`, on the simulated clock so durations in messages agree."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(clock.t0 + clock.now()))


def rank_tag(rank: int, tp: int) -> str:
    """A scheduler's tag in its log lines and title: " TP3", or nothing when TP=1."""
    return f" TP{rank}" if tp > 1 else ""


def server_args(fields: dict[str, Any]) -> str:
    return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def load_end(arch: str, avail: float, usage: float) -> str:
    return (f"Load weight end. type={arch}, dtype=torch.bfloat16, avail mem={avail:.2f} GB, "
            f"mem usage={usage:.2f} GB.")


def kv_allocated(tokens: int, kv_gib: float) -> str:
    return (f"KV Cache is allocated. #tokens: {tokens}, K size: {kv_gib / 2:.2f} GB, "
            f"V size: {kv_gib / 2:.2f} GB")


def capture_begin(avail: float, draft: bool = False) -> str:
    what = "draft cuda graph" if draft else "cuda graph"
    return f"Capture {what} begin. This can take up to several minutes. avail mem={avail:.2f} GB"


def capture_end(seconds: float, usage: float, avail: float, draft: bool = False) -> str:
    what = "draft cuda graph" if draft else "cuda graph"
    return (f"Capture {what} end. Time elapsed: {seconds:.2f} s. mem usage={usage:.2f} GB. "
            f"avail mem={avail:.2f} GB.")


def capturing_desc(batch_size: int, avail: float) -> str:
    """The tqdm description of the graph capture bar (its bar: tui.sim.lines.tqdm_bar)."""
    return f"Capturing batches (bs={batch_size} avail_mem={avail:.2f} GB)"


def scheduler_info(tokens: int, context_len: int, avail: float) -> str:
    return (f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, "
            f"max_prefill_tokens=16384, max_running_requests=4096, context_len={context_len}, "
            f"available_gpu_mem={avail:.2f} GB")


def decode_batch(running: int, tokens: int, usage: float, gen_tps: float,
                 accept: tuple[float, float] | None) -> str:
    """SGLang's decode stats; `accept` (length, rate as a fraction) when speculative."""
    spec = f"accept len: {accept[0]:.2f}, accept rate: {accept[1]:.2f}, " if accept else ""
    return (f"Decode batch. #running-req: {running}, #token: {tokens}, token usage: "
            f"{usage:.2f}, {spec}cuda graph: True, gen throughput (token/s): {gen_tps:.2f}, "
            "#queue-req: 0")
