"""The single-server runner's hold on every process of its job: SIGTERM, the grace, then SIGKILL.

The runner is a child subreaper (:func:`spawner.local.processes.become_subreaper`), so
every process its job starts stays below it -- a papermill kernel (Jupyter starts
kernels in a session of their own), torchrun's workers, whatever a script forks and
detaches with ``setsid`` -- and :func:`spawner.local.processes.descendants` finds them
all, where the hub's signal to the runner's process group would miss those that left
it. :class:`JobProcesses` passes a SIGTERM on to all of them, gives them the grace to
save a checkpoint, then kills those still there; the runner exits only once none is
left.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from spawner.local.processes import become_subreaper, descendants, zombie_children


class JobProcesses:
    """Every process below this one (the runner): stop them with a grace, or end what is left."""

    def __init__(self, grace: float):
        self.grace = max(0.0, grace)
        self.me = os.getpid()
        self.subreaper = become_subreaper()
        #: Set by the first SIGTERM: the job is being stopped (cancel, preemption, time limit).
        self.stopping = threading.Event()
        self._killer: threading.Thread | None = None
        #: Children the runner waits for itself (the script's process): never reaped here, or its
        #: exit status would be lost to the runner's own wait.
        self.keep: set[int] = set()

    def signal_all(self, sig: int, skip_own_group: bool = False) -> list[int]:
        """``sig`` to every live descendant (``skip_own_group``: but those in the runner's process
        group, which a signal to the group reached already); the pids it reached."""
        reached = []
        group = os.getpgid(0)
        for pid in descendants(self.me):
            try:
                if skip_own_group and os.getpgid(pid) == group:
                    continue
                os.kill(pid, sig)
                reached.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        return reached

    def reap(self) -> None:
        """Collect exited children (orphans handed to this subreaper included), without waiting."""
        for pid in zombie_children(self.me):
            if pid not in self.keep:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass

    def wait_gone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every descendant to exit; ``True`` when none is left."""
        deadline = time.monotonic() + timeout
        while True:
            self.reap()
            if not descendants(self.me):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def kill_all(self) -> None:
        """SIGKILL every descendant until none is left (a process forking meanwhile is caught next round)."""
        for _ in range(50):
            if not self.signal_all(signal.SIGKILL):
                break
            self.wait_gone(0.2)
        self.reap()

    def stop(self, own_group_signalled: bool = False) -> None:
        """The job is stopped: SIGTERM to all of it now, SIGKILL to what is left after the grace
        (in a thread: the signal handler that calls this returns at once).

        ``own_group_signalled``: the SIGTERM came to the runner's whole group, so its members
        have it already (a second one could cut a checkpoint handler short)."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.signal_all(signal.SIGTERM, skip_own_group=own_group_signalled)

        def after_grace() -> None:
            if not self.wait_gone(self.grace):
                self.kill_all()

        self._killer = threading.Thread(target=after_grace, name="gpulab-grace", daemon=True)
        self._killer.start()

    def finish(self) -> None:
        """Before the runner exits: nothing of the job may outlive it. Within a stop, the grace runs
        out first; otherwise leftovers (a daemon a script left behind) get SIGTERM, a moment, SIGKILL."""
        if self._killer is not None:
            self._killer.join()
        elif descendants(self.me):
            self.signal_all(signal.SIGTERM)
            if not self.wait_gone(min(self.grace, 2.0)):
                self.kill_all()
        self.kill_all()
