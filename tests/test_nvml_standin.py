"""The NVML C library stand-in (tui/sim/nvml): the REAL nvidia-ml-py binding loads it, reads the
simulated GPUs' state through it, and tui.agent.nvml.Gpus survives its faults (a function an
old driver lacks, a GPU off the bus, a driver/library mismatch, no library at all).

Each probe runs in its own process: the binding loads `libnvidia-ml.so.1` by soname once per
process, from LD_LIBRARY_PATH, and PYTHONPATH never holds tui/sim/fakenvml.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

from tui.agent.nvml import NO_LIBRARY
from tui.sim import FAKENVML_DIR, gpu_state
from tui.sim.nvml import build as nvml_build
from tui.sim.timeline import DEVICE_NAME, DEVICE_TOTAL

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30

PYNVML_PROBE = """
import json, sys
import pynvml as n

def err(exc):
    return type(exc).__name__

def device(i):
    try:
        h = n.nvmlDeviceGetHandleByIndex(i)
    except n.NVMLError as exc:
        return {"handle": err(exc)}
    out = {}
    for key, call in (
            ("name", lambda: n.nvmlDeviceGetName(h)),
            ("uuid", lambda: n.nvmlDeviceGetUUID(h)),
            ("mem", lambda: (lambda m: [m.total, m.free, m.used])(n.nvmlDeviceGetMemoryInfo(h))),
            ("mem_v2", lambda: (lambda m: [m.version, m.total, m.reserved, m.free, m.used])(
                n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2))),
            ("util", lambda: (lambda u: [u.gpu, u.memory])(n.nvmlDeviceGetUtilizationRates(h))),
            ("procs", lambda: [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                               for p in n.nvmlDeviceGetComputeRunningProcesses(h)]),
            ("procs_v2", lambda: [[p.pid, p.usedGpuMemory]
                                  for p in n.nvmlDeviceGetComputeRunningProcesses_v2(h)]),
            ("graphics", lambda: list(n.nvmlDeviceGetGraphicsRunningProcesses(h)))):
        try:
            out[key] = call()
        except Exception as exc:
            out[key] = err(exc)
    return out

try:
    n.nvmlInit()
except n.NVMLError as exc:
    print(json.dumps({"init": err(exc), "text": str(exc)}), flush=True)
    sys.exit(0)
for line in sys.stdin:
    count = n.nvmlDeviceGetCount()
    print(json.dumps({"init": "ok", "file": n.__file__, "count": count,
                      "driver": n.nvmlSystemGetDriverVersion(),
                      "devices": [device(i) for i in range(count)]}), flush=True)
"""

GPUS_PROBE = """
import json, sys
from tui.agent.nvml import Gpus

g = Gpus()
for line in sys.stdin:
    if line.strip() == "init":
        g.init()
    print(json.dumps({"ok": g.ok, "error": g.error, "version": g.version,
                      "pynvml": getattr(g.nv, "__file__", None), "names": g.names,
                      "sample": g.sample(), "holders": g.all_holders()}), flush=True)
"""


class Probe:
    """A Python child running `script` against the stand-in; each ask() is one JSON line."""

    def __init__(self, script: str, state: Path, lib: Path | None, **env: str) -> None:
        base = {k: v for k, v in os.environ.items()
                if k not in ("PYTHONPATH", "LD_LIBRARY_PATH", "SPECCONSOLE_SIM_GPUS",
                             "SPECCONSOLE_SIM_NVML_FAULT")}
        base |= {"PYTHONPATH": str(ROOT), gpu_state.STATE_ENV: str(state), **env}
        if lib is not None:
            base["LD_LIBRARY_PATH"] = str(lib)
        assert FAKENVML_DIR not in base["PYTHONPATH"]
        self.proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=base, cwd=state.parent)

    def ask(self, command: str = "sample") -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.poll() is None:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the probe died: {self.stderr()}")
        return json.loads(line)

    def stderr(self) -> str:
        self.close()
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private build cache: the tests prove the cache without touching ~/.cache."""
    root = tmp_path_factory.mktemp("xdg-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root))
        yield root


def _build(omit: tuple[str, ...] = ()) -> Path:
    try:
        return nvml_build.build(omit=omit)
    except nvml_build.BuildError as exc:  # no compiler is a broken test host, not a skip
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def lib(cache: Path) -> Path:
    return _build()


@pytest.fixture
def probes() -> Iterator[list[Probe]]:
    started: list[Probe] = []
    yield started
    for probe in started:
        probe.close()


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    """Real processes holding simulated GPU memory; killed (and reaped) after the test."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def hold(holders: list[subprocess.Popen], state: Path, gpu: int, used: int,
         util: int) -> subprocess.Popen:
    """A child process that records itself as a holder through tui.sim.gpu_state, then sleeps."""
    code = ("import sys, time\nfrom tui.sim import gpu_state\n"
            f"gpu_state.write_holder({str(state)!r}, {gpu}, {used}, {util})\n"
            "print('held', flush=True)\ntime.sleep(120)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)
    holders.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def machine(tmp_path: Path, count: int = 3) -> Path:
    state = tmp_path / "gpus"
    assert gpu_state.ensure_devices(str(state), count) == count
    return state


def start(probes: list[Probe], script: str, state: Path, lib: Path | None,
          **env: str) -> Probe:
    probe = Probe(script, state, lib, **env)
    probes.append(probe)
    return probe


# ---- the build ----


def test_build_is_cached_by_source_and_omitted_symbols(cache: Path, lib: Path) -> None:
    again = nvml_build.build()
    assert again == lib and lib.parent == cache / "specconsole" / "nvml"
    library = lib / nvml_build.LIBRARY
    before = library.stat().st_mtime_ns
    assert nvml_build.build() == lib and library.stat().st_mtime_ns == before  # reused
    older = _build(("nvmlDeviceGetUtilizationRates",))
    assert older != lib and (older / nvml_build.LIBRARY).is_file()
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in nvml_build.symbols()
    with pytest.raises(nvml_build.BuildError, match="cannot omit nvmlNoSuchThing"):
        nvml_build.build(omit=["nvmlNoSuchThing"])


def test_build_without_a_compiler_says_what_to_install(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(nvml_build.BuildError, match="apt-get install gcc") as info:
        nvml_build.build(tmp_path / "out")
    assert "\n" not in str(info.value)


def test_build_command_prints_the_directory(cache: Path, lib: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert nvml_build.main([]) == 0
    assert capsys.readouterr().out.strip() == str(lib)
    assert nvml_build.main(["--omit", "nvmlBogus"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot omit nvmlBogus") and err.count("\n") == 1


# ---- the real binding against the stand-in ----


def test_real_pynvml_reads_the_simulated_gpus(tmp_path: Path, lib: Path, probes: list[Probe],
                                              holders: list[subprocess.Popen]) -> None:
    state = machine(tmp_path)
    a = hold(holders, state, gpu=1, used=5 * GIB, util=40)
    b = hold(holders, state, gpu=1, used=GIB, util=70)
    c = hold(holders, state, gpu=2, used=3 * GIB, util=10)
    probe = start(probes, PYNVML_PROBE, state, lib)
    seen = probe.ask()
    assert seen["init"] == "ok" and "site-packages" in seen["file"]  # nvidia-ml-py itself
    assert seen["count"] == 3 and seen["driver"] == "550.54.15"
    d0, d1, d2 = seen["devices"]
    assert d0 == {"name": DEVICE_NAME, "uuid": d0["uuid"], "mem": [DEVICE_TOTAL, DEVICE_TOTAL, 0],
                  "mem_v2": [0x02000028, DEVICE_TOTAL, 0, DEVICE_TOTAL, 0], "util": [0, 0],
                  "procs": [], "procs_v2": [], "graphics": []}
    assert len({d["uuid"] for d in seen["devices"]}) == 3 and d0["uuid"].startswith("GPU-")
    assert d1["mem"] == [DEVICE_TOTAL, DEVICE_TOTAL - 6 * GIB, 6 * GIB]
    assert d1["util"] == [70, 35]  # the busiest holder's
    none = 0xFFFFFFFF
    assert d1["procs"] == sorted([[a.pid, 5 * GIB, none, none], [b.pid, GIB, none, none]])
    assert d1["procs_v2"] == sorted([[a.pid, 5 * GIB], [b.pid, GIB]])
    assert d2["procs"] == [[c.pid, 3 * GIB, none, none]] and d2["util"] == [10, 5]

    os.kill(b.pid, signal.SIGKILL)  # not reaped yet: a zombie's memory is freed all the same
    after = wait_for(lambda: (s := probe.ask())["devices"][1]["procs"] != d1["procs"] and s,
                     what="the dead holder to disappear")
    assert after["devices"][1]["procs"] == [[a.pid, 5 * GIB, none, none]]
    assert after["devices"][1]["mem"][2] == 5 * GIB and after["devices"][1]["util"] == [40, 20]
    assert not (state / f"holder-{b.pid}.json").exists()  # the reader deletes a dead holder's
    assert after["devices"][2] == d2


def test_real_pynvml_faults(tmp_path: Path, lib: Path, probes: list[Probe]) -> None:
    state = machine(tmp_path, 2)
    older = _build(("nvmlDeviceGetUtilizationRates",))
    d0, d1 = start(probes, PYNVML_PROBE, state, older).ask()["devices"]
    assert d0["util"] == "NVMLError_FunctionNotFound" and d0["mem"][0] == DEVICE_TOTAL

    probe = start(probes, PYNVML_PROBE, state, lib)
    assert probe.ask()["devices"][1]["util"] == [0, 0]
    (state / "lost-1").touch()
    d0, d1 = probe.ask()["devices"]
    assert set(d1.values()) == {"NVMLError_GpuIsLost"} and d0["util"] == [0, 0]
    assert start(probes, PYNVML_PROBE, state, lib).ask()["devices"][1] == {
        "handle": "NVMLError_GpuIsLost"}
    (state / "lost-1").unlink()
    assert set(probe.ask()["devices"][1].values()) == {"NVMLError_GpuIsLost"}  # for good

    mismatch = start(probes, PYNVML_PROBE, state, lib,
                     SPECCONSOLE_SIM_NVML_FAULT="version_mismatch").ask()
    assert mismatch["init"] == "NVMLError_LibRmVersionMismatch"
    assert start(probes, PYNVML_PROBE, tmp_path / "nothing", lib).ask()["init"] == (
        "NVMLError_DriverNotLoaded")  # no devices.json: as the Python fake


# ---- tui.agent.nvml.Gpus on the real binding ----


def test_gpus_samples_the_simulated_gpus(tmp_path: Path, lib: Path, probes: list[Probe],
                                         holders: list[subprocess.Popen]) -> None:
    state = machine(tmp_path)
    a = hold(holders, state, gpu=1, used=5 * GIB, util=40)
    seen = start(probes, GPUS_PROBE, state, lib).ask()
    assert seen["ok"] is True and seen["error"] is None
    assert seen["version"] == version("nvidia-ml-py") and "site-packages" in seen["pynvml"]
    idle = {"name": DEVICE_NAME, "mem_used": 0, "mem_total": DEVICE_TOTAL, "util": 0,
            "procs": []}
    assert seen["sample"] == [
        {"index": 0, **idle},
        {"index": 1, **idle, "mem_used": 5 * GIB, "util": 40,
         "procs": [{"pid": a.pid, "mem": 5 * GIB}]},
        {"index": 2, **idle}]
    assert seen["holders"] == [{"pid": a.pid, "mem": 5 * GIB, "gpu": 1}]


def test_gpus_retries_init_until_the_gpus_appear(tmp_path: Path, lib: Path,
                                                 probes: list[Probe]) -> None:
    state = tmp_path / "gpus"
    probe = start(probes, GPUS_PROBE, state, lib)
    seen = probe.ask()
    assert seen["ok"] is False and seen["error"] == "NVML unavailable: Driver Not Loaded"
    gpu_state.ensure_devices(str(state), 2)
    seen = probe.ask("init")
    assert seen["ok"] is True and seen["names"] == [DEVICE_NAME, DEVICE_NAME]


@pytest.mark.parametrize(("omit", "expect"), [
    (("nvmlDeviceGetUtilizationRates",), {"util": None}),
    (("nvmlDeviceGetMemoryInfo",), {"mem_used": None, "mem_total": None}),
    # an older driver: the _v3 process list is missing, its _v2 still answers
    (("nvmlDeviceGetComputeRunningProcesses_v3",), {}),
    (("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
     {"procs": []}),
    (("nvmlDeviceGetName",), {"name": None}),
])
def test_gpus_missing_function_is_a_none_field(tmp_path: Path, cache: Path, probes: list[Probe],
                                               holders: list[subprocess.Popen],
                                               omit: tuple[str, ...],
                                               expect: dict[str, Any]) -> None:
    state = machine(tmp_path, 2)
    a = hold(holders, state, gpu=0, used=2 * GIB, util=30)
    seen = start(probes, GPUS_PROBE, state, _build(omit)).ask()
    assert seen["ok"] is True
    full = {"index": 0, "name": DEVICE_NAME, "mem_used": 2 * GIB, "mem_total": DEVICE_TOTAL,
            "util": 30, "procs": [{"pid": a.pid, "mem": 2 * GIB}]}
    assert seen["sample"][0] == full | expect
    assert seen["sample"][1]["index"] == 1 and "lost" not in seen["sample"][1]


def test_gpus_lost_mid_run_only_that_device(tmp_path: Path, lib: Path, probes: list[Probe],
                                            holders: list[subprocess.Popen]) -> None:
    state = machine(tmp_path)
    a = hold(holders, state, gpu=0, used=GIB, util=20)
    b = hold(holders, state, gpu=1, used=4 * GIB, util=90)
    probe = start(probes, GPUS_PROBE, state, lib)
    before = probe.ask()
    assert before["sample"][1]["procs"] == [{"pid": b.pid, "mem": 4 * GIB}]
    (state / "lost-1").touch()  # GPU 1 falls off the bus
    after = probe.ask()
    assert after["ok"] is True
    assert after["sample"][1] == {"index": 1, "name": DEVICE_NAME, "mem_used": None,
                                  "mem_total": None, "util": None, "procs": [], "lost": True}
    assert after["sample"][0] == before["sample"][0] and after["sample"][2] == before["sample"][2]
    assert after["holders"] == [{"pid": a.pid, "mem": GIB, "gpu": 0}]
    (state / "lost-1").unlink()
    assert probe.ask()["sample"][1]["lost"] is True  # a lost GPU stays lost until a reset


def test_gpus_lost_before_init(tmp_path: Path, lib: Path, probes: list[Probe]) -> None:
    state = machine(tmp_path, 2)
    (state / "lost-0").touch()
    seen = start(probes, GPUS_PROBE, state, lib).ask()
    assert seen["ok"] is True and seen["names"] == [None, DEVICE_NAME]
    assert seen["sample"][0] == {"index": 0, "name": None, "mem_used": None, "mem_total": None,
                                 "util": None, "procs": [], "lost": True}
    assert seen["sample"][1]["mem_total"] == DEVICE_TOTAL and "lost" not in seen["sample"][1]


def test_gpus_version_mismatch_says_so(tmp_path: Path, lib: Path, probes: list[Probe]) -> None:
    seen = start(probes, GPUS_PROBE, machine(tmp_path), lib,
                 SPECCONSOLE_SIM_NVML_FAULT="version_mismatch").ask()
    assert seen["ok"] is False and seen["sample"] == [] and seen["holders"] == []
    assert seen["error"].startswith("NVML driver/library version mismatch")


def test_gpus_without_the_library_says_so(tmp_path: Path, probes: list[Probe]) -> None:
    state = machine(tmp_path)
    real = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libnvidia-ml.so.1')"],
                          env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"},
                          capture_output=True, check=False)
    if real.returncode == 0:
        pytest.skip("this host has a real libnvidia-ml.so.1 on the loader's default path")
    seen = start(probes, GPUS_PROBE, state, None).ask()
    assert seen["ok"] is False and seen["error"] == NO_LIBRARY
    assert "libnvidia-ml.so.1 not found" in seen["error"] and seen["sample"] == []
