"""What a spawn that lost the Kubernetes API server tells the user (spawner/kube/conventions.py),
and the bed's restart refusing what it cannot restart in place; without a cluster."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from spawner.kube.conventions import unreachable_sentence
from tests.kube.bed.faults import is_sentence
from tests.kube.bed.testbed import Testbed, TestbedError


@pytest.mark.parametrize(
    "error",
    [
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientOSError(111, "Connect call failed ('127.0.0.1', 6443)"),
        aiohttp.ClientPayloadError("Response payload is not completed"),
        "apiserver is shutting down",
    ],
    ids=["disconnected", "refused", "payload", "503"],
)
def test_losing_the_api_server_reads_as_a_sentence(error):
    words = unreachable_sentence(error)
    assert words.startswith("The hub lost its connection to the cluster's API server while starting your server")
    assert "Errno" not in words and is_sentence(words), words


def test_only_etcd_and_the_api_server_restart_in_place(tmp_path: Path):
    tb = Testbed(tmp_path, "127.0.0.1", {}, {"kube-scheduler": 1}, {})
    with pytest.raises(TestbedError, match="only etcd, kube-apiserver"):
        tb.restart("kube-scheduler")
