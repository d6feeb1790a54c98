"""The failures the scenarios replay, made of real Python exceptions.

- syntax-error: a patched copy of the model file with the incident's broken import line is
  written to `$TMPDIR/specconsole-sim-<api pid>/`; each worker really imports it, so the
  traceback (file, line, caret, `SyntaxError: ...`) is Python's own.
- oom: `torch.OutOfMemoryError`-shaped (the class claims module `torch`, so the last traceback
  line reads exactly like PyTorch's).
- engine death: `vllm.v1.engine.exceptions.EngineDeadError`-shaped, likewise.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from tui.sim.timeline import DEVICE_TOTAL, GIB

BROKEN_LINE = ("from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model, "
               "DeepseekV3ForCausalLM,")

_PATCHED_SOURCE = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Inference-only {arch} model: a locally patched copy.

Written by specconsole's simulated engine (syntax-error scenario). The import below lost its
parentheses while being edited, the mistake this scenario replays; Python refuses the file.
"""

from collections.abc import Iterable

import torch
from torch import nn

from vllm.config import VllmConfig
{broken}
    DeepseekV2MLAAttention
from vllm.model_executor.models.utils import maybe_prefix


class {arch}(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.language_model = DeepseekV3ForCausalLM(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "language_model"))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return self.language_model.load_weights(
            (name.removeprefix("language_model."), w) for name, w in weights)
'''


def patched_model_name(arch: str) -> str:
    return "kimi_k25_patched.py" if arch.startswith("KimiK25") else "deepseek_v3_patched.py"


def write_patched_model(arch: str) -> str:
    """Write the broken model file into a fresh temp dir of this process; returns its path."""
    directory = os.path.join(tempfile.gettempdir(), f"specconsole-sim-{os.getpid()}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, patched_model_name(arch))
    with open(path, "w") as f:
        f.write(_PATCHED_SOURCE.format(arch=arch, broken=BROKEN_LINE))
    return path


def remove_patched_model(path: str) -> None:
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def import_model_file(path: str) -> None:
    """Import a model file the way a module import does (so Python trims importlib's frames)."""
    directory, name = os.path.split(path)
    sys.path.insert(0, directory)
    __import__(os.path.splitext(name)[0])


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.OutOfMemoryError."""


OutOfMemoryError.__module__ = "torch"


def cuda_oom(gpu: int, used: int, request_gib: float) -> OutOfMemoryError:
    total = DEVICE_TOTAL / GIB
    in_use = used / GIB
    return OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {request_gib:.2f} GiB. GPU {gpu} has a total "
        f"capacity of {total:.2f} GiB of which {total - in_use:.2f} GiB is free. Including "
        f"non-PyTorch memory, this process has {in_use:.2f} GiB memory in use. Of the allocated "
        f"memory {in_use - 2.2:.2f} GiB is allocated by PyTorch, and 1.64 GiB is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


class EngineDeadError(Exception):
    """Stands in for vllm.v1.engine.exceptions.EngineDeadError."""


EngineDeadError.__module__ = "vllm.v1.engine.exceptions"

ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."
WORKER_INIT_FAILED = ("WorkerProc initialization failed due to an exception in a background "
                      "process. See stack trace for root cause.")

