"""Failure classes: what a root-cause line says went wrong, and the one-line hint for it.

Each class is recognised by the words the engine (or the library under it) really prints, read
from its source; `source` says where, so a reader can tell why a rule exists and when it may
stop matching. The table serves three readers: the root-cause tracker (an ERROR or WARNING
record that states a failure of one of these classes is a cause even without a traceback), the
banner and `explain` (the hint), and the corpus score (the class of a miss).

Order matters: the first class that matches names the line (a CUDA OOM inside an NCCL call is
an OOM; a SyntaxError in a drafter's file is a SyntaxError).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FailureClass:
    """`statement`: an ERROR record whose message matches is itself a cause (vLLM logs some
    causes with logger.error before the traceback that only carries a symptom); `warning`: a
    WARNING record too (vLLM warns that a trust_remote_code module failed to import, then
    fails on it)."""

    id: str
    label: str
    pattern: re.Pattern[str]
    source: str
    hint: str
    statement: bool = True
    warning: bool = False
    raw: bool = False  # a line without a log level (a library's own stderr) says it too
    fatal: bool = False  # ... and that line alone shows the process could not go on


def _c(id: str, label: str, pattern: str, source: str, hint: str, statement: bool = True,
       warning: bool = False, raw: bool = False, fatal: bool = False) -> FailureClass:
    return FailureClass(id, label, re.compile(pattern), source, hint, statement, warning, raw,
                        fatal)


CLASSES: tuple[FailureClass, ...] = (
    _c("image_pull", "the container's image could not be pulled",
       r"^specconsole: cannot pull image \S+: ",
       "specconsole's own monitor (tui/agent/container.py pull_image): 'specconsole: cannot "
       "pull image IMAGE: <the runtime's last line>' when `docker pull` / `podman pull` fails",
       "check the image's name and tag, log in to a private registry (`docker login`), and "
       "that the GPU host reaches the registry; or pull it on the host yourself", raw=True,
       fatal=True),
    _c("container_runtime", "the container runtime failed under the server",
       r"^specconsole: (?:the (?:docker|podman) daemon (?:restarted|does not answer)"
       r"|`podman wait` failed|the container \S+ was removed before"
       r"|the container's monitor failed|cannot start the container: )",
       "specconsole's own monitor (tui/agent/boxmonitor.py): 'specconsole: the docker daemon "
       "restarted; the container died with it (exit code N)' when `docker wait` failed and the "
       "container had ended once the daemon answered again; likewise a container removed under "
       "it, a `run -d` the runtime refused, or the monitor's own error",
       "see the runtime's own log (`journalctl -u docker`, dockerd's log): a daemon restarted "
       "without live-restore stops every container it finds; relaunch once it answers",
       raw=True, fatal=True),
    _c("syntax", "a Python file does not compile",
       r"^(?:[\w.]+\.)?(?:SyntaxError|IndentationError|TabError)\b",
       "Python itself, importing the model file (vLLM: model_executor/models/registry.py "
       "inspects it in a subprocess; the worker imports it again)",
       "fix the file and line named (a patched model file?); preflight's `compile_files` "
       "catches this before a launch"),
    _c("build", "a native extension or kernel did not compile",
       r"^(?:\S*/)?[\w.+-]+\.(?:c|cc|cpp|cxx|cu|cuh|h|hh|hpp|hip|mlir)"
       r"(?::\d+(?::\d+)?|\(\d+\)): (?:fatal )?error: ",
       "the C/C++/CUDA compiler (gcc, clang, nvcc, hipcc) that torch's cpp_extension, "
       "Triton, FlashInfer or DeepGEMM run for a JIT build: 'file.cpp:12:5: error: ...' "
       "(nvcc: 'file.cu(12): error: ...') on stderr, before the builder's generic "
       "'RuntimeError: Error building extension' or CalledProcessError",
       "the first compiler error names the file and line: a toolkit that does not match torch's "
       "CUDA (nvcc --version), a missing header (install the -dev package), or a kernel built "
       "for another architecture (TORCH_CUDA_ARCH_LIST)", raw=True, fatal=True),
    _c("oom", "out of device memory",
       r"out of memory|OutOfMemoryError|\bOOM\b|memory allocation failed|NPU out of memory",
       "torch's allocator (torch.OutOfMemoryError 'CUDA out of memory. Tried to allocate'); "
       "vLLM <= 0.11 model_executor/layers/linear.py UnquantizedLinearMethod.create_weights "
       "logger.error('Failed to create unquantized linear weights: %s', e)",
       "lower --gpu-memory-utilization or --max-model-len (SGLang: --mem-fraction-static), "
       "or spread the model over more GPUs; check nothing else holds GPU memory", raw=True),
    _c("kv_cache", "not enough memory for the KV cache",
       r"No available memory for the cache blocks|KV cache is needed|max seq len"
       r"|Free memory on device .* less than desired GPU memory utilization"
       r"|Not enough memory\. Please try to increase --mem-fraction-static"
       r"|max_total_num_tokens=-\d|insufficient .*KV cache",
       "vLLM v1/core/kv_cache_utils.py check_enough_kv_cache_memory (raise ValueError 'To "
       "serve at least one request with the models's max seq len', 'No available memory for "
       "the cache blocks'); v1/worker/gpu_worker.py Worker.init_device (newer: "
       "v1/worker/utils.py request_memory) raise ValueError 'Free memory on device'; SGLang "
       "model_executor/model_runner.py init_memory_pool (newer: model_runner_kv_cache_mixin.py)"
       " raise RuntimeError 'Not enough memory. Please try to increase --mem-fraction-static'",
       "raise --gpu-memory-utilization or lower --max-model-len / --max-num-seqs "
       "(SGLang: --mem-fraction-static, --context-length)", raw=True),
    _c("port", "the server's port is taken",
       r"[Aa]ddress already in use|\[Errno 98\]|error while attempting to bind",
       "uvicorn/server.py Server.startup logger.error(exc) of asyncio's OSError 'error while "
       "attempting to bind on address %r: %s'; vLLM's create_server_socket sock.bind",
       "another program holds the port: `ss -ltnp 'sport = :PORT'` names it; stop it or "
       "change server.port (preflight's port_free check says who)", raw=True),
    _c("disk", "no space left on a disk",
       r"No space left on device|Disk quota exceeded|\[Errno 28\]",
       "the OS (errno ENOSPC), e.g. while huggingface_hub downloads the weights",
       "free space where the weights and caches go (HF_HOME, --download-dir) and under "
       "host.runs_dir", raw=True),
    _c("nccl", "NCCL / torch.distributed failed",
       r"NCCL error|NCCL WARN|ncclCommInitRank|nccl\w*Error|ncclInternalError"
       r"|DistBackendError|ProcessGroupNCCL|Gloo connectFullMesh|Connection reset by peer.*gloo",
       "vLLM and SGLang distributed/device_communicators/pynccl_wrapper.py "
       "NCCLLibrary.NCCL_CHECK raise RuntimeError(f'NCCL error: {error_str}'); NCCL's own "
       "'NCCL WARN' stderr; torch ProcessGroupNCCL",
       "rerun with NCCL_DEBUG=INFO to see which link fails; check that every GPU sees its "
       "peers (NCCL_P2P_DISABLE=1 to test) and the network interface (NCCL_SOCKET_IFNAME)",
       raw=True),
    _c("native_crash", "the process crashed in native code",
       r"Fatal Python error: (?:Segmentation fault|Bus error|Aborted|Floating point exception"
       r"|Illegal instruction)"
       # a library's own signal handler that says what the fault was: UCX/UCC ('[host:pid:0:
       # tid] Caught signal 11 (Segmentation fault: address not mapped ...)' then '====
       # backtrace ===='). (absl's '*** SIGSEGV received at time=...', Ray's core worker, says
       # less than faulthandler's line after it: not read as one.)
       r"|\bCaught signal \d+ \("
       # glibc's own aborts: heap corruption, the stack protector
       r"|\*\*\* (?:stack smashing|buffer overflow) detected \*\*\*|double free or corruption"
       r"|^(?:free|malloc|realloc|munmap_chunk|malloc_consolidate)\(\): \S"
       r"|^corrupted (?:size vs\. prev_size|double-linked list)",
       "CPython's faulthandler (enabled by vLLM and SGLang workers, and by PYTHONFAULTHANDLER): "
       "'Fatal Python error: <signal>' then each thread's frames, most recent call first; "
       "UCX's and NCCL's signal handlers ('Caught signal 11 (Segmentation fault: ...)'); glibc "
       "('*** stack smashing detected ***: terminated', 'double free or corruption (out)', "
       "'malloc(): ...') before it aborts the process",
       "a C/C++/CUDA extension crashed (the frames below name the Python call that entered "
       "it): a Bus error often means an unreadable memory-mapped file (a checkpoint on a "
       "failing network disk) or a /dev/shm too small for NCCL (docker: --ipc=host or "
       "--shm-size); a Segmentation fault, a kernel or library built for another CUDA/torch",
       raw=True, fatal=True),
    _c("killed", "the process was killed (SIGKILL)",
       r"^Killed$|: line \d+: +\d+ Killed\b",
       "the shell (bash, dash) reporting a foreground job ended by SIGKILL: 'Killed', or "
       "'script: line N: PID Killed  command' from a script",
       "mostly the kernel's OOM killer when host RAM runs out (loading a checkpoint, many "
       "workers, a big CPU swap space): `dmesg | grep -i oom`; lower --swap-space, load fewer "
       "shards at once, or add host memory", raw=True, fatal=True),
    _c("device_assert", "a GPU kernel's assertion failed",
       r"\.(?:cu|cuh|hip):\d+: .*Assertion|device-side assert"
       r"|block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion",
       "a kernel's device-side assert(): the CUDA runtime prints 'file.cu:N: function: block: "
       "[..], thread: [..] Assertion `...` failed.' on stderr (torch's ATen kernels: an index "
       "out of bounds, a probability tensor with inf/nan), then torch raises 'RuntimeError: "
       "CUDA error: device-side assert triggered'; the CUDA context is lost with it",
       "a kernel got bad input (an index out of range, NaN logits): rerun with "
       "CUDA_LAUNCH_BLOCKING=1 to name the op; check the model's config (vocab size, rope) "
       "and, while serving, the request that triggered it", raw=True, fatal=True),
    _c("cuda_env", "the GPU runtime failed",
       r"CUDA error|CUDA driver|no kernel image is available|no CUDA-capable device"
       r"|Failed to infer device type|cudaError\w+|CUDA initialization|CUBLAS_STATUS"
       r"|illegal memory access|HIP error|ACL stream|aclnn\w+ failed"
       r"|[Dd]river version is insufficient",
       "torch / the CUDA runtime (RuntimeError: CUDA error: ...), vLLM platforms/ "
       "(RuntimeError: Failed to infer device type), Ascend's ACL",
       "check nvidia-smi (or rocm-smi / npu-smi), the driver against torch's CUDA, "
       "CUDA_VISIBLE_DEVICES, and rerun with CUDA_LAUNCH_BLOCKING=1 for an illegal access",
       raw=True),
    _c("quant", "the quantisation is not supported here",
       r"quantization method .* not supported|not supported for the current GPU"
       r"|[Mm]inimum capability|is not divisible by min_thread_k|Marlin|marlin",
       "vLLM config/vllm.py VllmConfig._get_quantization_config raise ValueError 'The "
       "quantization method %s is not supported for the current GPU. Minimum capability: %d'",
       "this GPU cannot run that quantisation: pick a checkpoint quantised for it, or run "
       "unquantised"),
    _c("cli_args", "the command line was refused",
       r"\S: error: (?:argument |unrecognized arguments|the following arguments are required"
       r"|one of the arguments|ambiguous option)",
       "Python's argparse ArgumentParser.error: '%(prog)s: error: %(message)s' on stderr, "
       "then exit 2 (`vllm serve`, `python -m sglang.launch_server`), before any engine starts",
       "fix the argument named in the profile's [server] args (`vllm serve --help` lists them)",
       raw=True, fatal=True),
    _c("config", "the engine refused the configuration",
       r"ValidationError|validation error for|must be divisible by|is not divisible by"
       r"|is greater than the derived max_model_len|exceeds the total number of available GPUs"
       r"|unrecognized arguments|invalid choice|not supported|is not a valid|must be (?:a|an|at)",
       "vLLM config/model.py (pydantic ValidationError 'Value error, ...'; "
       "verify_with_parallel_config 'must be divisible by tensor parallel size'; "
       "_get_and_verify_max_len 'is greater than the derived max_model_len'), "
       "distributed/utils.py ensure_divisibility '{} is not divisible by {}'",
       "the reason is in the message: fix the argument it names in the profile's [server] "
       "args or speculative table"),
    _c("import", "a module could not be imported",
       r"ImportError|ModuleNotFoundError|cannot import name|Unable to load .* on HF Hub"
       r"|undefined symbol",
       "Python's import; vLLM transformers_utils/dynamic_module.py "
       "try_get_class_from_dynamic_module logger.warning('Unable to load %s from %s on %s.', "
       "..., exc_info=True) for a trust_remote_code model file",
       "the environment lacks what the model code imports: align transformers (or the "
       "package named) with the model's code, or fix the model file", warning=True),
    _c("weights", "the checkpoint does not fit the model",
       r"KeyError: '[\w.]+'|size mismatch|shape mismatch|safetensors|[Cc]heckpoint"
       r"|weight[\w.]* (?:not found|missing)|Missing key",
       "vLLM model_executor/models/*.py load_weights (KeyError on a parameter name), "
       "model_loader/weight_utils.py",
       "the weights do not match the architecture vLLM built: check the model path, its "
       "config.json, and the quantisation named", statement=False),
    _c("ray", "a Ray actor or the Ray cluster failed",
       r"ray\.exceptions\.|ActorDiedError|RayActorError|RaySystemError|placement group",
       "Ray (ray.exceptions.*) under vLLM's executor/ray_distributed_executor.py",
       "look at the dead actor's own log (`ray logs`, /tmp/ray/session_latest/logs) and at "
       "the node's memory (the OOM killer ends Ray workers)"),
    # the raylet's notice (a line of its own on the driver, `(raylet) …`): which worker, how it
    # exited; what killed it is the worker's own last lines, when the log has them
    _c("ray_worker", "a Ray worker process died",
       r"A worker died or was killed while executing|Worker exit type: [A-Z_]+",
       "Ray's raylet (src/ray/raylet/node_manager.cc), relayed to the driver by its log "
       "monitor as `(raylet) A worker died or was killed while executing a task by an "
       "unexpected system error. … Worker exit type: SYSTEM_ERROR …`",
       "look at the dead worker's own last lines (its traceback, relayed as `(RayWorkerWrapper "
       "pid=N, ip=A)`, or `ray logs` on its node) and at the node's memory (dmesg: the OOM "
       "killer ends Ray workers)", raw=True),
)

# A hang is said by a line of its own, not by an exception: `hung`, naming the marker.
HANG_MARKERS: tuple[FailureClass, ...] = (
    _c("shm_broadcast", "a process stopped answering the engine's broadcast",
       r"No available (?:shared memory broadcast )?block found in",
       "vLLM distributed/device_communicators/shm_broadcast.py MessageQueue.acquire_write / "
       "acquire_read logger.info(long_wait_time_msg(...)) 'No available shared memory "
       "broadcast block found in %s seconds', every 60 s (<= 0.5: logger.warning('No "
       "available block found in %s second. '))",
       "a worker is stuck (a collective waiting for a peer, a long compile): dump the "
       "stacks (key d, `specconsole stacks`), and look for the process that is not waiting"),
    _c("nccl_watchdog", "an NCCL collective timed out",
       r"Watchdog caught collective operation timeout"
       # the watchdog ends on the error it caught: a hang only when that error is a timeout
       # (a CUDA error or an ECC fault it reports is a crash, its what() line the cause)
       r"|watchdog thread terminated with exception:.*(?:[Tt]imeout|timed out|ran for)"
       r"|ProcessGroupNCCL's watchdog got stuck|Timeout\(ms\)=\d+\) ran for",
       "torch csrc/distributed/c10d/ProcessGroupNCCL.cpp, the watchdog's LOG(ERROR) "
       "'Watchdog caught collective operation timeout: ... ran for N milliseconds'",
       "a rank never reached the collective: look for the rank that died or is stuck; "
       "NCCL_DEBUG=INFO, and TORCH_NCCL_TRACE_BUFFER_SIZE for a flight record"),
    _c("sglang_watchdog", "SGLang's scheduler watchdog fired",
       r"(?:Scheduler )?[Ww]atchdog timeout",
       "SGLang utils/watchdog.py WatchdogRaw._watchdog_once logger.error(f'{debug_name} "
       "watchdog timeout (...)') (older: managers/scheduler.py Scheduler.watchdog_thread "
       "'Watchdog timeout (...)')",
       "a forward pass did not finish within --watchdog-timeout: look at the stacks of the "
       "scheduler processes"),
    _c("ray_placement", "Ray cannot place the workers (not enough GPUs in the cluster)",
       r"Waiting for creating a placement group of specs for \d+ seconds",
       "vLLM executor/ray_utils.py _wait_until_pg_ready logger.info('Waiting for creating a "
       "placement group of specs for %d seconds. specs=%s. Check `ray status` ...'), after "
       "10 s and then at doubling intervals until PG_WAIT_TIMEOUT (1800 s) raises ValueError",
       "the Ray cluster lacks the GPUs the specs ask for: `ray status` shows what joined; "
       "start the missing nodes, set RAY_ADDRESS so vLLM joins the cluster instead of "
       "starting its own, and make VLLM_HOST_IP match the IP Ray registered each node under",
       statement=False),
    _c("engine_wait", "the engine processes never came up",
       r"Waiting for \d+ (?:local, \d+ remote )?core engine proc\(s\) to start",
       "vLLM v1/engine/utils.py wait_for_engine_startup logger.debug('Waiting for %d local, "
       "%d remote core engine proc(s) to start.'), each poll while it waits",
       "the engine core is stuck before its handshake: its own lines say where; a "
       "multi-node run waits for every node to join", statement=False),
)
# A marker that repeats: only its Nth repetition without progress in between is a hang.
REPEATS_TO_HANG = {"engine_wait": 6}

_BY_ID = {c.id: c for c in (*CLASSES, *HANG_MARKERS)}


# A cause says what it is early: the rest of a long line (a 10 MB line is possible, and a
# regex alternation over it costs seconds) is not read.
_READ = 2048
# Where a message stops stating and starts guessing: a list of what might have caused it
# (Ray's "Some common causes include: (1) … the OOM killer …", a library's "this may be due
# to …") names no class of this failure.
_HEDGE_RE = re.compile(
    r"(?i)\b(?:(?:some|the most) )?(?:common|possible|potential|likely|typical) "
    r"(?:causes?|reasons?)\b|\b(?:this|it|which) (?:may|might|could|can) (?:be|have been) "
    r"(?:caused by|due to|because)\b")


def _stated(text: str) -> str:
    """What `text` states: its first _READ characters, up to a hedge."""
    text = text[:_READ]
    hedge = _HEDGE_RE.search(text)
    return text[:hedge.start()] if hedge is not None else text


def classify(text: str) -> FailureClass | None:
    """The first class whose words are in `text` (a root-cause line), or None."""
    text = _stated(text)
    return next((c for c in CLASSES if c.pattern.search(text)), None)


def fatal_statement(message: str) -> bool:
    """A line without a log level that shows by itself its process could not go on (argparse's
    usage error, a kernel's failed assertion): evidence of a crash, not only a cause."""
    kind = classify(message)
    return kind is not None and kind.fatal


def states_cause(message: str, level: str | None) -> bool:
    """An ERROR record (a WARNING or a line without level, for some classes) whose words
    name a failure class: a cause in itself."""
    message = _stated(message)
    if level == "WARNING":
        return any(c.warning and c.pattern.search(message) for c in CLASSES)
    if level is None:
        if "NCCL INFO" in message:  # NCCL's own INFO level: a report, never a failure
            return False
        return any(c.raw and c.pattern.search(message) for c in CLASSES)
    return any(c.statement and c.pattern.search(message) for c in CLASSES)


def hang_marker(message: str) -> FailureClass | None:
    message = message[:_READ]
    return next((m for m in HANG_MARKERS if m.pattern.search(message)), None)


def by_id(class_id: str) -> FailureClass:
    return _BY_ID[class_id]


_LOCATION_RE = re.compile(r"\((\S[^()]*), line (\d+)\)$")
_PORT_RE = re.compile(r"(?:address \(?'[^']*', |port |:)(\d{2,5})\b")


def hint_for(kind: FailureClass, line: str) -> str:
    """The class's hint, made concrete from the cause line where it names the place: the file
    and line of a SyntaxError, the port that is taken."""
    if kind.id == "syntax" and (m := _LOCATION_RE.search(line)) is not None:
        return f"fix {m.group(1)}, line {m.group(2)} (a patched model file?); preflight's " \
               "`compile_files` catches this before a launch"
    if kind.id == "port" and (m := _PORT_RE.search(line)) is not None:
        port = m.group(1)
        return f"another program holds port {port}: `ss -ltnp 'sport = :{port}'` names it; " \
               "stop it or change server.port (preflight's port_free check says who)"
    return kind.hint


# A process's exit status as launchers and shells print it: `exited with code -9`, `exit code
# 137`, `exitcode=-7`, `returned non-zero exit status 135`. Negative: Python's subprocess and
# multiprocessing (-N is signal N); 129-159: a shell or a container runtime (128+N).
_EXIT_STATUS_RE = re.compile(
    r"\b(?:exit(?:ed)?(?: with)?(?: code| status)|exit ?code|exit status|exitcode)[ :=]*"
    r"(-?\d{1,3})\b", re.IGNORECASE)
_SIGNAL_WORDS = {
    signal.SIGKILL: "killed from outside (the OOM killer, a user, a scheduler: see dmesg)",
    signal.SIGBUS: "a bus error (an unreadable memory-mapped file such as a checkpoint on a "
                   "failing disk, or a /dev/shm too small for NCCL)",
    signal.SIGSEGV: "a segmentation fault in native code",
    signal.SIGABRT: "aborted (a C++ exception or a failed assertion in native code)",
    signal.SIGTERM: "asked to stop (SIGTERM)",
    signal.SIGINT: "interrupted (Ctrl-C)",
}


def signal_of(code: int) -> signal.Signals | None:
    """The signal an exit status means: -N (Python's subprocess and multiprocessing) or 128+N
    (a shell, a container runtime); None for a plain exit."""
    number = -code if code < 0 else code - 128 if 128 < code < 160 else 0
    try:
        return signal.Signals(number)
    except ValueError:
        return None


def signal_words(sig: signal.Signals) -> str:
    """`SIGKILL, killed from outside (...)`: the signal and who could have sent it."""
    words = _SIGNAL_WORDS.get(sig)
    return sig.name + (f", {words}" if words else "")


def exit_signal(text: str) -> str | None:
    """An exit status in `text` that means a signal, in words: `exit code 135 = 128+7: SIGBUS,
    a bus error (...)`, `exit code -9: SIGKILL, ...`; None when there is none (or a plain
    failure, such as exit code 1)."""
    for m in _EXIT_STATUS_RE.finditer(text[:_READ]):
        code = int(m.group(1))
        sig = signal_of(code)
        if sig is None:
            continue
        how = "" if code < 0 else f" = 128+{sig.value}"
        return f"exit code {code}{how}: {signal_words(sig)}"
    return None
