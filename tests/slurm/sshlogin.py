"""The lane's login node reached over SSH, and its nodes' sshd (reach = "ssh").

The login node is the fault lab's gpu-a (tests/lab/netlab.py: real sshd in a network namespace
of its own, its link to this machine, the jump host, the one its faults break). It runs Slurm's
client commands against the lane's cluster as a login node does: the same slurm.conf (its sshd
sets SLURM_CONF for every session) and munge socket on the shared filesystem, slurmctld reached
at its address over gpu-a's link. Each node gets a link of its own to the login node (the
address 10.<230+N>.<100+i>.{1,2}: what the login node's srun and ssh use to reach it, and the
node's slurmd to answer srun) and an sshd in its namespace, its host key in the lab's
known_hosts at the address the scheduler has for the node.

Stdlib only; needs root, /usr/sbin/sshd, ip (the fault lab's requirements).
"""

from __future__ import annotations

import contextlib
import subprocess

from lab.netlab import Lab, public_key, spawn_sshd, write_sshd_config

from slurm.slurmlab import Cluster, _sh, net

LOGIN = "gpu-a"  # the lab's host that is the login node


class SshLogin:
    """The login node (the lab's gpu-a) wired to `cluster`, and sshd on each of its nodes."""

    def __init__(self, cluster: Cluster, lab: Lab) -> None:
        self.cluster = cluster
        self.lab = lab
        self._sshd: dict[str, subprocess.Popen[bytes]] = {}
        assert cluster.slot is not None
        self.net = net(cluster.slot)

    def up(self) -> None:
        login_ns = self.lab.ns[LOGIN]
        # slurmctld listens on this machine: reached over the login node's own link
        _sh("ip", "-n", login_ns, "route", "add", f"{self.net}.1.1/32", "via",
            f"{self.lab.net}.1.1")
        for i, node in enumerate(self.cluster.nodes, 1):
            ns, link = self.cluster.namespace(node), f"sl{i}"
            _sh("ip", "link", "add", link, "netns", login_ns, "type", "veth", "peer", "name",
                "login", "netns", ns)
            _sh("ip", "-n", login_ns, "addr", "add", f"{self.net}.{100 + i}.1/24", "dev", link)
            _sh("ip", "-n", ns, "addr", "add", f"{self.net}.{100 + i}.2/24", "dev", "login")
            _sh("ip", "-n", login_ns, "link", "set", link, "up")
            _sh("ip", "-n", ns, "link", "set", "login", "up")
            _sh("ip", "-n", login_ns, "route", "add", f"{self.cluster.address(node)}/32", "via",
                f"{self.net}.{100 + i}.2")
            folder = self.lab.workdir / node
            write_sshd_config(folder, self.lab.keys, node)
            self._sshd[node] = spawn_sshd(ns, node, folder)
            with self.lab.known_hosts.open("a") as known:
                known.write(f"{self.cluster.address(node)} {public_key(self.lab.keys, node)}\n")
        # every session on the login node finds the cluster as its commands would in /etc/slurm
        self.lab.kill_sshd(LOGIN)
        write_sshd_config(self.lab.workdir / LOGIN, self.lab.keys, LOGIN,
                          f"SetEnv SLURM_CONF={self.cluster.conf}\n")
        self.lab.start_sshd(LOGIN)

    def host_table(self) -> dict[str, object]:
        """The profile's [host]: the login node over SSH."""
        return self.lab.host_table(LOGIN)

    def link_down(self) -> None:
        """The link between this machine (the jump host) and the login node."""
        self.lab.link_down(LOGIN)

    def link_up(self) -> None:
        self.lab.link_up(LOGIN)

    def down(self) -> None:
        """The nodes' sshd and links (the lab itself is taken down by its owner)."""
        for proc in self._sshd.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)
        for i, _ in enumerate(self.cluster.nodes, 1):
            _sh("ip", "-n", self.lab.ns[LOGIN], "link", "del", f"sl{i}", check=False)
