"""Startup phases from vLLM log lines, across the wordings of several versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tui.core.logline import parse_line
from tui.core.phases import Phase, PhaseHit, detect_phase

FIXTURES = Path(__file__).parent / "fixtures"
A, E, W = "(APIServer pid=1)", "(EngineCore_DP0 pid=2)", "(Worker_TP0 pid=3)"


def rec(prefix: str, message: str, level: str = "INFO") -> str:
    return f"{prefix} {level} 03-20 02:24:49 [somefile.py:123] {message}"


# (raw line, expected hit)
CASES = [
    (rec(A, " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.17.1"),
     PhaseHit(Phase.LAUNCH, version="0.17.1")),
    (rec(A, "  █▄█▀ █     █     █     █  model   /models/tiny"),
     PhaseHit(Phase.LAUNCH, detail="/models/tiny")),
    (rec(A, "vLLM API server version 0.14.0rc1.dev221+g97a01308e"),
     PhaseHit(Phase.LAUNCH, version="0.14.0rc1.dev221+g97a01308e")),
    (rec(A, "non-default args: {'model': 'x', 'tensor_parallel_size': 8}"), PhaseHit(Phase.CONFIG)),
    (rec(A, "Resolved architecture: Eagle3LlamaForCausalLM"),
     PhaseHit(Phase.CONFIG, detail="Eagle3LlamaForCausalLM")),
    (rec(A, "Using max model len 131072"), PhaseHit(Phase.CONFIG)),
    (rec(E, "Initializing a V1 LLM engine (v0.27.1) with config: model='facebook/opt-125m', "
            "compilation_config={'level': 3}, torch.compile stuff"),
     PhaseHit(Phase.CONFIG, version="0.27.1")),
    ("INFO 09-04 17:38:34 llm_engine.py:213] Initializing an LLM engine (v0.6.0) with config: x",
     PhaseHit(Phase.CONFIG, version="0.6.0")),
    (rec(W, "rank 3 in world size 8 is assigned as DP rank 0, PP rank 0, TP rank 3, EP rank 3"),
     PhaseHit(Phase.CONFIG)),
    (rec(W, "Starting to load model meta-llama/Llama-3.3-70B-Instruct..."),
     PhaseHit(Phase.WEIGHTS, detail="meta-llama/Llama-3.3-70B-Instruct")),
    ("Loading safetensors checkpoint shards:  67% Completed | 2/3 [00:03<00:01,  1.92s/it]",
     PhaseHit(Phase.WEIGHTS, progress=2 / 3, shards=(2, 3))),
    (f"{W} \rLoading safetensors checkpoint shards:   0% Completed | 0/30 [00:00<?, ?it/s]"
     "\rLoading safetensors checkpoint shards:  50% Completed | 15/30 [00:22<00:22,  1.50s/it]",
     PhaseHit(Phase.WEIGHTS, progress=0.5, shards=(15, 30))),
    ("Loading safetensors checkpoint shards:   3% Completed | 1/30 [00:01<00:29,  1.50s/it]"
     "Loading safetensors checkpoint shards:   7% Completed | 2/30 [00:02<00:28,  1.50s/it]",
     PhaseHit(Phase.WEIGHTS, progress=2 / 30, shards=(2, 30))),  # carriage returns dropped
    ("Loading pt checkpoint shards: 100% Completed | 4/4 [00:10<00:00]",
     PhaseHit(Phase.WEIGHTS, progress=1.0, shards=(4, 4))),
    ("Multi-thread loading shards:  25% Completed | 1/4 [00:01<00:03]",
     PhaseHit(Phase.WEIGHTS, progress=0.25, shards=(1, 4))),
    (rec(W, "Loading weights took 45.51 seconds"),
     PhaseHit(Phase.WEIGHTS, progress=1.0, detail="45.51 s")),
    (rec(W, "Model loading took 13.04 GiB memory and 5.444196 seconds"),
     PhaseHit(Phase.WEIGHTS, progress=1.0, detail="13.04 GiB in 5.444196 s")),
    (rec(W, "Model loading took 27.5185 GiB and 305.873276 seconds"),
     PhaseHit(Phase.WEIGHTS, progress=1.0, detail="27.5185 GiB in 305.873276 s")),
    (rec(W, "Loading drafter model..."), PhaseHit(Phase.DRAFTER)),
    (rec(W, "Assuming the EAGLE head shares the same vocab embedding with the target model."),
     PhaseHit(Phase.DRAFTER)),
    (rec(W, "Detected EAGLE model without its own embed_tokens in the checkpoint."),
     PhaseHit(Phase.DRAFTER)),
    (rec(W, "Using cache directory: /root/.cache/vllm/torch_compile_cache/3f/rank_0_0/backbone for "
            "vLLM's torch.compile"), PhaseHit(Phase.COMPILE)),
    (rec(W, "Dynamo bytecode transform time: 12.31 s"), PhaseHit(Phase.COMPILE)),
    (rec(W, "Compiling a graph for compile range (1, 4096) takes 20.06 s"),
     PhaseHit(Phase.COMPILE)),
    (rec(W, "Directly load the compiled graph(s) for compile range (1, 4096) from the cache, took "
            "2.113 s"), PhaseHit(Phase.COMPILE)),
    (rec(W, "torch.compile takes 54.11 s in total"),
     PhaseHit(Phase.COMPILE, progress=1.0, detail="54.11 s")),
    (rec(W, "torch.compile and initial profiling run took 33.90 s in total"),
     PhaseHit(Phase.COMPILE, progress=1.0, detail="33.90 s")),
    (rec(W, "[backbone] Initial profiling/warmup run took 0.02 s"), PhaseHit(Phase.COMPILE)),
    (rec(W, "Available KV cache memory: 98.41 GiB"), PhaseHit(Phase.KV_CACHE, detail="98.41 GiB")),
    (rec(W, "Available KV cache memory: -8.59 GiB", "WARNING"),
     PhaseHit(Phase.KV_CACHE, detail="-8.59 GiB")),
    (rec(E, "GPU KV cache size: 2,578,432 tokens"),
     PhaseHit(Phase.KV_CACHE, detail="2,578,432 tokens")),
    (rec(E, "CPU KV cache size: 524,288 tokens, Maximum concurrency for 256 tokens per request: "
            "2048.00x"), PhaseHit(Phase.KV_CACHE, detail="524,288 tokens")),
    (rec(E, "Maximum concurrency for 131,072 tokens per request: 19.67x"),
     PhaseHit(Phase.KV_CACHE)),
    ("INFO 09-04 17:38:34 gpu_executor.py:122] # GPU blocks: 2048, # CPU blocks: 512",
     PhaseHit(Phase.KV_CACHE)),
    (rec(E, "init engine (profile, create kv cache, warmup model) took 83.47 seconds"),
     PhaseHit(Phase.KV_CACHE, progress=1.0, detail="83.47 s")),
    (f"{W} \rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/67"
     "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | 30/67",
     PhaseHit(Phase.CUDA_GRAPHS, progress=30 / 67)),
    ("Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:04<00:00,  8.02it/s]",
     PhaseHit(Phase.CUDA_GRAPHS, progress=1.0)),
    ("Capturing CUDA graphs:  40%|████      |", PhaseHit(Phase.CUDA_GRAPHS, progress=0.4)),
    (rec(W, "Capturing cudagraphs for decoding. This may lead to unexpected consequences."),
     PhaseHit(Phase.CUDA_GRAPHS)),
    (rec(W, "Graph capturing finished in 14 secs, took 1.62 GiB"),
     PhaseHit(Phase.CUDA_GRAPHS, progress=1.0, detail="14 s, 1.62 GiB")),
    (rec(A, "Starting vLLM API server 0 on http://0.0.0.0:8000"),
     PhaseHit(Phase.API_SERVER, detail="http://0.0.0.0:8000")),
    (rec(A, "Starting vLLM server on http://127.0.0.1:18000"),
     PhaseHit(Phase.API_SERVER, detail="http://127.0.0.1:18000")),
    (rec(A, "Supported tasks: ['generate']"), PhaseHit(Phase.API_SERVER)),
    (rec(A, "Available routes are:"), PhaseHit(Phase.API_SERVER)),
    (rec(A, "Route: /v1/models, Methods: GET"), PhaseHit(Phase.API_SERVER)),
    ("INFO:     Started server process [2741]", PhaseHit(Phase.API_SERVER)),
    (f"{A} INFO:     Waiting for application startup.", PhaseHit(Phase.API_SERVER)),
    ("INFO:     Application startup complete.", PhaseHit(Phase.READY_LOG)),
    (f"{A} INFO:     Application startup complete.", PhaseHit(Phase.READY_LOG)),
    (rec(A, "Engine 000: Avg prompt throughput: 51.2 tokens/s, Avg generation throughput: 118.4 "
            "tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%"),
     PhaseHit(Phase.SERVING)),
    ("INFO 09-04 17:38:34 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation "
     "throughput: 0.0 tokens/s", PhaseHit(Phase.SERVING)),
    (rec(A, "SpecDecoding metrics: Mean acceptance length: 2.71, Accepted throughput: 74.72 "
            "tokens/s"), PhaseHit(Phase.SERVING)),
]


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_detect_phase(raw: str, expected: PhaseHit) -> None:
    hit = detect_phase(parse_line(raw))
    assert hit is not None
    assert (hit.phase, hit.shards, hit.version) == (expected.phase, expected.shards,
                                                    expected.version)
    assert hit.progress == pytest.approx(expected.progress)
    if expected.detail is not None:
        assert hit.detail == expected.detail


@pytest.mark.parametrize("raw", [
    rec(W, "Loading model from scratch..."),
    rec(W, "Using Flash Attention backend on V1 engine."),
    rec(A, "Enforce eager set, disabling torch.compile and CUDA graphs."),
    rec(A, "Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: "
           "161152"),
    rec(W, "Cudagraph is disabled under eager mode", "WARNING"),
    '    version = importlib.metadata.version("vllm")',
    '  File "/usr/lib/python3.12/site-packages/vllm/entrypoints/cli/main.py", line 73, in main',
    "SyntaxError: invalid syntax",
    "RuntimeError: Engine core initialization failed. See root cause above.",
    rec(E, "No available shared memory broadcast block found in 60 seconds."),
    "",
    f"{E} ",
])
def test_lines_that_announce_no_phase(raw: str) -> None:
    assert detect_phase(parse_line(raw)) is None


def test_phases_are_ordered_and_labelled() -> None:
    order = list(Phase)
    assert order == sorted(order) and order[0] is Phase.QUEUED and order[-1] is Phase.SERVING
    assert Phase.QUEUED < Phase.PULLING < Phase.LAUNCH and Phase.PULLING.label == "pulling image"
    assert Phase.QUEUED.label == "queued"  # a Slurm job in the scheduler's queue
    assert Phase.WEIGHTS < Phase.DRAFTER < Phase.COMPILE < Phase.KV_CACHE < Phase.CUDA_GRAPHS
    assert max(Phase.KV_CACHE, Phase.CONFIG) is Phase.KV_CACHE
    assert Phase.WEIGHTS.label == "loading weights" == str(Phase.WEIGHTS) == f"{Phase.WEIGHTS}"
    assert len({p.label for p in Phase}) == len(Phase)


def test_eagle3_tp8_fixture_walks_every_phase_in_order() -> None:
    text = (FIXTURES / "vllm-startup-ready.log").read_bytes().decode()
    hits = [h for h in (detect_phase(parse_line(raw)) for raw in text.split("\n")) if h]
    furthest = []
    for hit in hits:
        if not furthest or hit.phase > furthest[-1]:
            furthest.append(hit.phase)
    # a bare launch: no queue (a Slurm job's), no image pulled (a container's)
    assert furthest == [p for p in Phase if p not in (Phase.QUEUED, Phase.PULLING)]
    assert next(h.version for h in hits if h.version) == "0.11.0"
    shards = [h.shards for h in hits if h.shards]
    assert shards == [(10, 30), (30, 30)]
