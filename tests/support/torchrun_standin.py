"""A stand-in for PyTorch's ``torchrun`` (``torch.distributed.run``) on a single node, for the
single-server tests: torch cannot be installed within the test machines' limits.

It imitates what torchrun's documentation says it does for ``--standalone --nnodes=1
--nproc_per_node=N script args...`` (https://pytorch.org/docs/stable/elastic/run.html,
"Environment Variables" and "Signals"; torch/distributed/elastic/agent/server/api.py):

- starts N worker processes ``python script args...``, each with ``LOCAL_RANK``, ``RANK``,
  ``GROUP_RANK`` (0), ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE`` (N), ``MASTER_ADDR``
  (``localhost``) and ``MASTER_PORT`` (a free port: ``--standalone``'s rendezvous),
  ``TORCHELASTIC_RESTART_COUNT`` (0) and ``TORCHELASTIC_RUN_ID``;
- exits 0 when every worker did, else 1 (torchrun's ``ChildFailedError``);
- on SIGTERM or SIGINT stops the workers: SIGTERM to each, SIGKILL to those left after a
  timeout (the agent's ``_shutdown``), and exits with the signal's status.

It runs no rendezvous store and no collective: the tests check the launch, not torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--nproc_per_node", "--nproc-per-node", type=int, required=True)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    if ns.nnodes != "1" or not ns.standalone:
        print("torchrun stand-in: only --standalone --nnodes=1 is imitated", file=sys.stderr)
        return 2
    n = ns.nproc_per_node
    port, run_id = free_port(), uuid.uuid4().hex
    workers = []
    for rank in range(n):
        env = dict(os.environ)
        env.update(
            LOCAL_RANK=str(rank),
            RANK=str(rank),
            GROUP_RANK="0",
            LOCAL_WORLD_SIZE=str(n),
            WORLD_SIZE=str(n),
            MASTER_ADDR="localhost",
            MASTER_PORT=str(port),
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_RUN_ID=run_id,
        )
        workers.append(subprocess.Popen([sys.executable, ns.script, *ns.args], env=env))

    def shutdown(signum: int, frame: object) -> None:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while any(w.poll() is None for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        for w in workers:
            if w.poll() is None:
                w.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    codes = [w.wait() for w in workers]
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
