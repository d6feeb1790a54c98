"""Simulated SGLang (simulation only): `python -m tui.sim.engine --sim-engine sglang ...`.

The launcher (`launcher.py`, the `python -m sglang.launch_server` process: HTTP, warmup) spawns
one `sglang::scheduler_TP<r>` per rank (`scheduler.py`: a fake GPU each, the model load) and
`sglang::detokenizer` (`detokenizer.py`). Lines follow vllm-reference.md, section 5. Stdlib only,
like the rest of tui.sim.
"""
