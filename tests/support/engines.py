"""The training engines' own release files (CRDs, runtimes), read from the Go module cache.

The versions are the ones ``scripts/build-trainer.sh`` and ``scripts/build-jobset.sh`` build
for the test bed (their defaults, read from the scripts: one place). ``go mod download``
fetches a release into the module cache once (from the module proxy) and prints where it is.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from tests.support import REPO

TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"


def built_version(script: str, variable: str) -> str:
    """The default version ``scripts/<script>`` builds (``${<variable>:-vX.Y.Z}``)."""
    text = (REPO / "scripts" / script).read_text()
    found = re.search(rf"\${{{variable}:-(v[0-9][0-9A-Za-z.\-]*)}}", text)
    assert found, f"scripts/{script} names no default for {variable}"
    return found.group(1)


def release_file(module: str, version: str, path: str) -> Path:
    """``path`` inside the release ``module@version`` (downloaded into the Go module cache if needed)."""
    try:
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except FileNotFoundError:
        raise AssertionError("Go is not installed: the engines' CRDs come from their Go modules") from None
    if out.returncode != 0:
        raise AssertionError(f"go mod download {module}@{version} failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    found = Path(json.loads(out.stdout)["Dir"]) / path
    assert found.is_file(), f"{module}@{version} has no {path}"
    return found


def crd_schema(module: str, version: str, path: str, served: str) -> dict:
    """The ``openAPIV3Schema`` of the CRD in ``path`` for its API version ``served``."""
    crd = yaml.safe_load(release_file(module, version, path).read_text())
    for v in crd["spec"]["versions"]:
        if v["name"] == served:
            return v["schema"]["openAPIV3Schema"]
    raise AssertionError(f"{path} of {module}@{version} serves no {served}")


def unknown_fields(obj: object, schema: dict, at: str = "") -> list[str]:
    """Fields of ``obj`` that ``schema`` does not declare (the API server would prune them
    silently): what a plain JSON-schema check of a CRD misses."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                found += unknown_fields(value, props[key], f"{at}.{key}")
            elif isinstance(extra, dict):
                found += unknown_fields(value, extra, f"{at}.{key}")
            elif props is not None or extra is False:
                found.append(f"{at}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            found += unknown_fields(value, schema["items"], f"{at}[{i}]")
    return found
