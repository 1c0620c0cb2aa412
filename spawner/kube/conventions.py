"""What KubeSpawner, Zero to JupyterHub and HAMi expect of names, URLs and pods.

Small rules from upstream, in one place: the names KubeSpawner gives a
user's objects (its ``safe`` slug scheme), the hub URL a server in another
namespace can resolve, and the privileged containers HAMi refuses.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kubespawner.slugs import escape_slug, multi_slug, safe_slug

#: KubeSpawner's _slug_max_length for each name part (kubespawner 7).
_SLUG_MAX_LENGTH = 48


def user_template_fields(user_name: str, hub_namespace: str = "") -> dict[str, str]:
    """The fields KubeSpawner (slug_scheme "safe") fills in its name templates, for
    a user's default server: ``{username}`` and ``{user_server}`` are its safe
    slug (``jo_smith`` -> ``jo-smith--<hash>``), valid in any DNS name.

    The jobs backend names the user's home claim with these, exactly as
    KubeSpawner named it (``pvc_name_template``); tests compare both.
    """
    safe = safe_slug(user_name, max_length=_SLUG_MAX_LENGTH)
    # KubeSpawner slugs user and server name together when the joined safe
    # slugs ("user--server") would pass the limit, even for an empty server name.
    user_server = multi_slug([user_name, ""], max_length=_SLUG_MAX_LENGTH) if len(safe) + 2 > _SLUG_MAX_LENGTH else safe
    escaped = escape_slug(user_name)
    return {
        "username": safe,
        "safe_username": safe,
        "user_server": user_server,
        "safe_user_server": user_server,
        "servername": "",
        "safe_servername": "",
        "unescaped_username": user_name,
        "unescaped_servername": "",
        "escaped_username": escaped,
        "escaped_servername": "",
        "escaped_user_server": f"{escaped}--",
        "hubnamespace": hub_namespace,
    }


def expand_user_template(template: str, user_name: str, hub_namespace: str = "") -> str:
    """KubeSpawner's expansion of a name template (``claim-{user_server}``) for a default server."""
    try:
        rendered = template.format(**user_template_fields(user_name, hub_namespace))
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"template {template!r} uses a field gpulab cannot fill for jobs ({e}); use {{username}} or {{user_server}}"
        ) from None
    # KubeSpawner strips the "-" an empty server name leaves at the end.
    return rendered if template.endswith("-") else rendered.rstrip("-")


def qualified_hub_connect_url(url: str, hub_namespace: str, cluster_domain: str = "cluster.local") -> str:
    """``http://hub:8081`` -> ``http://hub.<hub namespace>.svc.cluster.local:8081``.

    z2jh points servers at the hub's Service by its short name, which only
    resolves inside the hub's own namespace; servers in team namespaces need
    its full DNS name (the form of KubeSpawner's own ``dns_name_template``).
    A URL whose host already has a dot, or an IP address, is returned as is.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host or "." in host or ":" in host:
        return url
    netloc = f"{host}.{hub_namespace}.svc.{cluster_domain}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def profile_list_conflict(value: Any) -> str | None:
    """Why a configured ``KubeSpawner.profile_list`` cannot be used with GPUKubeSpawner, or None.

    Zero to JupyterHub applies every ``singleuser.*`` value that is not null to
    ``c.KubeSpawner`` (its hub config's ``set_config_if_not_none``), and its own
    default for ``singleuser.profileList`` is ``[]``: so ``c.KubeSpawner.profile_list = []``
    is set on every z2jh hub, and config on the parent class overrides
    GPUKubeSpawner's own default. An empty list or dict means "not set"; any other
    value would replace the catalog's profiles, quotas and availability.
    """
    if value is None or (isinstance(value, (list, tuple, dict)) and not value):
        return None
    what = f"a list of {len(value)} profile(s)" if isinstance(value, (list, tuple, dict)) else f"{value!r}"
    return (
        f"GPUKubeSpawner builds the spawn form from the gpulab catalog (teams, quotas, availability), "
        f"but the hub config sets c.KubeSpawner.profile_list to {what}. Remove singleuser.profileList "
        f"from your Zero to JupyterHub values (or the profile_list line of your hub config), and put "
        f"the profiles in the gpulab chart's gpulab.profiles instead."
    )


def privileged_containers(containers: list) -> list[str]:
    """Names of the privileged containers in a list of container dicts (or V1Container)."""
    out = []
    for c in containers or []:
        get = c.get if isinstance(c, dict) else (lambda k, _c=c: getattr(_c, k, None))
        sc = get("securityContext") or get("security_context") or {}
        privileged = sc.get("privileged") if isinstance(sc, dict) else getattr(sc, "privileged", None)
        if privileged:
            out.append(str(get("name") or "?"))
    return out


def prepuller_extra_images(catalog: Any) -> dict[str, dict[str, str]]:
    """z2jh's ``prePuller.extraImages`` for every image a catalog profile offers.

    z2jh pulls each onto every node before users ask (its hook and continuous
    pre-pullers run ``image-pull-<key>`` init containers with
    ``<name>:<tag>``), so a profile's first start does not wait for a
    multi-gigabyte pull. Keys are ``<profile>-<image slug>``.
    """
    out: dict[str, dict[str, str]] = {}
    for profile in catalog.profiles.values():
        for choice in profile.images:
            ref = choice.image
            if "@" in ref:
                raise ValueError(
                    f"profile {profile.slug}: image {ref!r} is pinned by digest; z2jh's "
                    f"prePuller.extraImages takes name and tag only"
                )
            name, tag = ref, "latest"
            slash, colon = ref.rfind("/"), ref.rfind(":")
            if colon > slash:
                name, tag = ref[:colon], ref[colon + 1 :]
            out[f"{profile.slug}-{choice.slug}"] = {"name": name, "tag": tag}
    return out


__all__ = [
    "expand_user_template",
    "prepuller_extra_images",
    "privileged_containers",
    "profile_list_conflict",
    "qualified_hub_connect_url",
    "user_template_fields",
]


# -- the API server's refusals, in words ---------------------------------------------

_QUOTA_RE = re.compile(r"exceeded quota: ([^,]+), requested: (.+?), used: (.+?), limited: (.+)$")


def api_refusal(namespace: str, api_message: str) -> tuple[str, str]:
    """The API server's 403 for a server's pod as ``(sentence for the spawn page, reason)``:
    a ResourceQuota, Pod Security admission, or anything else the cluster refused."""
    if _QUOTA_RE.search(api_message):
        return quota_refusal_message(namespace, api_message), "resource-quota"
    if "violates PodSecurity" in api_message:
        sentence = (
            f"The cluster's Pod Security admission refused the server in namespace {namespace}: "
            f"{api_message}. An admin must change the server's pod or the namespace's "
            "pod-security.kubernetes.io/enforce label (the gpulab chart's teamNamespaces.podSecurity)."
        )
        if "block-cloud-metadata" in api_message:  # z2jh's privileged iptables init container
            sentence += (
                " This one is Zero to JupyterHub's block-cloud-metadata init container: set "
                "singleuser.cloudMetadata.blockWithIptables=false (the gpulab chart's NetworkPolicy "
                "blocks the metadata server instead)."
            )
        return sentence, "pod-security"
    return f"The cluster refused to create the server in namespace {namespace}: {api_message}", "forbidden"


def node_rejection_sentence(pod: dict[str, Any]) -> str | None:
    """The words for a server pod its node turned away at admission, else ``None``.

    A kubelet admits a bound pod only if the node can serve it; otherwise the pod goes to
    phase ``Failed`` with a reason such as ``OutOfnvidia.com/gpu`` or
    ``UnexpectedAdmissionError`` (kubelet ``lifecycle.PodAdmitResult``), as when two
    schedulers bind pods to the last free GPU at once. Nothing retries a bare pod, so
    KubeSpawner would wait its whole ``start_timeout`` for a pod that will never run."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    node = (pod.get("spec") or {}).get("nodeName") or "its node"
    reason = status.get("reason") or "rejected"
    message = (status.get("message") or "").strip().rstrip(".")
    detail = f"{reason}: {message}" if message else reason
    return (
        f"The node {node} turned your server away when it arrived ({detail}): another workload "
        f"took what the scheduler had counted on. Start it again; the scheduler places it anew."
    )


def unreachable_sentence(error: BaseException | str) -> str:
    """A spawn that lost the Kubernetes API server (restarting, its connection cut, or a 5xx
    answer such as "apiserver is shutting down") in words for the spawn page: KubeSpawner retries only timeouts, so the start ends here, and
    JupyterHub's stop after a failed start deletes a pod the API server may have stored."""
    cause = re.sub(r"\[Errno \d+\]\s*", "", str(error)).strip() or "the connection closed"
    return (
        f"The hub lost its connection to the cluster's API server while starting your server "
        f"({cause}). Try again in a minute; if this repeats, "
        f"ask an admin to check the Kubernetes control plane."
    )


def quota_refusal_message(namespace: str, api_message: str) -> str:
    """Turn the API server's ResourceQuota 403 into a sentence for the spawn page."""
    m = _QUOTA_RE.search(api_message)
    if not m:
        return f"The cluster refused to create the server in namespace {namespace}: {api_message}"
    name, requested, used, limited = (s.strip() for s in m.groups())
    return (
        f"The cluster refused the server: namespace {namespace} is at its ResourceQuota "
        f"'{name}' (in use: {used}; limit: {limited}; this server asks for {requested}). "
        f"Stop another server in your team or ask an admin to raise the quota."
    )
