"""Processes the tests start and stop: wait until one answers, kill what accounts left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import requests


class NotReady(RuntimeError):
    """The process exited (``returncode`` set) or did not answer in time (``returncode`` None)."""

    def __init__(self, message: str, returncode: int | None):
        super().__init__(message)
        self.returncode = returncode


def wait_ready(
    proc: subprocess.Popen, url: str, *, timeout: float, interval: float = 0.3, request_timeout: float = 2.0
) -> None:
    """Poll ``url`` until it answers 200, while ``proc`` runs; :class:`NotReady` otherwise.

    The caller says what failed in its own words (a hub, Prometheus, ``gpulab up``), with
    its log: whether it exited (``returncode``) or never answered.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise NotReady(f"exited with {proc.returncode}", proc.returncode)
        try:
            if requests.get(url, timeout=request_timeout).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(interval)
    raise NotReady(f"did not answer {url} in {timeout:g} s", None)


def kill_uids(uids: set[int], timeout: float = 30.0) -> None:
    """SIGKILL every process owned by one of ``uids`` until none is left (children fork as
    parents die, and on a loaded machine a killed process takes a while to be gone: ``userdel``
    refuses an account while /proc still lists one of its processes)."""
    deadline = time.monotonic() + timeout
    while True:
        found = 0
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid in uids:
                        found += 1
                        os.kill(int(entry.name), signal.SIGKILL)
                except (OSError, ProcessLookupError):
                    pass
        if not found or time.monotonic() > deadline:
            return
        time.sleep(0.2)
