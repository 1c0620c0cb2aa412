"""GPUKubeSpawner: KubeSpawner with team GPU profiles, quotas and GPU sharing.

A thin adapter: the policy core decides (``policy.resolve_request``,
``Ledger.reserve``, ``sharing.pod_gpu_spec``, ``labels``, ``priority``);
this class only feeds KubeSpawner's traits from those decisions and lets
KubeSpawner's own code create, watch and delete the pod.

- The spawn form is KubeSpawner's, from a callable ``profile_list`` built
  from the user's teams with live availability; unavailable profiles are
  shown disabled with the reason.
- ``load_user_options`` (KubeSpawner runs it first thing in ``_start``)
  validates the request and reserves quota before any object is created.
- The ledger is rebuilt from labelled pods (``gpulab.io/gpu-milli``) seen by
  one informer per team namespace (or one in all namespaces), started once per
  hub process, so a spawn costs no extra API request. The same informer is
  KubeSpawner's pod reflector, and both it and the event reflector list once
  and then resume their watches (:mod:`.informer`): a hub makes fewer list and
  watch requests than a plain KubeSpawner hub.

Configure with ``c.JupyterHub.spawner_class = "gpu-kube"`` (see docs/kubernetes.md).
"""

from __future__ import annotations

import asyncio
import copy
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from kubespawner import KubeSpawner
from traitlets import List, TraitError, Unicode, default, validate

from spawner.admission import Admission, refusal, user_groups
from spawner.core import labels as gl
from spawner.core.env import gpu_env
from spawner.core.form import choice_value, limit_notes, notice_html
from spawner.core.gpu_pools import and_node_affinity
from spawner.core.grant import STATE_KEY, GrantedShare
from spawner.core.ledger import Workload, notebook_key
from spawner.core.model import Team
from spawner.core.policy import (
    Capacity,
    ProfileChoice,
    SpawnRequest,
    choices_for_user,
    what_to_do,
)
from spawner.core.priority import cluster_priority_class_name, effective_priority_class
from spawner.core.profile_facts import device_memory, profile_facts
from spawner.core.queue_form import queue_button_html, queueable
from spawner.core.scheduling import SCHEDULER_EVENT_REASONS, explain_scheduler_event
from spawner.core.sharing import PodGPUSpec, SharingError, effective_milli, kai_queue, pod_gpu_spec, with_shm
from spawner.core.units import format_gpus
from spawner.queue_page import queue_form_parts
from spawner.runtime import KUBERNETES, GPULabRuntime, get_runtime

from .conventions import (
    node_rejection_sentence,
    privileged_containers,
    profile_list_conflict,
)
from .form_template import form_template
from .informer import EventInformer
from .kai_queues import kai_queue_exists, missing_queue_sentence
from .ledger import _LOADED_RUNTIMES, POD_INFORMER, ClusterLedger
from .lost_create import LostCreateRecovery
from .pods_without_state import PodsWithoutState

FORM_TEMPLATE = Path(__file__).with_name("templates") / "kube_form.html"
#: The spawner whose ``_start`` this code runs in, if any (see :meth:`GPUKubeSpawner.stop`).
_starting_spawner: ContextVar[Any] = ContextVar("gpulab_starting_spawner", default=None)
#: A profile's CPU and memory, by the KubeSpawner trait of the same name (unset: the configured one).
RESOURCE_TRAITS = ("cpu_guarantee", "cpu_limit", "mem_guarantee", "mem_limit")
#: Traits this class sets per spawn; restored to the configured value before each spawn.
_APPLIED_TRAITS = (
    "namespace",
    "extra_labels",
    "extra_annotations",
    "extra_resource_limits",
    "extra_resource_guarantees",
    "node_selector",
    "scheduler_name",
    "priority_class_name",
    "cpu_guarantee",
    "cpu_limit",
    "mem_guarantee",
    "mem_limit",
    "image",
    "environment",
    "tolerations",
    "node_affinity_required",
    "node_affinity_preferred",
    "volumes",
    "volume_mounts",
)


def _usage_unreadable() -> Exception:
    """The refusal while the ledger cannot be rebuilt from the cluster (logged with the cause)."""
    return refusal("The hub cannot read GPU usage from the cluster right now; try again shortly.", 503, "cluster")


def _escape(value: str) -> str:
    """KubeSpawner str.format()s label/annotation values: keep user text literal."""
    return value.replace("{", "{{").replace("}", "}}")


class GPUKubeSpawner(LostCreateRecovery, PodsWithoutState, ClusterLedger, KubeSpawner):
    """KubeSpawner with GPU profiles per team, quota admission and GPU sharing backends."""

    #: What this spawner is (:func:`spawner.runtime.spawner_facts`).
    gpulab_platform = KUBERNETES

    # KubeSpawner's traits and state this class sets per spawn (it ships no type information).
    namespace: str
    pvc_name: str
    environment: dict[str, Any]
    extra_labels: dict[str, str]
    extra_annotations: dict[str, str]
    extra_resource_limits: dict[str, Any]
    extra_resource_guarantees: dict[str, Any]
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    node_affinity_required: list[dict[str, Any]]
    node_affinity_preferred: list[dict[str, Any]]
    #: A list, or a dict keyed by name (KubeSpawner takes both).
    volumes: Any
    volume_mounts: Any
    _pvc_exists: bool
    start_timeout: int

    ledger_namespaces = List(
        Unicode(),
        config=True,
        help="""Namespaces whose labelled pods count towards team quotas. Default:
        the hub's namespace plus every team's namespace. `["*"]` watches all
        namespaces (needs cluster-wide list/watch on pods). Implied by
        `enable_user_namespaces`.""",
    )

    @default("profile_list")
    def _default_profile_list(self):
        return self._gpulab_profile_list

    @validate("profile_list")
    def _validate_profile_list(self, proposal):
        """A configured ``profile_list`` (z2jh sets ``[]`` on every hub) must not replace the
        catalog's: empty means unset; anything else is refused with what to remove."""
        value = proposal["value"]
        if getattr(value, "__func__", None) is GPUKubeSpawner._gpulab_profile_list:
            return value
        conflict = profile_list_conflict(value)
        if conflict:
            raise TraitError(conflict)
        return self._gpulab_profile_list

    def _render_options_form(self, profile_list):
        """KubeSpawner's form, after the user's place in the spawn queue and a line saying why
        the last server ended when the idle culler reclaimed its GPU."""
        html = self._render_profile_form(profile_list)
        notice = get_runtime(parent=self).reclaim_notice(self)
        queue = self._queue_parts.get("queue_panel", "")  # read by the profile list just before
        return queue + (notice_html(notice) if notice else "") + html

    def _render_profile_form(self, profile_list: list) -> str:
        """What KubeSpawner's ``_render_options_form`` renders (saved options pre-selected only
        when they still resolve), from a template compiled once (form_template.py)."""
        profile_list = self._get_initialized_profile_list(profile_list)
        if self.user_options:
            try:
                self._validate_user_options(profile_list)
            except ValueError as e:
                self.log.warning("Not pre-selecting saved user_options on the spawn form: %s", e)
        template = form_template(self.additional_profile_form_template_paths, self.profile_form_template)
        return template.render(profile_list=profile_list, user_options=self.user_options)

    @default("profile_form_template")
    def _default_profile_form_template(self) -> str:
        return FORM_TEMPLATE.read_text()

    @default("options_from_form")
    def _default_options_from_form(self):
        return self._gpulab_options_from_form

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # The configured values, so each spawn starts from them (a spawner object is reused).
        self._configured = {name: copy.deepcopy(getattr(self, name)) for name in _APPLIED_TRAITS}
        self._hub_namespace = self.namespace
        self._configured_start_timeout = self.start_timeout
        #: Namespace of the home claim KubeSpawner established (``_pvc_exists``).
        self._pvc_namespace: str | None = None
        self._reserved_key: str | None = None
        self._refused_early = False
        #: The spawn form's queue and right-size parts (:func:`spawner.queue_page.queue_form_parts`).
        self._queue_parts: dict[str, Any] = {}
        self.gpu_spec: PodGPUSpec | None = None

    # -- KubeSpawner's reflectors -------------------------------------------

    def _get_reflector_key(self, kind: str) -> tuple[str, str | None]:
        """KubeSpawner's pod reflector is the ledger's pod informer (one watch, not two);
        with a cluster-wide watch both pods and events are watched once for all namespaces."""
        ns = None if self._watches_all_namespaces() else self.namespace
        return (POD_INFORMER if kind == "pods" else kind, ns)

    async def _start_watching_pods(self, replace: bool = False) -> Any:
        return await self._pod_informer(None if self._watches_all_namespaces() else self.namespace, replace)

    async def _start_watching_events(self, replace: bool = False) -> Any:
        return await self._start_reflector(
            kind="events",
            reflector_class=EventInformer,
            fields={"involvedObject.kind": "Pod"},
            omit_namespace=self._watches_all_namespaces(),
            replace=replace,
        )

    # -- the core's view ---------------------------------------------------

    @property
    def runtime(self) -> GPULabRuntime:
        return get_runtime(parent=self)

    @property
    def workload_key(self) -> str:
        return notebook_key(self.user.name, self.name)  # the same key as on a single server

    # -- the spawn form ---------------------------------------------------

    def _gpu_spec(self, profile, team=None) -> PodGPUSpec:
        return pod_gpu_spec(profile, self.runtime.catalog.sharing, team)

    def _capacity(self, profile) -> Capacity:
        try:
            spec = self._gpu_spec(profile)
        except SharingError as e:
            return Capacity(False, reason=str(e))
        return Capacity(True, summary=spec.summary)

    def _choices(self) -> list[ProfileChoice]:
        runtime = self.runtime
        return choices_for_user(
            runtime.catalog,
            runtime.ledger,
            self.user.name,
            user_groups(self.user),
            capacity=self._capacity,
            effective_milli=lambda p: effective_milli(p, runtime.catalog.sharing),
        )

    async def _gpulab_profile_list(self, spawner: KubeSpawner | None = None) -> list[dict]:
        """KubeSpawner's ``profile_list``: one entry per (team, profile) the user may pick."""
        try:
            await self.refresh_ledger()
        except Exception:
            self.log.exception("gpulab: cannot read GPU usage from the cluster")
            raise _usage_unreadable() from None
        choices = self._choices()
        queue = self._queue_parts = queue_form_parts(
            self.runtime, self.user.name, self.name or "", self.hub.base_url, self.log
        )
        several_teams = len({c.team.name for c in choices}) > 1
        chosen = (self.user_options or {}).get("team"), (self.user_options or {}).get("profile")
        out = []
        inventory, conf = self.runtime.catalog.inventory, self._configured
        for c in choices:
            p = c.profile
            size = format_gpus(c.effective_milli or p.gpu_milli)
            try:
                mig = self._gpu_spec(p).mig_slice
            except SharingError:
                mig = ""
            # Where the profile sets none, the pod gets KubeSpawner's configured values (z2jh's singleuser.*).
            resources = {k: getattr(p, k) if getattr(p, k) is not None else conf[k] for k in RESOURCE_TRAITS}
            gives = profile_facts(
                p,
                c.effective_milli or p.gpu_milli,
                device_memory(p.gpu_model, (), inventory),
                mig_slice=mig,
                **resources,
            )
            notes = [c.team_summary]
            if c.capacity_summary:
                notes.append(c.capacity_summary)
            if c.available and c.over_quota:
                notes.append("starts above the team guarantee, so it is preemptible")
            notes.extend(limit_notes(c, self.runtime.idle_facts))
            entry: dict[str, Any] = {
                "slug": choice_value(c),  # "team:profile", as on the single-server form
                "display_name": p.display_name + (f" — team {c.team.label}" if several_teams else ""),
                "description": p.description,
                "gpulab": {
                    "available": c.available,
                    "reason": c.reason,
                    "gives": gives,
                    "notes": notes,
                    "todo": "" if c.available else what_to_do(c, choices, self.runtime.admin_contact),
                    "gpus": size if p.is_gpu else "",
                    "rounded": c.effective_milli is not None,
                    "selected": c.available and chosen[1] == p.slug and chosen[0] in (None, c.team.name),
                    "right_size": queue["right_size"](c) if p.is_gpu else "",
                    # HTML (escaped where it is built): "Queue me" on a full profile.
                    "queue_button": queue_button_html(c, queue["queue_url"])
                    if "queue_url" in queue and queueable(c)
                    else "",
                },
            }
            if len(p.images) > 1:
                entry["profile_options"] = {
                    "image": {
                        "display_name": "Image",
                        "choices": {
                            i.slug: {"display_name": i.display_name, "default": n == 0} for n, i in enumerate(p.images)
                        },
                    }
                }
            out.append(entry)
        if out and not any(e["gpulab"]["selected"] for e in out):
            first = next((e for e in out if e["gpulab"]["available"]), None)
            if first is not None:
                first["gpulab"]["selected"] = True
        for e in out:  # KubeSpawner marks a default itself when none is; keep ours
            e["default"] = e["gpulab"]["selected"]
        return out

    def _validate_user_options(self, profile_list: list) -> None:
        """KubeSpawner's pre-selection check: the saved options must still resolve."""
        if self.user_options:
            try:
                self._resolve(self.user_options)
            except Exception as e:  # KubeSpawner then just skips pre-selecting them
                raise ValueError(getattr(e, "jupyterhub_message", str(e))) from None

    def _gpulab_options_from_form(self, formdata: dict[str, list]) -> dict[str, Any]:
        """Form fields -> ``{"team", "profile", "image"}``; anything else is kept so it is refused."""
        options: dict[str, Any] = {}
        # "choice": the hub home's one-click "Start again" link, shared with the single-server form.
        choice = formdata.get("profile", formdata.get("choice", [None]))
        choice = choice[0] if isinstance(choice, list) and len(choice) == 1 else choice
        prefix = None
        if isinstance(choice, str) and ":" in choice:
            options["team"], _, options["profile"] = choice.partition(":")
            prefix = f"profile-option-{choice}--"
        elif choice is not None:
            options["profile"] = choice
        for key, value in formdata.items():
            if key in ("profile", "choice", "_xsrf"):
                continue
            if key.startswith("profile-option-"):
                if prefix and key.startswith(prefix):
                    options[key[len(prefix) :]] = value[0] if isinstance(value, list) and len(value) == 1 else value
                continue  # options of profiles not chosen
            options[key] = value
        self._resolve(options)  # refuse on the form page, before anything starts
        return options

    # -- admission ----------------------------------------------------------

    @property
    def admission(self) -> Admission:
        """This server's way through the ledger (resolve, reserve, confirm, release, remember)."""
        return Admission(self.runtime, self.user.name, user_groups(self.user), self.workload_key, self.log)

    def _resolve(self, options: Any) -> SpawnRequest:
        return self.admission.resolve(options)

    async def load_user_options(self) -> None:
        """Validate, reserve quota and set the pod's traits. Refusals create nothing."""
        for name, value in self._configured.items():
            setattr(self, name, copy.deepcopy(value))
        self._refused_early = True
        request = self._resolve(self.user_options or {})
        team, profile = request.team, request.profile
        try:
            spec = self._gpu_spec(profile, team)
        except SharingError as e:
            raise refusal(str(e), 403, "sharing") from None
        self._check_hami_privileged(spec)
        await self._check_kai_queue(spec, team)
        try:
            failed = await self.refresh_ledger()
        except Exception:
            self.log.exception("gpulab: cannot read GPU usage from the cluster")
            raise _usage_unreadable() from None
        team_ns = team.namespace or self._hub_namespace
        if None in failed or team_ns in failed:
            raise refusal(
                f"The hub cannot read the GPU usage of team {team.name} (namespace {team_ns}) "
                f"right now; try again shortly, or ask an admin to check the hub's Role there.",
                503,
            )
        # No await between the rebuild and the reservation: concurrent spawns see each other.
        key = self.workload_key
        decision = self.admission.reserve(request, spec.effective_milli)
        self._reserved_key = key
        self._refused_early = False
        self.gpu_spec = spec
        workload = Workload(
            key, team.name, self.user.name, spec.effective_milli, profile.slug, "notebook", decision.over_quota
        )
        self._apply(request, spec, workload)
        self.log.info(
            "gpulab: admitted %s in team %s: %s (%s), %s",
            key,
            team.name,
            profile.slug,
            spec.summary,
            decision.quota_label,
        )

    async def _check_kai_queue(self, spec: PodGPUSpec, team: Team) -> None:
        """A KAI pod whose queue does not exist would wait unseen (spawner/kube/kai_queues.py)."""
        if spec.backend != "kai":
            return
        opts = self.runtime.catalog.sharing.get("kai") or {}
        queue = kai_queue(team, opts)
        exists = await kai_queue_exists(self.api.api_client, queue)
        if exists is None:
            self.log.info("gpulab: the hub may not read KAI queues; not checking that queue %s exists", queue)
        elif not exists:
            template = str(opts.get("queue") or "{team}")
            raise refusal(missing_queue_sentence(queue, team.name, template), 409, "kai-queue")

    def _check_hami_privileged(self, spec: PodGPUSpec) -> None:
        """HAMi's webhook denies any pod asking for its resources that has a privileged
        container, init containers included (pkg/scheduler/webhook.go): say so before
        creating anything, instead of an API error."""
        if spec.backend != "hami" or spec.effective_milli <= 0:
            return
        names = privileged_containers(self.init_containers) + privileged_containers(self.extra_containers)
        if (self.container_security_context or {}).get("privileged"):
            names.append("notebook")
        if names:
            self.log.error("gpulab: HAMi profile with privileged container(s) %s", ", ".join(names))
            raise refusal(
                f"This cluster's HAMi GPU sharing refuses pods with a privileged container, and the hub "
                f"adds one ({', '.join(names)}). An admin must turn it off: with Zero to JupyterHub, "
                f"singleuser.cloudMetadata.blockWithIptables=false (the gpulab chart's NetworkPolicy "
                f"blocks the cloud metadata server instead).",
                500,
                "configuration",
            )

    def _apply(self, request: SpawnRequest, spec: PodGPUSpec, workload: Workload) -> None:
        team, profile = request.team, request.profile
        self.namespace = team.namespace or self._hub_namespace
        self.dns_name = self.dns_name_template.format(namespace=self.namespace, name=self.pod_name)
        self._follow_home_claim()
        labels = {**gl.workload_labels(workload), **spec.labels}
        self.extra_labels = {**self.extra_labels, **{k: _escape(v) for k, v in labels.items()}}
        annotations = {**gl.workload_annotations(workload), **spec.annotations}
        self.extra_annotations = {**self.extra_annotations, **{k: _escape(v) for k, v in annotations.items()}}
        self.extra_resource_limits = {**self.extra_resource_limits, **spec.limits}
        self.extra_resource_guarantees = {**self.extra_resource_guarantees, **spec.requests}
        self.node_selector = {**self.node_selector, **spec.node_selector}
        if spec.scheduler_name:
            self.scheduler_name = spec.scheduler_name
        for t in (*spec.tolerations, *profile.tolerations):
            if dict(t) not in self.tolerations:
                self.tolerations = [*self.tolerations, dict(t)]
        self.node_affinity_required = and_node_affinity(
            [*self.node_affinity_required, *map(dict, profile.node_affinity_required)], spec.node_requirements
        )
        self.node_affinity_preferred = [*self.node_affinity_preferred, *map(dict, profile.node_affinity_preferred)]
        self.priority_class_name = cluster_priority_class_name(
            effective_priority_class(profile.priority_class, workload.over_quota),
            self.runtime.catalog.priority_class_names,
        )
        for trait in RESOURCE_TRAITS:
            if getattr(profile, trait) is not None:
                setattr(self, trait, getattr(profile, trait))
        if request.image is not None:
            self.image = request.image.image
        # Saved in the hub's spawner state: services (the idle culler) read what was granted.
        self._granted = GrantedShare(
            team=team.name, profile=profile.slug, milli=spec.effective_milli, over_quota=workload.over_quota
        )
        env = gpu_env(team.name, profile.slug, spec.effective_milli, workload.over_quota)  # the device plugin picks
        env.update(spec.env)  # NVIDIA_VISIBLE_DEVICES=void without a GPU
        self.environment = {**self.environment, **{k: _escape(v) for k, v in env.items()}}
        if spec.effective_milli > 0:  # PyTorch's DataLoader workers need more than 64 MiB there
            self.volumes, self.volume_mounts = with_shm(self.volumes, self.volume_mounts)

    async def get_pod_manifest(self):
        """KubeSpawner's pod, with this spawn attempt's token (lost_create.py)."""
        return self._mark_attempt(await super().get_pod_manifest())

    def _follow_home_claim(self) -> None:
        """One home per team namespace: a claim lives in one namespace, and a pod can only
        mount claims of its own. KubeSpawner remembers ``pvc_name`` once the claim exists
        and then skips creating it; when this server runs in another team's namespace than
        the claim, let KubeSpawner create (or find) the claim there."""
        if not self.storage_pvc_ensure:
            return
        if self._pvc_exists and self._pvc_namespace and self._pvc_namespace != self.namespace:
            self.log.info(
                "gpulab: %s's home claim %s is in namespace %s; this server runs in %s and gets the home there",
                self.user.name,
                self.pvc_name,
                self._pvc_namespace,
                self.namespace,
            )
            self._pvc_exists = False
            self.pvc_name = self._expand_user_properties(self.pvc_name_template)
        self._pvc_namespace = self.namespace

    # -- state ----------------------------------------------------------------

    #: What this server was granted (team, profile, effective milli, quota); hub state.
    _granted: GrantedShare | None = None

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self._granted:
            state[STATE_KEY] = self._granted.to_json()
        if "pvc_name" in state:
            state["gpulab_pvc_namespace"] = self._pvc_namespace or self.namespace
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        saved = GrantedShare.from_state(state)
        if saved is not None:
            self._granted = saved
        if "pvc_name" in state:
            # KubeSpawner saves the namespace of the last server, where it made the claim.
            self._pvc_namespace = state.get("gpulab_pvc_namespace") or state.get("namespace")

    def clear_state(self) -> None:
        super().clear_state()
        self._granted = None

    # -- lifecycle ----------------------------------------------------------

    def start(self):
        """KubeSpawner's start, with the profile's ``start_timeout`` set first: JupyterHub
        reads the timeout right after calling ``start()``, before the options are loaded."""
        self.start_timeout = self._configured_start_timeout
        self._attempt_pod_uid = None  # the progress page shows no event of the last start's pod
        try:
            profile = self._resolve(self.user_options or {}).profile
        except Exception:  # load_user_options refuses it, with the message
            profile = None
        if profile is not None and profile.start_timeout_seconds:
            self.start_timeout = profile.start_timeout_seconds
        return super().start()

    async def _start(self):
        """KubeSpawner's start; a failure frees the reservation, a quota 403 becomes a message."""
        self._reserved_key = None
        # Seen by every task the start makes (a context variable is copied into each): a stop
        # from inside this start is KubeSpawner replacing a stale pod.
        _starting_spawner.set(self)
        self._new_spawn_attempt()
        try:
            url = await super()._start()
        except Exception as e:
            # Never report a failure while this attempt's pod lives (lost_create.py).
            await self._delete_own_pod()
            self._release_reservation()
            failure = self._start_failure(e)
            if failure is None:
                raise
            raise failure from None
        except BaseException:
            self._release_reservation()
            raise
        self._remember_choice()
        # Running: the reservation becomes a running workload once the ledger's
        # own reflector has seen the pod (a local wait, no API request); until
        # then it stays counted as reserved and poll() confirms it later.
        watched = self._watched_namespaces()
        for _ in range(50 if None in watched or self.namespace in watched else 0):
            if await self._confirm_if_seen():
                break
            await asyncio.sleep(0.1)
        return url

    def is_pod_running(self, pod):
        """KubeSpawner's check, which its start polls until the pod runs; while this spawner
        starts, a pod its node turned away (phase Failed at admission) ends the start now
        with a sentence, rather than after ``start_timeout``."""
        annotations = (pod or {}).get("metadata", {}).get("annotations") or {}
        # This attempt's own pod only: the reflector may still hold an earlier pod of the name.
        ours = self._spawn_attempt and annotations.get(gl.SPAWN_ATTEMPT_ANNOTATION) == self._spawn_attempt
        if ours and _starting_spawner.get() is self:
            words = node_rejection_sentence(pod)
            if words:
                md = pod["metadata"]
                self.log.warning("gpulab: pod %s/%s: %s", md.get("namespace"), md.get("name"), words)
                raise refusal(words, 503, "node-rejected")
        return super().is_pod_running(pod)

    def _remember_choice(self) -> None:
        """Record the started choice for "Start again" (a failure only costs the suggestion)."""
        try:
            request = self._resolve(self.user_options or {})
        except Exception as e:
            self.log.warning("gpulab: cannot record the last choice of %s: %s", self.user.name, e)
            return
        self.admission.remember_choice(request)

    async def _confirm_if_seen(self) -> bool:
        live = self._live_workloads((await self._ledger_reflectors())[0])
        if self.workload_key in live:
            self.admission.confirm()
            return True
        return False

    async def poll(self) -> int | None:
        if self.runtime not in _LOADED_RUNTIMES:
            # The hub polls every server it knows right after it starts: count
            # what the cluster runs then, not only at the next spawn. Never let
            # that fail the poll: JupyterHub would forget a running server.
            try:
                await self.refresh_ledger()
            except Exception:
                self.log.exception("gpulab: cannot read GPU usage from the cluster; polling %s anyway", self._log_name)
        if self._granted is None:
            await self._adopt_unsaved_pod()
        status = await super().poll()
        if status is not None and self._granted is None and self.pod_name:
            status = await self._poll_unlabelled_pod(status)
        if status is None:
            w = self.runtime.ledger.get(self.workload_key)
            if w is not None and w.state != "running":
                await self._confirm_if_seen()
        return status

    async def progress(self):
        """KubeSpawner's progress events, with the scheduler's refusals in plain words."""
        async for event in super().progress():
            raw = event.get("raw_event") or {}
            if raw.get("reason") in SCHEDULER_EVENT_REASONS:
                words = explain_scheduler_event(raw["reason"], raw.get("message") or "", self._asked_for())
                if words:
                    event = {**event, "message": words}
            yield event

    def _asked_for(self) -> str:
        """What this server asked for, as the spawn form named it."""
        profile = self.runtime.catalog.profiles.get(self._granted.profile if self._granted else "")
        if profile is not None and profile.is_gpu:
            return profile.display_name
        return self.gpu_spec.summary if self.gpu_spec else "this server's resources"

    def _release_reservation(self) -> None:
        if self._reserved_key:
            self.runtime.ledger.release(self._reserved_key)
            self._reserved_key = None

    async def stop(self, now: bool = False) -> None:
        if self._refused_early:
            # Refused in load_user_options: no object was created, nothing to delete.
            self._refused_early = False
            return
        # KubeSpawner also stops a stale pod of the same name (409) from inside its own
        # start, which then creates the pod again: that start's reservation is not this
        # stop's to free. Any other stop ends a start still under way and frees its share
        # now, rather than trusting the start to notice (a cancelled start can go on
        # waiting for its deleted pod: asyncio.wait_for before Python 3.12 loses a
        # cancellation that arrives as the awaited call completes).
        start = self._start_future
        inside_start = _starting_spawner.get() is self
        if start is not None and not start.done() and not inside_start:
            self.log.info("gpulab: stopping %s while it starts; its start is cancelled", self._log_name)
            start.cancel()
        try:
            await super().stop(now=now)
        finally:
            if start is not None and not start.done() and not inside_start:
                start.cancel()  # again: the first may have been lost, and the start waits for a pod now gone
            if not inside_start:
                self.runtime.ledger.release(self.workload_key)
                self._reserved_key = None
