"""Labels that make running work countable: one place for their keys.

Every pod or Job gpulab creates carries these labels; the ledger is rebuilt
from them (``workload_from_labels``). Label values follow Kubernetes rules
(63 characters, ``[A-Za-z0-9._-]``, alphanumeric at both ends), so user names
are escaped the way KubeSpawner escapes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .ledger import RUNNING, Workload

PREFIX = "gpulab.io/"
TEAM = PREFIX + "team"
USER = PREFIX + "user"
PROFILE = PREFIX + "profile"
GPU_MILLI = PREFIX + "gpu-milli"
QUOTA = PREFIX + "quota"  # "in-quota" | "over-quota"
KIND = PREFIX + "kind"  # "notebook" | "job"
WORKLOAD = PREFIX + "workload"  # escaped workload key
#: Annotations keep the unescaped values (annotations have no charset limit).
USER_ANNOTATION = PREFIX + "username"
WORKLOAD_ANNOTATION = PREFIX + "workload-key"
#: A token of the spawn attempt that created the pod: a start whose create got no clear
#: answer tells its own pod from another of the same name (spawner/kube/lost_create.py).
SPAWN_ATTEMPT_ANNOTATION = PREFIX + "spawn-attempt"

#: Label selector for everything gpulab counts.
SELECTOR = f"{GPU_MILLI}"

#: Kueue's label naming the LocalQueue of a Job (kueue.x-k8s.io/queue-name).
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
#: The team's LocalQueue, as the Helm chart names it (templates/kueue.yaml).
KUEUE_LOCAL_QUEUE_TEMPLATE = "gpulab-{team}"


def kueue_local_queue(team: str, template: str = KUEUE_LOCAL_QUEUE_TEMPLATE) -> str:
    """The name of ``team``'s Kueue LocalQueue (in the team's namespace)."""
    return template.format(team=team)


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def label_value(value: str) -> str:
    """Escape ``value`` into a valid label value (stable, collision-resistant)."""
    escaped = _SAFE.sub(lambda m: f"-{ord(m.group(0)):02x}" if ord(m.group(0)) < 256 else "-", value)
    if len(escaped) > 63 or escaped != value:
        import hashlib

        digest = hashlib.sha256(value.encode()).hexdigest()[:8]
        escaped = escaped[: 63 - 9].strip("-_.") + "-" + digest
    escaped = escaped.strip("-_.") or "x"
    return escaped


def workload_labels(w: Workload) -> dict[str, str]:
    return {
        TEAM: w.team,
        USER: label_value(w.user),
        PROFILE: label_value(w.profile) if w.profile else "none",
        GPU_MILLI: str(w.milli),
        QUOTA: "over-quota" if w.over_quota else "in-quota",
        KIND: w.kind,
        WORKLOAD: label_value(w.key),
    }


def workload_annotations(w: Workload) -> dict[str, str]:
    return {USER_ANNOTATION: w.user, WORKLOAD_ANNOTATION: w.key}


def workload_from_labels(
    labels: Mapping[str, str], annotations: Mapping[str, str] | None = None, *, fallback_key: str = ""
) -> Workload | None:
    """Rebuild a :class:`Workload` from a pod's metadata; ``None`` if not ours."""
    annotations = annotations or {}
    try:
        milli = int(labels[GPU_MILLI])
        team = labels[TEAM]
    except (KeyError, ValueError):
        return None
    if milli < 0:
        return None
    key = annotations.get(WORKLOAD_ANNOTATION) or fallback_key or labels.get(WORKLOAD, "")
    if not key:
        return None
    return Workload(
        key=key,
        team=team,
        user=annotations.get(USER_ANNOTATION) or labels.get(USER, ""),
        milli=milli,
        profile=labels.get(PROFILE, ""),
        kind=labels.get(KIND, "notebook"),
        over_quota=labels.get(QUOTA) == "over-quota",
        state=RUNNING,
    )
