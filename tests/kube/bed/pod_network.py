"""The test bed's pod network: what the CNI ``bridge`` plugin with ``host-local`` IPAM
gives a pod, for pods whose process the node agent really runs.

Each such pod gets a network namespace of its own with one end of a veth pair as its
``eth0``, an address from the bed's pod subnet and a default route via the bridge's
address; the other end is a port of the bed's bridge on the host (containernetworking/
plugins ``plugins/main/bridge``: ``isGateway``, a /16 from ``host-local``). So pods have
addresses the API server accepts in EndpointSlices (it refuses loopback ones, so CoreDNS
could not publish a pod at 127.x), their own ports (two gangs' rendezvous stores both on
29500 do not collide) and reach each other and the bridge's address, where the bed's
CoreDNS listens; the host reaches them over the bridge.

Nothing leaves the machine: the host does not forward (``net.ipv4.ip_forward`` is left as
it is, and no masquerading is set up, unlike the bridge plugin's ``ipMasq``), so the
subnet is reachable from this host only, as the bed's loopback-only rule asks. The
subnet is one per bed state folder (like the loopback range of the other pods), and a
subnet the host already routes is refused.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import subprocess
from pathlib import Path

log = logging.getLogger("node-agent")
#: Network namespaces and host-side veth ends of a bed are named with this and its hash.
PREFIX = "gpl"


class PodNetworkError(RuntimeError):
    """The pod network cannot be set up; the message says why."""


def bed_subnet(state_dir: Path) -> tuple[str, str]:
    """``(subnet, bridge name)`` of a bed: ``10.<100..249>.0.0/16`` and ``gpl<hash>``."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()
    n = int(digest[:4], 16)
    return f"10.{100 + n % 150}.0.0/16", f"{PREFIX}{digest[:6]}"


def gateway(subnet: str) -> str:
    """The bridge's address, which pods route through and the bed's CoreDNS listens on."""
    return str(next(ipaddress.ip_network(subnet).hosts()))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def ensure_bridge(subnet: str, bridge: str) -> None:
    """Make the bed's bridge with the gateway address (once; kept while the bed runs)."""
    net = ipaddress.ip_network(subnet)
    if _ip("link", "show", bridge, check=False).returncode == 0:
        return
    for line in _ip("-4", "route", "show").stdout.splitlines():
        dest = line.split()[0]
        if dest != "default" and ipaddress.ip_network(dest, strict=False).overlaps(net):
            raise PodNetworkError(f"the host already routes {dest}, which overlaps the bed's pod subnet {subnet}")
    _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "add", f"{gateway(subnet)}/{net.prefixlen}", "dev", bridge)
    _ip("link", "set", bridge, "up")


def remove(bridge: str) -> None:
    """Remove the bed's bridge and every pod network namespace of it (the bed is going down)."""
    for name in _ip("netns", "list", check=False).stdout.split():
        if name.startswith(bridge + "-"):
            _ip("netns", "del", name, check=False)
    _ip("link", "del", bridge, check=False)


class PodNetwork:
    """Addresses and network namespaces of the bed's sandboxed pods."""

    def __init__(self, subnet: str, bridge: str):
        self.subnet = ipaddress.ip_network(subnet)
        self.bridge = bridge
        self.gateway = gateway(subnet)
        self._hosts = self.subnet.hosts()
        next(self._hosts)  # the gateway's
        self._index = 0
        ensure_bridge(subnet, bridge)
        for name in _ip("netns", "list").stdout.split():  # what an earlier agent left
            if name.startswith(bridge + "-"):
                _ip("netns", "del", name, check=False)

    def attach(self) -> tuple[str, str]:
        """A new pod's network namespace on the bridge: ``(namespace name, pod IP)``."""
        self._index += 1
        ip = str(next(self._hosts))
        netns = f"{self.bridge}-{self._index}"
        host_end, pod_end = f"{self.bridge}h{self._index}", f"{self.bridge}p{self._index}"
        _ip("netns", "add", netns)
        try:
            _ip("link", "add", host_end, "type", "veth", "peer", "name", pod_end)
            _ip("link", "set", pod_end, "netns", netns)
            _ip("-n", netns, "link", "set", pod_end, "name", "eth0")
            _ip("-n", netns, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", netns, "route", "add", "default", "via", self.gateway)
            _ip("link", "set", host_end, "master", self.bridge)
            _ip("link", "set", host_end, "up")
        except PodNetworkError:
            self.detach(netns)
            raise
        return netns, ip

    def detach(self, netns: str) -> None:
        """Delete a pod's network namespace (its veth pair goes with it)."""
        _ip("netns", "del", netns, check=False)


__all__ = ["PodNetwork", "PodNetworkError", "bed_subnet", "ensure_bridge", "gateway", "remove"]
