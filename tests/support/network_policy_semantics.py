"""NetworkPolicy semantics without a CNI: a test stand-in for a network plugin's verdict.

The test bed has no network plugin, so no NetworkPolicy is enforced there, and
sigs.k8s.io/network-policy-api's policy-assistant (an evaluator that needs no
cluster) is not served by the Go module proxy here. This module decides whether
one connection is allowed by a set of ``networking.k8s.io/v1`` NetworkPolicies
the way the Kubernetes documentation ("Network Policies", concepts/services-networking)
defines it:

- a pod is isolated for ingress (egress) when a policy of its namespace selects it
  (``podSelector``) and lists ``Ingress`` (``Egress``) in ``policyTypes``;
  an isolated direction allows only what some rule of those policies allows;
- a rule allows a connection when one of its peers matches (no ``from``/``to``:
  any peer) and one of its ports does (no ``ports``: any port); a port's protocol
  defaults to TCP;
- a peer is a ``podSelector`` (pods of the policy's namespace), a
  ``namespaceSelector`` (every pod of those namespaces), both (those pods of those
  namespaces), or an ``ipBlock`` (addresses in ``cidr`` and not in ``except``;
  meant for addresses outside the cluster, as here);
- a connection between two pods needs the source's egress and the destination's
  ingress to allow it.

Label selectors support ``matchLabels`` and ``matchExpressions`` (In, NotIn,
Exists, DoesNotExist).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    """A pod (namespace, its labels and its namespace's labels) or an address outside the cluster."""

    ip: str = ""
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector; ``{}`` selects everything."""
    selector = selector or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], set(e.get("values") or ())
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, other: Endpoint) -> bool:
    if "ipBlock" in peer:
        if other.is_pod and not other.ip:
            return False
        ip = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        return ip in ipaddress.ip_network(block["cidr"]) and not any(
            ip in ipaddress.ip_network(x) for x in block.get("except") or ()
        )
    if not other.is_pod:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != policy_ns:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], other.labels)


def _port_matches(ports: Iterable[Mapping[str, Any]] | None, port: int, protocol: str) -> bool:
    """Numeric ports only (a named port would need the destination's container ports)."""

    def one(p: Mapping[str, Any]) -> bool:
        if p.get("protocol", "TCP") != protocol:
            return False
        if "port" not in p:
            return True
        if p.get("endPort"):
            return int(p["port"]) <= port <= int(p["endPort"])
        return int(p["port"]) == port

    ports = list(ports or [])
    return not ports or any(one(p) for p in ports)


def _direction_allows(
    policies: Iterable[Mapping[str, Any]], pod: Endpoint, other: Endpoint, port: int, protocol: str, kind: str
) -> bool:
    key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and selects(p["spec"].get("podSelector"), pod.labels)
        and kind in (p["spec"].get("policyTypes") or ["Ingress"])
    ]
    if not selecting:
        return True  # not isolated in this direction
    for policy in selecting:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key)
            if (not peers or any(_peer_matches(x, policy["metadata"]["namespace"], other) for x in peers)) and (
                _port_matches(rule.get("ports"), port, protocol)
            ):
                return True
    return False


def allowed(
    policies: Iterable[Mapping[str, Any]], source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Whether ``source`` may open a connection to ``destination:port``."""
    policies = list(policies)
    if source.is_pod and not _direction_allows(policies, source, destination, port, protocol, "Egress"):
        return False
    return not destination.is_pod or _direction_allows(policies, destination, source, port, protocol, "Ingress")
