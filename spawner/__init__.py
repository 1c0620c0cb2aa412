"""gpulab's spawners, by room.

- :mod:`spawner.core`: the policy core, pure (no I/O, no framework). Read
  ``core/policy.py`` and ``core/ledger.py`` first.
- :mod:`spawner.local`: the single server (``gpu-local``, ``gpu-simple-local``,
  ``gpulab-launch``): the spawners, system accounts, sudo and the mediator, NVML.
- :mod:`spawner.kube`: Kubernetes (``gpu-kube``): GPUKubeSpawner, its ledger from
  labelled pods, KubeSpawner's conventions.
- :mod:`spawner.runtime`: ``c.GPULab`` and the one process-wide runtime (catalog,
  ledger, packer) the spawners, the jobs API and the admin API share.

``local`` and ``kube`` adapt the core and never import each other
(``scripts/import_rules.py``). Importing this package imports nothing heavy.
"""

__all__: list[str] = []
