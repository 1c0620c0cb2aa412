"""Kubernetes: ``gpu-kube``, the GPUKubeSpawner on top of KubeSpawner.

Read first: :mod:`.spawner` (the spawner: profiles from the catalog, admission,
the pod's share); :mod:`.ledger` rebuilds the ledger from labelled pods, seen by
:mod:`.informer`'s list-once watches,
:mod:`.conventions` holds KubeSpawner's and z2jh's names. Importing this package
imports KubeSpawner.

The names below are public for deployments and must keep working: the entry point
``gpu-kube`` is ``spawner.kube:GPUKubeSpawner``, and the Zero to JupyterHub overlay
(``helm/values-jupyterhub.yaml``) runs ``from spawner.kube import qualified_hub_connect_url``.
"""

from .conventions import (
    expand_user_template,
    privileged_containers,
    qualified_hub_connect_url,
    quota_refusal_message,
    user_template_fields,
)
from .informer import GPUPodInformer
from .ledger import GPUPodReflector, workload_from_pod
from .spawner import GPUKubeSpawner

__all__ = [
    "GPUKubeSpawner",
    "GPUPodInformer",
    "GPUPodReflector",
    "expand_user_template",
    "privileged_containers",
    "qualified_hub_connect_url",
    "quota_refusal_message",
    "user_template_fields",
    "workload_from_pod",
]
