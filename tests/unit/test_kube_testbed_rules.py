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
