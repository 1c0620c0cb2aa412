"""Jobs get what the hub's KubeSpawner config gives every server (spawner/core/servers_pod.py)
and the job backend reads it as z2jh writes it (hub_config/jobs/backends/kube.py)."""

from __future__ import annotations

import kubernetes_validate

from hub_config.jobs.backends.kube import expand_for_user, servers_home_volume
from spawner.core import jobspec
from spawner.core.servers_pod import apply_servers_pod_settings, camel_case, servers_pod_settings
from tests.support.job_requests import request

# z2jh's singleuser.storage.type dynamic, as its hub config writes c.KubeSpawner (volume
# name and claim templated), plus extraVolumes / extraVolumeMounts and extraFiles.
Z2JH_VOLUMES = [
    {"name": "volume-{username}{servername}", "persistentVolumeClaim": {"claimName": "{pvc_name}"}},
    {"name": "datasets", "persistentVolumeClaim": {"claimName": "datasets-ro"}},
    {"name": "files", "secret": {"secretName": "singleuser", "items": [{"key": "a.py", "path": "a.py"}]}},
]
Z2JH_MOUNTS = [
    {"name": "volume-{username}{servername}", "mountPath": "/home/jovyan"},
    {"name": "datasets", "mountPath": "/data", "readOnly": True},
    {"name": "files", "mountPath": "/etc/gpulab/a.py", "subPath": "a.py"},
    {"name": "not-a-volume", "mountPath": "/nowhere"},
]


def test_the_home_is_found_by_its_template_name_and_the_rest_expanded_for_the_user():
    home = servers_home_volume(Z2JH_VOLUMES, Z2JH_MOUNTS, "/home/jovyan")
    assert home == ("volume-{username}{servername}", "{pvc_name}", "/home/jovyan", "")
    rest = [v for v in Z2JH_VOLUMES if v["name"] != home[0]]
    expanded = expand_for_user(
        [{"name": "scratch-{username}", "emptyDir": {}}, *rest], "jo_smith", "jhub", "claim-jo-5fsmith"
    )
    assert expanded[0]["name"].startswith("scratch-jo-")  # KubeSpawner's safe slug
    assert expanded[1:] == rest, "strings without a template stay as written"
    assert expand_for_user({"claimName": "{pvc_name}"}, "carol", "jhub", "claim-carol") == {"claimName": "claim-carol"}


def test_a_jobs_pod_gets_the_servers_volumes_selector_and_pod_config_but_not_what_a_job_owns():
    settings = servers_pod_settings(
        Z2JH_VOLUMES[1:],
        Z2JH_MOUNTS[1:],
        {"gpulab.io/pool": "mig", "nvidia.com/gpu.product": "ignored"},
        {
            "dns_policy": "ClusterFirst",
            "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["data"]}],
            "restartPolicy": "Always",
        },
    )
    assert [m["name"] for m in settings.volume_mounts] == ["datasets", "files"], "a mount of no volume is dropped"
    job = jobspec.kube_job_manifest(request("h100-2", servers_pod=settings))
    kubernetes_validate.validate(job, kubernetes_validate.latest_version(), strict=True)
    pod = job["spec"]["template"]["spec"]
    names = [v["name"] for v in pod["volumes"]]
    assert names == ["home", "gpulab-shm", "datasets", "files"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True and mounts["/etc/gpulab/a.py"]["subPath"] == "a.py"
    # The GPU share's selector wins over the servers', as GPUKubeSpawner merges them.
    assert pod["nodeSelector"]["gpulab.io/pool"] == "mig"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] != "ignored"
    assert pod["dnsPolicy"] == "ClusterFirst" and pod["hostAliases"][0]["hostnames"] == ["data"]
    assert pod["restartPolicy"] == "Never"


def test_a_servers_volume_named_like_the_jobs_own_is_left_out():
    settings = servers_pod_settings(
        [{"name": "home", "emptyDir": {}}, {"name": "gpulab-shm", "emptyDir": {}}],
        [{"name": "home", "mountPath": "/elsewhere"}],
        {},
        {"containers": [], "priorityClassName": "system-node-critical"},
    )
    pod: dict = {"volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "c"}}]}
    container: dict = {"volumeMounts": [{"name": "home", "mountPath": "/home/jovyan"}]}
    skipped = apply_servers_pod_settings(pod, container, settings)
    assert pod["volumes"] == [{"name": "home", "persistentVolumeClaim": {"claimName": "c"}}]
    assert container["volumeMounts"] == [{"name": "home", "mountPath": "/home/jovyan"}]
    assert "containers" not in pod and "priorityClassName" not in pod
    assert len(skipped) == 4, skipped


def test_camel_case_is_kubespawners():
    assert camel_case("dns_policy") == "dnsPolicy"
    assert camel_case("hostAliases") == "hostAliases"
    assert camel_case("termination_grace_period_seconds") == "terminationGracePeriodSeconds"


def test_settings_zero_to_jupyterhub_only_appends_to_are_read_as_the_trait_would_be():
    """z2jh's hub config appends to KubeSpawner's lists and updates its dicts on a fresh
    config (``c.KubeSpawner.tolerations.append``): traitlets keeps those as LazyConfigValue."""
    from traitlets.config import Config

    from hub_config.jobs.backends.base import config_value

    c = Config()
    c.KubeSpawner.tolerations.append({"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user"})
    c.KubeSpawner.node_selector.update({"pool": "users"})
    assert config_value(c, "KubeSpawner", "tolerations") == [
        {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user"}
    ]
    assert config_value(c, "KubeSpawner", "node_selector") == {"pool": "users"}
    assert config_value(c, "KubeSpawner", "volumes") is None
