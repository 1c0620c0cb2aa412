"""What the tests share, importable by tests and benchmarks, never collected.

- :mod:`.hub`: a real JupyterHub with its proxy (``RunningHub``), ``ADMIN_SCOPES``
- :mod:`.processes`: start a process and wait until it answers; stop what a test left
- :mod:`.ports`: each pytest-xdist worker's own slice of ports
- :mod:`.catalogs`: the sample catalogs the tests and benchmarks start hubs with
- :mod:`.jobs`: submit a notebook job and wait for its state
- :mod:`.lab`, :mod:`.browser`: JupyterLab through Chromium
- :mod:`.kube_spawner`: one ``spawner_for`` a GPUKubeSpawner on the test bed
- :mod:`.dcgm_fake_exporter`, :mod:`.isolation_probe`: stand-ins and probes

The Kubernetes test bed itself lives in ``tests/kube/bed/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
