"""The test bed's own rules, without starting it: loopback only, one pod range per state folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kube.bed.testbed import TestbedError, check_loopback, pod_ip_prefix, up


@pytest.mark.parametrize(
    "address", ["0.0.0.0", "10.0.0.5", "192.168.1.10", "172.16.0.1", "8.8.8.8", "::1", "localhost", ""]
)
def test_anything_but_an_ipv4_loopback_address_is_refused(address):
    with pytest.raises(TestbedError, match="loopback|127.0.0.0/8"):
        check_loopback(address)


def test_loopback_addresses_are_accepted():
    for address in ("127.0.0.1", "127.1.2.3"):
        check_loopback(address)


def test_up_refuses_a_public_address_before_building_anything(tmp_path):
    with pytest.raises(TestbedError, match="refusing address 0.0.0.0"):
        up("0.0.0.0", tmp_path / "state")
    assert not (tmp_path / "state").exists()


def test_each_state_folder_has_its_own_pod_range():
    a, b = pod_ip_prefix(Path("/tmp/a")), pod_ip_prefix(Path("/tmp/b"))
    assert a.startswith("127.") and b.startswith("127.") and a != b
    assert pod_ip_prefix(Path("/tmp/a")) == a  # stable


# --------------------------------------------------------------------------
# the node agent's kubelet accounting (tests/kube/bed/kubelet_devices.py)


def _pod(*containers: dict, init: tuple = ()) -> dict:
    return {
        "containers": [{"name": f"c{i}", "resources": {"limits": r}} for i, r in enumerate(containers)],
        "initContainers": [{"name": f"i{i}", "resources": {"limits": r}} for i, r in enumerate(init)],
    }


def test_the_kubelet_rejects_what_the_node_cannot_serve_with_its_reason_and_message():
    from tests.kube.bed.kubelet_devices import NodeDevices

    node = NodeDevices(
        "n", {"nvidia.com/gpu.count": "2"}, {"cpu": "8", "memory": "16Gi", "pods": "10", "nvidia.com/gpu": "2"}
    )
    first = node.admit("a", "ns", "a", _pod({"nvidia.com/gpu": "2", "cpu": "500m"}))
    assert first.devices["c0"]["nvidia.com/gpu"] == node.devices["nvidia.com/gpu"]
    rejected = node.admit("b", "ns", "b", _pod({"nvidia.com/gpu": "1"}))
    # pkg/kubelet/lifecycle/predicate.go and kubelet.go rejectPod, Kubernetes v1.36
    assert rejected.status() == {
        "phase": "Failed",
        "reason": "OutOfnvidia.com/gpu",
        "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 2, "
        "capacity: 2",
    }
    assert node.admit("c", "ns", "c", _pod({"cpu": "7600m"})).reason == "OutOfcpu"
    node.release("a")
    assert node.admit("b", "ns", "b", _pod({"nvidia.com/gpu": "1"})).devices["c0"]["nvidia.com/gpu"]


def test_a_pods_request_is_its_containers_sum_or_its_largest_init_container():
    from tests.kube.bed.kubelet_devices import pod_requests

    spec = _pod({"nvidia.com/gpu": "1", "cpu": "1"}, {"nvidia.com/gpu": "1"}, init=({"cpu": "4"},))
    assert pod_requests(spec) == {"nvidia.com/gpu": 2, "cpu": 4000, "pods": 1}


def test_time_slicing_replicas_spread_over_the_gpus_and_map_back_to_the_pod():
    from tests.kube.bed.kubelet_devices import NodeDevices, visible_devices

    node = NodeDevices("ts", {"nvidia.com/gpu.count": "2"}, {"nvidia.com/gpu.shared": "8", "pods": "10"})
    a = node.admit("a", "team", "alice", _pod({"nvidia.com/gpu.shared": "1"}))
    b = node.admit("b", "team", "bob", _pod({"nvidia.com/gpu.shared": "1"}))
    (ra,), (rb,) = a.devices["c0"]["nvidia.com/gpu.shared"], b.devices["c0"]["nvidia.com/gpu.shared"]
    assert "::" in ra and ra.split("::")[0] != rb.split("::")[0]  # one replica of each GPU
    assert visible_devices([ra]) == ra.split("::")[0]
    assert node.pod_resources()["podResources"][0] == {
        "name": "alice",
        "namespace": "team",
        "containers": [{"name": "c0", "devices": [{"resourceName": "nvidia.com/gpu.shared", "deviceIds": [ra]}]}],
    }


# --------------------------------------------------------------------------
# the sandboxed pods' network and files (tests/kube/bed/pod_network.py, pod_sandbox.py)


def test_each_state_folder_has_its_own_private_pod_subnet_and_bridge():
    import ipaddress

    from tests.kube.bed.pod_network import bed_subnet, gateway

    (a, bridge_a), (b, bridge_b) = bed_subnet(Path("/tmp/a")), bed_subnet(Path("/tmp/b"))
    assert a != b and bridge_a != bridge_b and len(bridge_a) <= 9  # veth names fit IFNAMSIZ
    for subnet in (a, b):
        net = ipaddress.ip_network(subnet)
        assert net.is_private and not net.is_loopback and net.prefixlen == 16
    assert gateway(a) == a.replace("0.0/16", "0.1")


def test_a_pods_resolv_conf_and_hosts_file_are_the_kubelets():
    from tests.kube.bed.pod_sandbox import hostname, hosts_file, resolv_conf

    pod = {"metadata": {"name": "job-node-0-0-x7k2p", "namespace": "team-a"},
           "spec": {"hostname": "job-node-0-0", "subdomain": "job"}}  # fmt: skip
    assert resolv_conf("team-a", "10.1.0.1", "cluster.local") == (
        "search team-a.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.1.0.1\noptions ndots:5\n"
    )
    assert hostname(pod) == "job-node-0-0"
    assert hosts_file(pod, "10.1.0.7", "cluster.local").endswith(
        "10.1.0.7\tjob-node-0-0.job.team-a.svc.cluster.local\tjob-node-0-0\n"
    )
    plain = {"metadata": {"name": "p", "namespace": "n"}, "spec": {}}
    assert hosts_file(plain, "10.1.0.8", "cluster.local").endswith("10.1.0.8\tp\n")


def test_the_release_manifests_are_kustomized_as_their_kustomizations_do():
    from tests.kube.bed.training_operators import json_patch_replace, kustomize_rbac

    binding = {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "manager-rolebinding"},
        "roleRef": {"kind": "ClusterRole", "name": "manager-role"},
        "subjects": [{"kind": "ServiceAccount", "name": "controller-manager", "namespace": "system"}],
    }
    (out,) = kustomize_rbac([binding], "jobset-system", "jobset-")
    assert out["metadata"] == {"name": "jobset-manager-rolebinding"}  # cluster-scoped: no namespace
    assert out["roleRef"]["name"] == "jobset-manager-role"
    assert out["subjects"] == [
        {"kind": "ServiceAccount", "name": "jobset-controller-manager", "namespace": "jobset-system"}
    ]
    doc = {"webhooks": [{"name": "a"}, {"name": "b"}]}
    assert json_patch_replace(doc, [{"op": "replace", "path": "/webhooks/1", "value": {"name": "c"}}]) == {
        "webhooks": [{"name": "a"}, {"name": "c"}]
    }
    assert doc["webhooks"][1] == {"name": "b"}  # the release's document is left as it is
    with pytest.raises(ValueError, match="unsupported"):
        json_patch_replace(doc, [{"op": "remove", "path": "/webhooks/0"}])
