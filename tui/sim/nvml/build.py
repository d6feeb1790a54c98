"""Build the NVML stand-in (`libnvidia_ml.c`) into a directory to put on LD_LIBRARY_PATH.

The directory is what a simulated profile's `[simulate] nvml` names: the agent then loads the
REAL nvidia-ml-py, which finds this `libnvidia-ml.so.1` instead of a driver's. Builds are cached
by the source's hash and the omitted symbols, so tests and the demo compile once per change.

    python -m tui.sim.nvml.build [--omit SYMBOL ...] [--out DIR]    prints the directory

Stdlib only: the host's C compiler ($CC, else `cc`, else `gcc`) and nothing else.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("libnvidia_ml.c")
LIBRARY = "libnvidia-ml.so.1"
FLAGS = ("-shared", "-fPIC", "-O2", "-pthread", "-fvisibility=hidden",
         f"-Wl,-soname,{LIBRARY}")
NO_COMPILER = ("no C compiler (cc or gcc) to build the NVML stand-in libnvidia-ml.so.1: "
               "apt-get install gcc")


class BuildError(RuntimeError):
    """The library could not be built; the message is one line meant for a person."""


def symbols(source: Path = SOURCE) -> list[str]:
    """The NVML functions the stand-in exports, each of which `omit` may leave out."""
    return re.findall(r"^#ifndef OMIT_(\w+)$", source.read_text(), re.MULTILINE)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "specconsole" / "nvml"


def compiler() -> list[str]:
    """$CC, else cc, else gcc; BuildError naming the package to install when none is found."""
    for candidate in (os.environ.get("CC", ""), "cc", "gcc"):
        argv = shlex.split(candidate)
        if argv and shutil.which(argv[0]):
            return argv
    raise BuildError(NO_COMPILER)


def build(out_dir: str | os.PathLike[str] | None = None, omit: Iterable[str] = ()) -> Path:
    """The directory holding libnvidia-ml.so.1, built without the `omit` symbols (an old
    driver's library); reused when that directory already holds this very build."""
    source = SOURCE.read_bytes()
    left_out = sorted(set(omit))
    unknown = sorted(set(left_out) - set(symbols()))
    if unknown:
        raise BuildError(f"cannot omit {', '.join(unknown)}: the NVML stand-in does not export "
                         f"it (it exports {', '.join(symbols())})")
    key = hashlib.sha256(b"\0".join([source, *(f.encode() for f in FLAGS),
                                     *(s.encode() for s in left_out)])).hexdigest()[:16]
    directory = Path(out_dir) if out_dir is not None else cache_root() / key
    library, stamp = directory / LIBRARY, directory / ".build-key"
    with contextlib.suppress(OSError):
        if library.is_file() and stamp.read_text() == key:
            return directory
    cc = compiler()
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY}.", dir=directory)
    os.close(fd)
    argv = [*cc, *FLAGS, *(f"-DOMIT_{s}" for s in left_out), "-o", tmp, str(SOURCE)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
            raise BuildError(f"{shlex.join(cc)} failed to build {LIBRARY}: {lines[0]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, library)  # atomic: a concurrent build or reader sees a whole library
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    stamp.write_text(key)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tui.sim.nvml.build",
        description=f"Build the NVML stand-in {LIBRARY}; print the directory that holds it.")
    parser.add_argument("--omit", action="append", default=[], metavar="SYMBOL",
                        help="leave this NVML function out, as an old driver would (repeatable)")
    parser.add_argument("--out", metavar="DIR", help="build into DIR instead of the cache")
    args = parser.parse_args(argv)
    try:
        print(build(args.out, args.omit))
    except (BuildError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
