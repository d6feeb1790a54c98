"""The fault lab: real OpenSSH sshd hosts in network namespaces, and the faults to break them.

Two hosts per lab: "gpu-a" (reachable from here over a veth pair) and "gpu-b" (reachable ONLY
from gpu-a, over a second veth pair: the jump-host case). Each runs the system's
/usr/sbin/sshd with the lab's own host key, in its own network and UTS namespace, so `hostname`
says gpu-a or gpu-b. Processes started there share this machine's filesystem and PID space, so
a test reads a "remote" run directory directly and finds its processes in /proc.

Several pytest processes may run labs at once: each claims a slot N (0..7) by an fcntl lock,
and its names (namespaces sc{N}a and sc{N}b, links) and subnet (10.{210+N}.0.0/16) are its own.
An "unreachable" route for the subnet keeps traffic for a downed link from leaving by the
default route. The kernel here has no netem, so loss is an nftables random drop and delay is a
stdlib TCP proxy on port 2200 (`python netlab.py delayproxy ...`, run inside the namespace).

Stdlib only; needs root, /usr/sbin/sshd, ip and nft.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

SSHD = "/usr/sbin/sshd"  # an absolute path: sshd re-execs itself
LOCK_DIR = Path("/run/specconsole-lab")
SLOTS = 8
HOSTS = ("gpu-a", "gpu-b")
PROXY_PORT = 2200
CONNECT_TIMEOUT_S = 5
_PARTITION = "specconsole_partition"  # one nft table per fault: a partition during loss
_LOSS = "specconsole_loss"  # heals back to the loss


def lab_python() -> str:
    """The interpreter remote commands use: the project's environment (it has psutil) where
    `python3 -m tui.bootstrap` made it ($SPECCONSOLE_VENV), else the one running the tests."""
    configured = os.environ.get("SPECCONSOLE_VENV")
    python = str(Path(configured) / "bin" / "python") if configured else ""
    return python if python and os.access(python, os.X_OK) else sys.executable


def missing_requirements() -> str | None:
    """Why a lab cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "the fault lab needs root (network namespaces, sshd)"
    for tool in (SSHD, "/usr/sbin/ip", "/usr/sbin/nft"):
        if not os.access(tool, os.X_OK) and not any(
                os.access(Path(d) / Path(tool).name, os.X_OK)
                for d in os.environ.get("PATH", "").split(os.pathsep) if d):
            return f"{tool} is missing (python3 -m tui.bootstrap lab installs it)"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"lab: {' '.join(argv)} failed ({result.returncode}): "
                           f"{result.stderr.strip()}")
    return result


def _alive(pid: int) -> bool:
    """Running and not a zombie (a killed sshd lingers as one until its parent reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Lab:
    """One lab: its slot, its two namespaces with sshd, its keys and ssh files."""

    def __init__(self, slot: int, lock: IO[str], workdir: Path) -> None:
        self.slot = slot
        self._lock = lock
        self.workdir = workdir
        self.net = f"10.{210 + slot}"
        self.ns = {"gpu-a": f"sc{slot}a", "gpu-b": f"sc{slot}b"}
        self.keys = workdir / "keys"
        self.ssh_config = workdir / "ssh_config"
        self.known_hosts = self.keys / "known_hosts"
        self.client_key = self.keys / "client_ed25519"
        self._sshd: dict[str, subprocess.Popen[bytes]] = {}
        self._proxy: dict[str, subprocess.Popen[bytes]] = {}

    # -- addresses -------------------------------------------------------------------------

    def address(self, host: str) -> str:
        """Where the host's sshd is reached: gpu-a from here, gpu-b from gpu-a."""
        return {"gpu-a": f"{self.net}.1.2", "gpu-b": f"{self.net}.12.2"}[self._check(host)]

    def peer_address(self, host: str) -> str:
        """Where the other lab host reaches this one (their shared link): a cluster's address."""
        return {"gpu-a": f"{self.net}.12.1", "gpu-b": f"{self.net}.12.2"}[self._check(host)]

    def _check(self, host: str) -> str:
        if host not in HOSTS:
            raise ValueError(f"lab host must be one of {HOSTS}, not {host!r}")
        return host

    def _link(self, host: str) -> tuple[list[str], str]:
        """The host's one link, as (ip argv prefix, device) on its upstream side."""
        if self._check(host) == "gpu-a":
            return ["ip"], f"sc{self.slot}a-v"
        return ["ip", "-n", self.ns["gpu-a"]], "ab0"

    def host_table(self, host: str, delayed: bool = False) -> dict[str, Any]:
        """The profile's [host] table for a lab host. `delayed`: reach each hop of the route
        (gpu-b's jump host gpu-a, and the host) that has a delay set through its proxy."""
        route = ("gpu-a", "gpu-b") if self._check(host) == "gpu-b" else ("gpu-a",)
        if delayed and not any(h in self._proxy for h in route):
            raise RuntimeError(f"lab: no delay set on {' or '.join(route)}; call lab.delay")

        def target(name: str) -> str:
            if delayed and name in self._proxy:
                return f"{self.address(name)}:{PROXY_PORT}"
            return self.address(name)

        table: dict[str, Any] = {"target": target(host)}
        if host == "gpu-b":
            table["jump"] = target("gpu-a")
        table.update(known_hosts=str(self.known_hosts), python=lab_python(),
                     keepalive_interval=1, keepalive_count_max=3,
                     connect_timeout=CONNECT_TIMEOUT_S)
        return table

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def up(cls, workdir: Path) -> Lab:
        """Claim a free slot, build its namespaces and links, start both sshds."""
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        for slot in range(SLOTS):
            lock = (LOCK_DIR / f"slot-{slot}.lock").open("w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            lab = cls(slot, lock, Path(workdir))
            try:
                lab._build()
            except BaseException:
                lab.down()
                raise
            return lab
        raise RuntimeError(f"lab: all {SLOTS} slots in {LOCK_DIR} are taken")

    def _build(self) -> None:
        self._teardown_net()  # whatever a crashed owner of this slot left
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        self._keys()
        a, b, net = self.ns["gpu-a"], self.ns["gpu-b"], self.net
        _sh("ip", "route", "replace", "unreachable", f"{net}.0.0/16")
        for ns in (a, b):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "link", "add", f"sc{self.slot}a-v", "type", "veth", "peer", "name", "eth0",
            "netns", a)
        _sh("ip", "addr", "add", f"{net}.1.1/24", "dev", f"sc{self.slot}a-v")
        _sh("ip", "link", "set", f"sc{self.slot}a-v", "up")
        _sh("ip", "-n", a, "addr", "add", f"{net}.1.2/24", "dev", "eth0")
        _sh("ip", "-n", a, "link", "set", "eth0", "up")
        _sh("ip", "link", "add", "ab0", "netns", a, "type", "veth", "peer", "name", "ab0",
            "netns", b)
        _sh("ip", "-n", a, "addr", "add", f"{net}.12.1/24", "dev", "ab0")
        _sh("ip", "-n", b, "addr", "add", f"{net}.12.2/24", "dev", "ab0")
        for ns in (a, b):
            _sh("ip", "-n", ns, "link", "set", "ab0", "up")
        for host in HOSTS:
            self._sshd_config(host)
            self.start_sshd(host)

    def _keys(self) -> None:
        self.keys.mkdir(parents=True, exist_ok=True)
        for name in ("client_ed25519", "host_gpu-a", "host_gpu-b"):
            make_key(self.keys, name)
        authorized = self.keys / "authorized_keys"
        authorized.write_text((self.keys / "client_ed25519.pub").read_text())
        authorized.chmod(0o600)
        lines = []
        for host in HOSTS:
            addr = self.address(host)
            lines.append(f"{addr},[{addr}]:{PROXY_PORT} {public_key(self.keys, host)}\n")
        self.known_hosts.write_text("".join(lines))
        self.ssh_config.write_text(
            "Host *\n"
            "    User root\n"
            f"    IdentityFile {self.client_key}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts}\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n")

    def _sshd_config(self, host: str) -> None:
        write_sshd_config(self.workdir / host, self.keys, host)

    def down(self) -> None:
        """Kill everything in the namespaces (all started by the lab or its tests), delete
        them and the links, release the slot."""
        for proc in [*self._proxy.values(), *self._sshd.values()]:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)
        self._proxy.clear()
        self._sshd.clear()
        self._teardown_net()
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._lock.close()

    def _teardown_net(self) -> None:
        for ns in self.ns.values():
            if Path(f"/run/netns/{ns}").exists():
                self._kill_pids(self._pids(ns), signal.SIGKILL)
                _sh("ip", "-n", ns, "link", "del", "ab0", check=False)
                _sh("ip", "netns", "del", ns, check=False)
        _sh("ip", "link", "del", f"sc{self.slot}a-v", check=False)
        _sh("ip", "route", "del", "unreachable", f"{self.net}.0.0/16", check=False)

    @staticmethod
    def _pids(ns: str) -> list[int]:
        out = _sh("ip", "netns", "pids", ns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]

    @staticmethod
    def _kill_pids(pids: list[int], sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 3
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)

    # -- sshd ------------------------------------------------------------------------------

    def start_sshd(self, host: str) -> None:
        """(Re)start the host's sshd listener; returns once it listens. Idempotent."""
        old = self._sshd.get(self._check(host))
        if old is not None and old.poll() is None:
            return
        self._sshd[host] = spawn_sshd(self.ns[host], host, self.workdir / host)

    def kill_sshd(self, host: str, sig: int = signal.SIGKILL) -> None:
        """The listener and every session sshd in the host's namespace (killing only the
        listener leaves open sessions streaming)."""
        pids = [p for p in self._pids(self.ns[self._check(host)]) if _comm(p) == "sshd"]
        self._kill_pids(pids, sig)
        proc = self._sshd.pop(host, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def sshd_pids(self, host: str) -> list[int]:
        """Live sshd processes (listener and sessions) in the host's namespace."""
        return [p for p in self._pids(self.ns[self._check(host)])
                if _comm(p) == "sshd" and _alive(p)]

    # -- faults ----------------------------------------------------------------------------

    def link_down(self, host: str) -> None:
        prefix, dev = self._link(host)
        _sh(*prefix, "link", "set", dev, "down")

    def link_up(self, host: str) -> None:
        prefix, dev = self._link(host)
        _sh(*prefix, "link", "set", dev, "up")

    def _nft(self, host: str, table: str, *rule: str) -> None:
        """A table dropping what `rule` matches on the namespace's input and output; loopback
        inside it is spared (a partition does not stop the server talking to itself)."""
        nft = ["ip", "netns", "exec", self.ns[self._check(host)], "nft"]
        self._nft_clear(host, table)
        _sh(*nft, "add", "table", "inet", table)
        for chain, hook, lo in (("in", "input", "iifname"), ("out", "output", "oifname")):
            _sh(*nft, f"add chain inet {table} {chain} "
                      f"{{ type filter hook {hook} priority 0; policy accept; }}")
            _sh(*nft, "add", "rule", "inet", table, chain, lo, "lo", "accept")
            _sh(*nft, "add", "rule", "inet", table, chain, *rule, "drop")

    def _nft_clear(self, host: str, table: str) -> None:
        _sh("ip", "netns", "exec", self.ns[self._check(host)], "nft", "delete", "table",
            "inet", table, check=False)

    def partition(self, host: str) -> None:
        """Silently drop everything to and from the host; its link stays up."""
        self._nft(host, _PARTITION)

    def heal(self, host: str) -> None:
        """End the partition (a loss set with `loss` stays)."""
        self._nft_clear(host, _PARTITION)

    def loss(self, host: str, pct: int) -> None:
        """Drop `pct` % of packets each way, at random."""
        self._nft(host, _LOSS, "numgen", "random", "mod", "100", "<", str(int(pct)))

    def delay(self, host: str, ms: int) -> None:
        """Start a proxy on <address>:2200 that forwards to the host's sshd `ms` late each way;
        `host_table(host, delayed=True)` points at it."""
        self._stop_proxy(host)
        folder = self.workdir / host
        log = folder / "delayproxy.log"
        log.write_bytes(b"")
        with log.open("ab") as out:
            self._proxy[host] = subprocess.Popen(
                ["ip", "netns", "exec", self.ns[host], sys.executable, str(Path(__file__)),
                 "delayproxy", self.address(host), str(PROXY_PORT), "127.0.0.1", "22", str(ms)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        deadline = time.monotonic() + 10
        while b"delayproxy" not in log.read_bytes():
            if time.monotonic() > deadline or self._proxy[host].poll() is not None:
                raise RuntimeError(f"lab: delay proxy on {host} did not start: "
                                   f"{log.read_text(errors='replace')}")
            time.sleep(0.02)

    def _stop_proxy(self, host: str) -> None:
        proc = self._proxy.pop(host, None)
        if proc is not None:
            proc.kill()
            proc.wait()

    def clear(self, host: str) -> None:
        """Remove loss and delay (not a partition, the link or sshd: see reset)."""
        self._nft_clear(host, _LOSS)
        self._stop_proxy(host)

    def reset(self) -> None:
        """Every fault off: links up, no nft rules, no proxies, both sshds listening."""
        for host in HOSTS:
            self.link_up(host)
            self.heal(host)
            self.clear(host)
            self.start_sshd(host)

    def run_in(self, host: str, argv: list[str], timeout: float = 60
               ) -> subprocess.CompletedProcess[str]:
        """A command inside the host's namespace (not over SSH)."""
        return subprocess.run(["ip", "netns", "exec", self.ns[self._check(host)], *argv],
                              capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------ sshd

def make_key(keys: Path, name: str) -> None:
    """An ed25519 key pair `keys/name` (and .pub), unless it exists."""
    if not (keys / name).exists():
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"lab-{name}",
            "-f", str(keys / name))


def public_key(keys: Path, host: str) -> str:
    """`host`'s public host key as known_hosts takes it (type and key)."""
    return " ".join((keys / f"host_{host}.pub").read_text().split()[:2])


def write_sshd_config(folder: Path, keys: Path, host: str, extra: str = "") -> None:
    """`folder/sshd_config` for `host`: its host key keys/host_<host>, the client key's
    authorized_keys; `extra` lines appended (SetEnv, ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    make_key(keys, f"host_{host}")
    (folder / "sshd_config").write_text(f"""\
ListenAddress 0.0.0.0
Port 22
HostKey {keys / f'host_{host}'}
PidFile {folder / 'sshd.pid'}
AuthorizedKeysFile {keys / 'authorized_keys'}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# keys live under /tmp (mode 1777): StrictModes yes would refuse them
StrictModes no
AllowTcpForwarding yes
MaxStartups 100
MaxSessions 100
LogLevel INFO
{extra}""")


# The user's shell start-up files, which bash reads before any command sshd runs for them
# (Debian's bash sources ~/.bashrc when run by sshd).
STARTUP_FILES = (".bashrc", ".bash_profile", ".bash_login", ".profile")


def startup_files_emptied() -> str:
    """Shell commands that mount an empty file over each of this user's start-up files that
    exist, for a mount namespace of the host's own: a lab host is a fresh host, not this
    machine's login. (This machine's ~/.bashrc runs `pyenv init`, whose `pyenv rehash` waits
    60 s on a lock a killed rehash left behind: every command over SSH then took a minute.)"""
    return "".join(f"mount --bind /dev/null {shlex.quote(str(path))} && "
                   for path in (Path.home() / name for name in STARTUP_FILES) if path.exists())


def spawn_sshd(ns: str, host: str, folder: Path) -> subprocess.Popen[bytes]:
    """The system's sshd with `folder/sshd_config`, in network namespace `ns`, a UTS
    namespace of its own (`hostname` says `host`) and a mount namespace where the user's shell
    start-up files are empty, logging to folder/sshd.log; returned once it listens."""
    config = folder / "sshd_config"
    _sh(SSHD, "-t", "-f", str(config))
    log = folder / "sshd.log"
    start = log.stat().st_size if log.exists() else 0
    (folder / "sshd.pid").unlink(missing_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "sh", "-c",
             f"hostname {host} && {startup_files_emptied()}exec {SSHD} -D -e -f {config}"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with log.open("rb") as f:
            f.seek(start)
            if b"Server listening" in f.read():
                return proc
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError(f"lab: sshd on {host} did not start: "
                       f"{log.read_bytes()[start:].decode(errors='replace')[-2000:]}")


# ------------------------------------------------------------------------------ delay proxy

async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: float) -> None:
    """Forward each chunk `delay` seconds after it arrived, in order; then half-close."""
    queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if data is None:
                break
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(send())
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay, data))
    queue.put_nowait((time.monotonic() + delay, None))
    with contextlib.suppress(OSError):
        await sender


async def _proxy(listen: str, port: int, to_host: str, to_port: int, delay_ms: float) -> None:
    delay = delay_ms / 1000.0

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(to_host, to_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, server_w, delay), _pump(server_r, client_w, delay),
                             return_exceptions=True)
        client_w.close()
        server_w.close()

    server = await asyncio.start_server(handle, listen, port)
    print(f"delayproxy {listen}:{port} -> {to_host}:{to_port} +{delay_ms:g}ms each way",
          flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__" and sys.argv[1:2] == ["delayproxy"]:
    host_, port_, to_host_, to_port_, ms_ = sys.argv[2:7]
    asyncio.run(_proxy(host_, int(port_), to_host_, int(to_port_), float(ms_)))
