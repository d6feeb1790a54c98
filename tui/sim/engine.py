"""The simulated engines' one entry point (simulation only: `specconsole demo` and the tests).

    python -m tui.sim.engine serve MODEL ...                   the simulated `vllm serve`
    python -m tui.sim.engine --sim-engine sglang --model-path M ...   simulated SGLang

`--sim-engine vllm|sglang` (anywhere in argv; vllm by default) picks the server to play:
`api_server.py` (vLLM's API server, engine core and workers) or `sglang/launcher.py`. Neither
imports the other; what they share lives in `scenarios.py`.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    engine, rest = _engine(sys.argv[1:] if argv is None else argv)
    if engine == "sglang":
        from tui.sim.sglang import launcher

        return launcher.main(rest)
    from tui.sim import api_server

    return api_server.main(rest)


def _engine(argv: list[str]) -> tuple[str, list[str]]:
    """`--sim-engine vllm|sglang`: the server this plays, and the rest of argv."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--sim-engine", choices=("vllm", "sglang"), default="vllm")
    known, rest = pre.parse_known_args(argv)
    return known.sim_engine, rest


if __name__ == "__main__":
    sys.exit(main())
