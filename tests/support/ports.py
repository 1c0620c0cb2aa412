"""Ports for the processes the tests start (hubs, proxies, Prometheus, the control plane)."""

from __future__ import annotations

import os
import random
import socket

#: Ports the tests choose themselves come from below the kernel's ephemeral range
#: (``net.ipv4.ip_local_port_range``, 32768-60999 by default), where every "any free
#: port" of the processes under test (single-user servers, kernels, Chromium) lands, and
#: each pytest-xdist worker has its own slice: a port a test has picked but not yet
#: bound is never handed to anyone else meanwhile.
PORT_RANGE = (20000, 32000)
PORT_SLICES = 16
_given: set[int] = set()


def free_port(address: str = "127.0.0.1") -> int:
    """A free port on ``address`` from this test worker's own slice of :data:`PORT_RANGE`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (PORT_RANGE[1] - PORT_RANGE[0]) // PORT_SLICES
    first = PORT_RANGE[0] + (index % PORT_SLICES) * size
    for port in random.sample(range(first, first + size), size):
        if port in _given:
            continue  # handed out already: its owner may not have bound it yet
        with socket.socket() as s:
            try:
                s.bind((address, port))
            except OSError:
                continue  # in use, or still in TIME_WAIT
            _given.add(port)
            return port
    raise RuntimeError(f"no free port in {first}-{first + size - 1} for test worker {worker}")
