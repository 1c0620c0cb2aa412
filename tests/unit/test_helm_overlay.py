"""The z2jh overlay (helm/values-jupyterhub.yaml) and the image Dockerfiles.

The overlay is read the way Zero to JupyterHub's jupyterhub_config.py reads
it and its extraConfig is run against a real traitlets Config; the images'
Dockerfiles are checked by building the gpulab wheel from exactly the files
they copy (no container runtime is needed).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

from hub_config.config import scopes as hub_scopes
from tests.kube.bed import z2jh_hub_config as z2jh
from tests.kube.bed.z2jh_hub_config import z2jh_config
from tests.support import REPO
from tests.support.helm import chart_values, of_kind, render

OVERLAY = REPO / "helm" / "values-jupyterhub.yaml"


# --------------------------------------------------------------------------
# the z2jh overlay


def overlay() -> dict:
    return yaml.safe_load(OVERLAY.read_text())


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_overlay_mounts_the_catalog_the_chart_renders():
    values = overlay()
    chart = chart_values()
    hub = values["hub"]
    (vol,) = [v for v in hub["extraVolumes"] if v["name"] == "gpulab-catalog"]
    assert vol["configMap"]["name"] == chart["catalog"]["configMapName"]
    (mount,) = [m for m in hub["extraVolumeMounts"] if m["name"] == "gpulab-catalog"]
    cm = next(d for d in of_kind(render("default"), "ConfigMap") if d["metadata"]["name"] == "gpulab-catalog")
    (key,) = cm["data"]
    assert hub["config"]["GPULab"]["catalog_file"] == f"{mount['mountPath']}/{key}"
    assert "profileList" not in values["singleuser"], "the spawner builds profiles from the catalog"
    assert values["scheduling"]["podPriority"]["enabled"] is False


def test_overlay_spawner_class_is_gpu_kube_spawner():
    hub = overlay()["hub"]
    name = hub["config"]["JupyterHub"]["spawner_class"]
    assert f'c.JupyterHub.spawner_class = "{name}"' in hub["extraConfig"]["gpulab"], "extraConfig agrees"
    target = pyproject()["project"]["entry-points"]["jupyterhub.spawners"][name]
    module, _, cls = target.partition(":")
    from kubespawner import KubeSpawner

    spawner_cls = getattr(__import__(module, fromlist=[cls]), cls)
    assert issubclass(spawner_cls, KubeSpawner) and spawner_cls.__name__ == "GPUKubeSpawner"


#: The JupyterHub major version in z2jh's k8s-hub image, by z2jh major version (z2jh's
#: CHANGELOG: 3.x ships JupyterHub 4, 4.x ships JupyterHub 5).
Z2JH_JUPYTERHUB_MAJOR = {"3": 4, "4": 5}


def test_overlay_upgrades_the_hub_database_when_the_image_brings_a_newer_jupyterhub():
    """The gpulab hub image installs gpulab's JupyterHub over z2jh's image; a newer major
    version has a newer database schema, and JupyterHub refuses an older database unless
    it runs with --upgrade-db (z2jh's hub.db.upgrade)."""
    dockerfile = (REPO / "helm" / "images" / "hub" / "Dockerfile").read_text()
    z2jh = re.search(r"ARG Z2JH_HUB_IMAGE=quay.io/jupyterhub/k8s-hub:(\d+)\.", dockerfile).group(1)
    needed = next(d for d in pyproject()["project"]["dependencies"] if d.startswith("jupyterhub>="))
    gpulab_major = int(re.match(r"jupyterhub>=(\d+)", needed).group(1))
    assert gpulab_major > Z2JH_JUPYTERHUB_MAJOR[z2jh]  # the case this guards
    assert overlay()["hub"]["db"]["upgrade"] is True


def test_overlay_scopes_and_culler_service(tmp_path, monkeypatch):
    """Run the overlay's extraConfig as z2jh's jupyterhub_config.py would, at config-load time."""
    from jupyterhub.scopes import scope_definitions

    c = z2jh_config(tmp_path, monkeypatch)
    custom = c.JupyterHub.custom_scopes
    assert {hub_scopes.JOBS, hub_scopes.ADMIN, hub_scopes.CULLER} <= set(custom)
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    for role in roles.values():
        for scope in role["scopes"]:
            base = scope.split("!", 1)[0]
            assert base in scope_definitions or base in custom, f"role {role['name']}: unknown scope {scope}"
    assert hub_scopes.JOBS + "!user" in roles["user"]["scopes"]
    assert hub_scopes.ADMIN in roles["gpulab-admin"]["scopes"]
    assert roles["gpulab-admin"]["groups"] == ["gpulab-admins"]
    culler = roles["gpulab-idle-culler"]
    # hub_scopes' list, less access:servers (single-server kernel shutdown only).
    assert set(culler["scopes"]) == set(hub_scopes.CULLER_SERVICE_SCOPES) - {"access:servers"}
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert culler["services"] == ["gpulab-idle-culler"] and "gpulab-idle-culler" in services
    command = services["gpulab-idle-culler"]["command"]
    assert command[0] in pyproject()["project"].get("scripts", {}), (
        f"the culler command {command[0]!r} is not a console script in pyproject.toml"
    )
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in command[1:])
    assert {"url", "cull-every", "concurrency"} <= set(flags), "jupyterhub-idle-culler's flags"
    from idle_culler.app import GPUIdleCuller

    assert set(flags) <= set(GPUIdleCuller.aliases), f"unknown culler flags: {set(flags) - set(GPUIdleCuller.aliases)}"
    assert flags["url"] == "http://localhost:8081/hub/api"


def test_overlay_exposes_the_culler_metrics_the_chart_scrapes():
    values = overlay()
    hub = values["hub"]
    command = hub["services"]["gpulab-idle-culler"]["command"]
    metrics_url = next(a.split("=", 1)[1] for a in command if a.startswith("--metrics-url="))
    port = int(metrics_url.rsplit(":", 1)[1])
    monitor = chart_values()["monitoring"]["cullerMetrics"]
    (extra,) = [p for p in hub["service"]["extraPorts"] if p["name"] == monitor["port"]]
    assert extra["targetPort"] == port
    assert any({"port": port} in rule["ports"] for rule in hub["networkPolicy"]["ingress"])


def test_servers_in_team_namespaces_reach_the_hub(tmp_path, monkeypatch):
    """z2jh sets hub_connect_url to http://hub:8081 (its jupyterhub_config.py); the
    overlay, which runs after it, makes it resolvable from the team namespaces."""
    c = z2jh_config(tmp_path, monkeypatch)
    assert c.JupyterHub.hub_connect_url == "http://hub.jhub.svc.cluster.local:8081"
    # The team namespaces' NetworkPolicy lets servers reach exactly that hub pod and port.
    (np,) = [d for d in of_kind(render("default"), "NetworkPolicy") if d["metadata"]["namespace"] == "gpulab-vision"]
    hub_rule = next(r for r in np["spec"]["egress"] if r.get("ports") == [{"port": 8081}])
    assert hub_rule["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "jhub"}


# --------------------------------------------------------------------------
# z2jh's hub config and GPUKubeSpawner's profile list


def kube_spawner(c, tmp_path: Path, monkeypatch, user: str = "alice"):
    """A GPUKubeSpawner built from ``c`` as the hub builds one; its kubeconfig names an
    address nothing listens on (nothing here talks to a cluster)."""
    from unittest import mock

    from spawner.kube import GPUKubeSpawner
    from tests.support.kube_spawner import kubeconfig_to_nowhere

    kubeconfig_to_nowhere(tmp_path, monkeypatch)
    hub_user = mock.Mock(groups=[], url=f"/user/{user}/")
    hub_user.name = user
    return GPUKubeSpawner(config=c, user=hub_user, hub=mock.Mock(), _mock=True)


def test_z2jh_applies_singleuser_values_to_kubespawner(tmp_path, monkeypatch):
    """The facts of z2jh's hub config that gpulab depends on, with its defaults and the overlay."""
    c = z2jh_config(tmp_path, monkeypatch)
    assert c.KubeSpawner.profile_list == []  # the chart's default, set because it is not null
    assert c.KubeSpawner.scheduler_name == "jhub-user-scheduler"
    assert c.KubeSpawner.image == "registry.example.com/gpulab/singleuser:0.2.0"
    assert c.KubeSpawner.start_timeout == 600
    assert c.KubeSpawner.init_containers == []  # blockWithIptables off: no privileged container
    assert c.KubeSpawner.extra_labels == {"hub.jupyter.org/network-access-hub": "true"}
    assert c.KubeSpawner.storage_pvc_ensure is True and c.KubeSpawner.namespace == "jhub"
    assert "priority_class_name" not in c.KubeSpawner  # podPriority off
    assert c.JupyterHub.spawner_class == "gpu-kube"  # hub.config, then extraConfig
    assert c.GPULab.catalog_file == "/usr/local/etc/gpulab/catalog.yaml"
    names = [s["name"] for s in c.JupyterHub.services]
    # gpulab-queue: the queue runner's token holder (no process), declared by configure_gpulab
    assert names == ["jupyterhub-idle-culler", "gpulab-idle-culler", "gpulab-queue"]
    assert all(len(s["api_token"]) == 64 for s in c.JupyterHub.services if s["name"] == "gpulab-idle-culler")


@pytest.mark.parametrize("profile_list", ["absent", [], {}])
async def test_gpu_kube_spawner_builds_the_form_whatever_empty_profile_list_z2jh_sets(
    tmp_path, monkeypatch, profile_list
):
    """z2jh sets c.KubeSpawner.profile_list = [] on every hub; config on the parent class
    overrode GPUKubeSpawner's own default, so the spawn page had no form and every spawn
    was refused with "choose a profile"."""
    c = z2jh_config(tmp_path, monkeypatch)
    if profile_list == "absent":
        del c.KubeSpawner["profile_list"]
    else:
        c.KubeSpawner.profile_list = profile_list
    spawner = kube_spawner(c, tmp_path, monkeypatch)
    assert spawner.profile_list == spawner._gpulab_profile_list
    # KubeSpawner renders the form from a callable profile list, per user, at request time.
    assert spawner.options_form == spawner._render_options_form_dynamically


def test_a_z2jh_profile_list_makes_the_hub_refuse_to_start_saying_what_to_remove(tmp_path, monkeypatch):
    from hub_config.config.setup import SpawnerConfigError

    site = {"singleuser": {"profileList": [{"display_name": "Small", "slug": "small"}]}}
    with pytest.raises(SpawnerConfigError) as refused:
        z2jh_config(tmp_path, monkeypatch, site)
    message = str(refused.value)
    assert message.startswith("gpulab: refusing to start: GPUKubeSpawner builds the spawn form from the gpulab catalog")
    assert "a list of 1 profile(s)" in message and "Remove singleuser.profileList" in message


def test_gpulab_s_database_lives_beside_the_hub_s_on_z2jh_s_sqlite_pvc(tmp_path, monkeypatch):
    """z2jh's default hub.db.type sqlite-pvc: the hub's database is jupyterhub.sqlite in
    /srv/jupyterhub, the hub's volume (the working directory z2jh runs the hub in), and
    gpulab's goes beside it, not into a folder a restart throws away."""
    c = z2jh_config(tmp_path, monkeypatch)
    assert c.JupyterHub.db_url == "sqlite:///jupyterhub.sqlite"
    assert c.GPULabDB.db_url == "sqlite:///gpulab.sqlite"


@pytest.mark.parametrize(
    "db, kind",
    [
        ({"type": "postgres", "url": "postgresql+psycopg2://jhub@db.example.org:5432/jupyterhub"}, "on postgresql"),
        ({"type": "mysql", "url": "mysql+pymysql://jhub@db.example.org:3306/jupyterhub"}, "on mysql"),
        ({"type": "sqlite-memory"}, "in memory"),
    ],
)
def test_any_other_hub_database_refuses_to_start_without_a_gpulab_database(tmp_path, monkeypatch, db, kind):
    from hub_config.config.setup import SpawnerConfigError

    with pytest.raises(SpawnerConfigError) as refused:
        z2jh_config(tmp_path, monkeypatch, {"hub": {"db": db}})
    message = str(refused.value)
    assert message.startswith(f"gpulab: refusing to start: the hub's database is {kind}")
    assert "Set hub.config.GPULabDB.db_url" in message and "hub.db.type: sqlite-pvc" in message
    # The admin's own choice is kept as it is.
    own = "postgresql+psycopg2://gpulab@db.example.org:5432/gpulab"
    c = z2jh_config(tmp_path / "own", monkeypatch, {"hub": {"db": db, "config": {"GPULabDB": {"db_url": own}}}})
    assert c.GPULabDB.db_url == own


async def test_a_profile_list_set_after_gpulab_s_config_is_refused_by_the_spawner(tmp_path, monkeypatch):
    """An extraConfig that runs after the overlay's, or a profile_list on GPUKubeSpawner itself."""
    from traitlets import TraitError

    c = z2jh_config(tmp_path, monkeypatch)
    c.GPUKubeSpawner.profile_list = [{"display_name": "Small", "slug": "small"}]
    with pytest.raises(TraitError, match="Remove singleuser.profileList"):
        kube_spawner(c, tmp_path, monkeypatch)


def test_z2jh_user_scheduler_scores_every_gpu_resource_gpulab_requests():
    """z2jh's MostAllocated scoring counts cpu and memory; the overlay adds every GPU
    resource a whole, time-sliced or MIG pod of gpulab's can request, so GPU pods pack."""
    from spawner.core.catalog import catalog_from_dict
    from spawner.core.sharing import DEFAULT_MIG_PROFILES, mig_table, pod_gpu_spec

    config = z2jh.user_scheduler_config(z2jh.RELEASE, "jhub", z2jh.release_values())
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "jhub-user-scheduler"
    assert profile["plugins"] == z2jh.chart_defaults()[1]["scheduling"]["userScheduler"]["plugins"]
    (fit,) = [p for p in profile["pluginConfig"] if p["name"] == "NodeResourcesFit"]
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights["cpu"] == weights["memory"] == 1
    profiles = [
        {"slug": "whole-1", "gpus": 1, "gpu_model": "H100-80GB", "sharing": "whole"},
        {"slug": "ts", "gpus": 0.25, "gpu_model": "H100-80GB", "sharing": "timeslice"},
    ]
    catalog = catalog_from_dict({"profiles": profiles, "teams": [{"name": "t", "guarantee": 1}]}, "test")
    requested = {r for p in catalog.profiles.values() for r in pod_gpu_spec(p, catalog.sharing).limits}
    # Every MIG slice of the built-in tables, by the resource name the mig backend requests.
    requested |= {s.resource for model in DEFAULT_MIG_PROFILES for s in mig_table(model)}
    requested -= {"cpu", "memory"}
    assert requested and requested <= {k for k, w in weights.items() if w == 10}, requested - set(weights)


def test_overlay_leaves_hami_no_privileged_container_and_blocks_metadata_by_policy():
    """HAMi's webhook denies GPU pods with a privileged container (init containers
    included); z2jh's iptables metadata block is one. The overlay turns it off, and
    the chart's per-namespace NetworkPolicy blocks the metadata server instead."""
    values = overlay()
    assert values["singleuser"]["cloudMetadata"]["blockWithIptables"] is False
    for np in of_kind(render("default"), "NetworkPolicy"):
        for rule in np["spec"]["egress"]:
            for peer in rule.get("to", []):
                block = peer.get("ipBlock")
                if block and block["cidr"] == "0.0.0.0/0":
                    assert "169.254.169.254/32" in block["except"]


def test_prepuller_values_cover_every_catalog_image(tmp_path, capsys):
    from hub_config.cli import main

    values = tmp_path / "my-gpulab.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "gpulab": {
                    "profiles": [
                        {
                            "slug": "h100-1",
                            "gpus": 1,
                            "gpu_model": "H100-80GB",
                            "images": [
                                {"slug": "torch", "image": "registry.example.com:5000/ml/torch-notebook:2.4"},
                                {"slug": "base", "image": "quay.io/jupyter/base-notebook"},
                            ],
                        },
                        {"slug": "cpu", "gpus": 0},
                    ],
                    "teams": [{"name": "vision", "guarantee": 1}],
                }
            }
        )
    )
    assert main(["prepuller-values", str(values)]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out == {
        "prePuller": {
            "extraImages": {
                "h100-1-torch": {"name": "registry.example.com:5000/ml/torch-notebook", "tag": "2.4"},
                "h100-1-base": {"name": "quay.io/jupyter/base-notebook", "tag": "latest"},
            }
        }
    }
    # The overlay leaves the list to that command, and z2jh's own prePuller stays on.
    assert overlay()["prePuller"]["extraImages"] == {}


# --------------------------------------------------------------------------
# the images


def dockerfile_copies(path: Path) -> list[str]:
    sources = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            sources += [p for p in parts[1:-1] if not p.startswith("--")]
    return sources


@pytest.mark.parametrize("image,extra", [("hub", "kubernetes"), ("singleuser", "lab")])
def test_image_builds_gpulab_from_what_it_copies(image, extra, tmp_path):
    """Build the gpulab wheel from exactly the files the Dockerfile copies."""
    dockerfile = REPO / "helm" / "images" / image / "Dockerfile"
    text = dockerfile.read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    bases = re.findall(r"^FROM (\S+)", text, re.M)
    assert bases[-1].strip("${}") in args, "the final base image is a build ARG with a default"
    assert f'"/tmp/gpulab[{extra}]"' in text
    deps = pyproject()["project"]["optional-dependencies"][extra]
    if extra == "lab":
        assert any(d.startswith("papermill") for d in deps)
        assert "jupyter server extension enable --sys-prefix labextension" in text
    else:
        assert any(d.startswith("jupyterhub-kubespawner") for d in deps)
    ignore = (dockerfile.parent / "Dockerfile.dockerignore").read_text().splitlines()
    context = tmp_path / "ctx"
    context.mkdir()
    copied = dockerfile_copies(dockerfile)
    if image == "singleuser":
        copied.append("labextension")  # COPY --from=lab: the same folder, built
    for src in dict.fromkeys(copied):
        assert (REPO / src).exists(), f"{image}/Dockerfile copies {src}, which is not in the repository"
        assert f"!{src}" in ignore or f"!{src}/**" in ignore, f"{src} is excluded from the build context"
        if (REPO / src).is_dir():
            shutil.copytree(
                REPO / src, context / src, ignore=shutil.ignore_patterns("node_modules", "__pycache__", "*.pyc")
            )
        else:
            shutil.copy(REPO / src, context / src)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("gpulab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "spawner/kube/spawner.py",
        "hub_config/config/setup.py",
        "labextension/__init__.py",
        # the database migrations run at the hub's start: every file Alembic reads
        "hub_config/storage/migrations/env.py",
        "hub_config/storage/migrations/script.py.mako",
        "hub_config/storage/migrations/versions/0001_release_0_1_0.py",
    } <= names
