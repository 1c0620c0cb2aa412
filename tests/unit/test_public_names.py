"""The names deployments hold on to keep working, whatever the package layout behind them.

The entry points (``gpu-local``, ``gpu-kube``, ``gpu-simple-local``, ``gpulab-launch``), the
import strings JupyterHub configs name (``spawner.local.GPULocalSpawner``, traitlets'
``import_item`` form), the Zero to JupyterHub overlay's ``from spawner.kube import
qualified_hub_connect_url``, and the configurable class names ``c.GPULab`` / ``c.UserAccounts``.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from traitlets.utils.importstring import import_item

from tests.support import REPO

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.mark.parametrize("name", ["gpu-local", "gpu-kube", "gpu-simple-local"])
def test_each_spawner_entry_point_loads_its_class(name: str):
    from jupyterhub.spawner import Spawner

    target = PYPROJECT["project"]["entry-points"]["jupyterhub.spawners"][name]
    (installed,) = [e for e in entry_points(group="jupyterhub.spawners") if e.name == name]
    assert installed.value == target, "the installed metadata is stale: pip install -e ."
    cls = installed.load()
    assert issubclass(cls, Spawner) and cls.__name__ == target.partition(":")[2]
    assert import_item(target.replace(":", ".")) is cls  # the import-string form configs use


def test_the_launcher_entry_point_is_the_mediator():
    target = PYPROJECT["project"]["scripts"]["gpulab-launch"]
    module, _, func = target.partition(":")
    from spawner.local import mediator

    assert module == mediator.__name__ and callable(getattr(mediator, func))


def test_the_overlay_import_and_the_public_kube_names():
    overlay = (REPO / "helm" / "values-jupyterhub.yaml").read_text()
    assert "from spawner.kube import qualified_hub_connect_url" in overlay
    import spawner.kube

    for name in spawner.kube.__all__:
        assert getattr(spawner.kube, name) is not None
    assert spawner.kube.GPUKubeSpawner is import_item("spawner.kube.GPUKubeSpawner")


def test_the_configurable_class_names_stay():
    from spawner.local.accounts import UserAccounts
    from spawner.runtime import GPULab

    assert GPULab.__name__ == "GPULab" and UserAccounts.__name__ == "UserAccounts"


def test_the_public_local_names_resolve_and_unknown_ones_do_not():
    import spawner.local

    for name in spawner.local.__all__:
        assert getattr(spawner.local, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'GPUKubeSpawner'"):
        spawner.local.GPUKubeSpawner  # noqa: B018


@pytest.mark.parametrize("module", ["spawner.local.mediator", "spawner.local.nvml", "spawner.local", "spawner.runtime"])
def test_the_mediator_and_nvml_import_no_hub(module: str):
    """sudo runs the mediator for every request a non-root hub makes, and the culler and the
    lab server use the NVML adapter: none of them may pay for importing JupyterHub or tornado."""
    code = (
        f"import sys, {module}\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('jupyterhub', 'tornado', 'kubespawner'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == ""
