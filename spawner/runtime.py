"""Traitlets configuration for the catalog, and the hub-process runtime.

``c.GPULab.catalog_file = "teams.yaml"`` and/or ``c.GPULab.teams`` /
``c.GPULab.profiles`` in ``jupyterhub_config.py``. The hub process holds one
:class:`GPULabRuntime` (catalog, ledger, device packer) shared by every
spawner instance and the hub-side APIs, so notebooks and jobs are admitted
against the same ledger.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from traitlets import CaselessStrEnum, Dict, Integer, List, Unicode, Union
from traitlets.config import Configurable
from traitlets.utils.importstring import import_item

from spawner.core.budgets import ALLOW, BudgetVerdict
from spawner.core.catalog import Catalog, CatalogError, ConfigIssue, catalog_from_dict
from spawner.core.catalog.write import catalog_to_dict
from spawner.core.catalog.yaml_text import catalog_from_yaml
from spawner.core.grant import GrantedShare
from spawner.core.idle import IdleFacts
from spawner.core.ledger import Ledger
from spawner.core.packer import DevicePacker

#: The platforms a hub serves (:attr:`GPULabRuntime.platform`).
SINGLE_SERVER, KUBERNETES = "single-server", "kubernetes"


class GPULab(Configurable):
    """Where teams, profiles, sharing defaults and declared GPUs come from."""

    catalog_file = Unicode(
        "",
        config=True,
        help="""Path of a YAML file with `teams`, `profiles`, `sharing`, `inventory`
        and `prices` (see docs/configuration.md). Validated at start; the hub
        refuses to start on errors, naming the file, line and key.""",
    )
    teams = Union(
        [List(), Dict()],
        default_value=[],
        config=True,
        help="""Teams given directly in traitlets config (same schema as the
        file's `teams`). Added to those from `catalog_file`; a name defined in
        both is an error.""",
    )
    profiles: List[Any] = List(
        config=True,
        help="""Profiles given directly in traitlets config (same schema as the
        file's `profiles`). Added to those from `catalog_file`.""",
    )
    sharing = Dict(
        config=True,
        help="""Cluster-wide GPU sharing defaults, e.g.
        `{"backend": "timeslice", "timeslice": {"replicas": 4}}`. Overrides the file's.""",
    )
    inventory: List[Any] = List(
        config=True,
        help="""Declared GPUs for the single-server mode when NVML finds no driver,
        e.g. `[{"model": "H100-80GB", "count": 8, "memory_mib": 81559}]`. Overrides the file's.""",
    )
    prices = Dict(
        config=True,
        help="Price per GPU-hour by GPU model ('*' for any model), for cost reports.",
    )
    gpu_inventory_source = CaselessStrEnum(
        ["auto", "nvml", "declared"],
        default_value="auto",
        config=True,
        help="""Where the single server's GPU inventory comes from (notebooks and
        jobs share it). `auto`: NVML when an NVIDIA driver is present, else the
        declared `inventory`, labelled as declared on the spawn page. `nvml`:
        refuse to start without a driver. `declared`: always the declared inventory.""",
    )
    admin_contact = Unicode(
        "",
        config=True,
        help="""Whom users should ask for a bigger quota or a team, shown on the
        spawn page beside an unavailable profile and in refusals, e.g.
        `"the platform team (#gpu-help on Slack)"` or `"gpu-admins@example.org"`.
        Empty: the page says "an admin".""",
    )
    platform = CaselessStrEnum(
        ["auto", SINGLE_SERVER, KUBERNETES],
        default_value="auto",
        config=True,
        help="""Which platform this hub serves: `single-server` (GPUs of this machine, placed on
        devices) or `kubernetes` (GPUs of the cluster's nodes). `auto`: what the configured
        `c.JupyterHub.spawner_class` declares (gpulab's spawners do: `gpu-kube` is kubernetes,
        `gpu-local` and `gpu-simple-local` single-server); any other spawner counts as
        single-server. Set it when a spawner of your own says nothing. The admin page, the
        admin API and the jobs service read it; nothing guesses it from class names.""",
    )
    data_disks = Dict(
        value_trait=Unicode(),
        config=True,
        help="""Folders whose disk must have room before new work starts, by what they hold,
        e.g. `{"the hub's databases": "/srv/gpulab/hub", "the users' homes": "/home"}`. When
        one has less than `min_free_disk_mib` free, new servers and job submissions are
        refused with a sentence that names it; running servers and jobs go on. The
        embedded hub sets its data folders here. Empty: no check.""",
    )
    min_free_disk_mib = Integer(
        64,
        min=0,
        config=True,
        help="""Free space (MiB) each of `data_disks` keeps for the hub's own records (a job's
        outcome, a server's stop, the usage history): below it new work is refused.""",
    )
    runtime_hooks = List(
        Unicode(),
        config=True,
        help="""Import strings of callables `hook(runtime, settings)` run once when
        the process runtime is created, in order, before it is used; e.g.
        `hub_config.config.runtime.attach_runtime` applies catalog edits stored in
        gpulab's database and records usage history. Keeps the core free of I/O.""",
    )

    def load_catalog(self) -> Catalog:
        """Read the file (if any) and merge the traitlets values onto it."""
        data: dict[str, Any] = {}
        source = "c.GPULab"
        if self.catalog_file:
            path = Path(self.catalog_file)
            try:
                text = path.read_text()
            except OSError as e:
                raise CatalogError(str(path), [ConfigIssue((), f"cannot read: {e.strerror or e}")]) from None
            data = catalog_to_dict(catalog_from_yaml(text, str(path)))
            source = f"{path} + c.GPULab"
        teams = self.teams
        if isinstance(teams, dict):
            teams = [{"name": k, **(v or {})} for k, v in teams.items()]
        if teams:
            data["teams"] = list(data.get("teams", [])) + list(teams)
        if self.profiles:
            data["profiles"] = list(data.get("profiles", [])) + list(self.profiles)
        if self.sharing:
            data["sharing"] = dict(self.sharing)
        if self.inventory:
            data["inventory"] = list(self.inventory)
        if self.prices:
            data["prices"] = dict(self.prices)
        return catalog_from_dict(data, source)


def full_disk(disks: Mapping[str, str], min_free_bytes: int) -> str | None:
    """Why new work cannot start for lack of disk space (the first full disk of ``disks``,
    named by what it holds and where), or ``None`` when each has ``min_free_bytes`` free."""
    for what, folder in disks.items():
        try:
            st = os.statvfs(folder)
        except OSError:
            continue  # not there (yet): whoever writes there says so
        free = st.f_bavail * st.f_frsize
        if free < min_free_bytes:
            return (
                f"the disk holding {what} ({folder}) is full: {free / 2**20:.1f} MiB free, and the hub keeps "
                f"{min_free_bytes / 2**20:.0f} MiB for its own records; new servers and jobs are refused "
                "until an admin frees space there (running ones go on)"
            )
    return None


def _no_reclaim_notice(spawner: Any) -> str:
    return ""


def _no_last_choice(user: str) -> dict[str, str] | None:
    return None


def _no_right_size(user: str, profile: Any) -> str:
    return ""


def _no_take_back(decision: Any, for_what: str) -> float | None:
    return None


def _forget_choice(user: str, team: str, profile: str, image: str) -> None:
    return None


def _no_pod(key: str) -> tuple[str, str] | None:
    return None


def _no_identity_grants(user: str, groups: list[str]) -> tuple[str, ...]:
    return ()


def _no_budgets(team: str, user: str, may_burst: bool) -> BudgetVerdict:
    return BudgetVerdict(ALLOW)


class GPULabRuntime:
    """Process-wide state: the current catalog, the ledger and (single server) the packer."""

    def __init__(self, catalog: Catalog, packer: DevicePacker | None = None, gpu_inventory_source: str = "auto"):
        self.lock = threading.RLock()
        self.catalog = catalog
        self.ledger = Ledger(catalog.teams, catalog.departments, catalog.profile_pools)
        self.packer = packer
        #: Configured source (``auto``/``nvml``/``declared``) for the packer's devices.
        self.gpu_inventory_source = gpu_inventory_source
        #: Where the packer's devices actually came from: ``nvml`` or ``declared``.
        self.inventory_source = "declared"
        #: The hub's stored catalog (``hub_config.domain.catalog_store.CatalogStore``),
        #: set by the hub's runtime hook; ``None`` outside the hub.
        self.catalog_store: Any = None
        #: The hub's usage recorder (``hub_config.domain.usage_records.UsageRecorder``), set by
        #: the hub's runtime hook; ``None`` outside the hub.
        self.usage: Any = None
        #: ``reclaim_notice(spawner) -> str``: why this server's last session ended, when the
        #: idle culler reclaimed its GPU ('' otherwise). The hub installs the reader of the
        #: culler's records; the spawners only call it, so they import nothing from the hub.
        self.reclaim_notice: Callable[[Any], str] = _no_reclaim_notice
        #: ``c.GPULab.admin_contact``: whom users ask for quota ("" = "an admin").
        self.admin_contact = ""
        #: ``single-server`` or ``kubernetes``: set once, from ``c.GPULab.platform`` or what the
        #: hub's spawner class declares (:func:`spawner_facts`).
        self.platform = SINGLE_SERVER
        #: The hub's job service (``hub_config.jobs.service.JobService``), made on first use by
        #: the hub; ``None`` elsewhere.
        self.jobs: Any = None
        #: Whether the hub's servers run as their users' own system accounts (``gpu-local``):
        #: its jobs then do too.
        self.user_accounts = False
        #: What the hub knows of its GPU idle culler (whether it runs, "Keep my GPU"), set by the
        #: hub's runtime hook; the default says "unknown" (every page's idle sentence then says so).
        self.idle_facts = IdleFacts()
        #: ``last_choice(user) -> {"team", "profile", "image"} | None``: what the user last
        #: started, and ``remember_choice(user, team, profile, image)``; the hub installs
        #: readers and writers of gpulab's database.
        self.last_choice: Callable[[str], dict[str, str] | None] = _no_last_choice
        self.remember_choice: Callable[[str, str, str, str], None] = _forget_choice
        #: ``budget_verdict(team, user, may_burst) -> BudgetVerdict``: what the GPU-hour budgets
        #: (:mod:`spawner.core.budgets`) say about new work; the hub installs the reader of its
        #: stored budgets and usage history (``budgets``, a ``hub_config.domain.budgets.BudgetBook``).
        self.budget_verdict: Callable[[str, str, bool], BudgetVerdict] = _no_budgets
        self.budgets: Any = None
        #: ``identity_grants(user, groups) -> grants``: the teams (``TeamGrant``) and whole
        #: departments (``DepartmentGrant``) the identity provider's groups and claims grant
        #: (``c.GPULabIdentity.team_rules``, :mod:`spawner.core.identity`); the hub installs it.
        self.identity_grants: Callable[[str, list[str]], tuple[str, ...]] = _no_identity_grants
        #: The hub's spawn queue (``hub_config.domain.queue_runner.QueueRunner``: "queue me", its
        #: runner and each user's view of it), set by the hub's runtime hook; ``None`` elsewhere.
        self.queue: Any = None
        #: ``right_size(user, profile) -> str``: the right-size line for ``user`` about to start
        #: ``profile`` ('' when none), from their recorded sessions; the hub installs the reader.
        self.right_size: Callable[[str, Any], str] = _no_right_size
        #: ``workload_pod(key) -> (namespace, pod) | None``: the pod a workload runs in, as the
        #: cluster names it (Kubernetes: GPUKubeSpawner installs its pod informers' reader; the
        #: hub's session GPU recorder keys the session's dcgm-exporter series by it).
        self.workload_pod: Callable[[str], tuple[str, str] | None] = _no_pod
        #: ``take_back(decision, for_what) -> seconds | None``: execute a refusal's reclaim choice
        #: (``Decision.reclaim``: borrowed work of ``reclaim_kinds``) for in-quota work; the seconds
        #: within which the work taken back frees its devices, ``None`` when nothing was taken.
        #: The single server's job service installs it (``hub_config.jobs.reclaim``); elsewhere
        #: (Kubernetes: Kueue reclaims) nothing is taken back here.
        self.take_back: Callable[[Any, str], float | None] = _no_take_back
        self.reclaim_kinds: frozenset[str] | None = None
        #: ``c.GPULab.data_disks`` and ``min_free_disk_mib`` (in bytes): see :meth:`disk_full`.
        self.data_disks: dict[str, str] = {}
        self.min_free_disk_bytes = 0

    def disk_full(self) -> str | None:
        """Why new work is refused for lack of disk space, or ``None`` (:func:`full_disk`)."""
        return full_disk(self.data_disks, self.min_free_disk_bytes) if self.data_disks else None

    def set_catalog(self, catalog: Catalog) -> None:
        """Swap in an edited catalog; takes effect for the next spawn or job."""
        with self.lock:
            self.catalog = catalog
            self.ledger.set_teams(catalog.teams, catalog.departments, catalog.profile_pools)


_runtime: GPULabRuntime | None = None
_runtime_lock = threading.Lock()


def get_runtime(parent: Configurable | None = None, config: Any = None) -> GPULabRuntime:
    """The hub process's runtime, created from ``c.GPULab`` on first use.

    ``parent`` (a spawner) or ``config`` (the hub's Config object) supplies the
    configuration the first time; later calls return the same runtime.
    """
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            if parent is not None:
                settings = GPULab(parent=parent)
            elif config is not None:
                settings = GPULab(config=config)
            else:
                settings = GPULab()
            runtime = GPULabRuntime(settings.load_catalog(), gpu_inventory_source=settings.gpu_inventory_source)
            runtime.admin_contact = settings.admin_contact
            declared = spawner_facts(type(parent) if parent is not None else _spawner_class(config))
            runtime.platform = declared[0] if settings.platform == "auto" else settings.platform
            runtime.user_accounts = declared[1]
            runtime.data_disks = dict(settings.data_disks)
            runtime.min_free_disk_bytes = settings.min_free_disk_mib * 2**20
            for hook in settings.runtime_hooks:
                import_item(hook)(runtime, settings)
            _runtime = runtime
        return _runtime


def current_runtime() -> GPULabRuntime | None:
    """The process runtime if one was made (never makes one)."""
    return _runtime


def set_runtime(runtime: GPULabRuntime | None) -> None:
    """Install (or clear, with ``None``) the process runtime; used by tests and the hub setup."""
    global _runtime
    with _runtime_lock:
        _runtime = runtime


def granted_share(spawner: Any) -> GrantedShare | None:
    """What a server was granted, read from its spawner's state as every other reader reads it
    (the idle culler over the hub's REST API): ``None`` for a spawner that is not gpulab's or
    a server that holds no grant."""
    return GrantedShare.from_state(spawner.get_state())


def spawner_facts(spawner_class: Any) -> tuple[str, bool]:
    """``(platform, runs as user accounts)`` a spawner class declares (its ``gpulab_platform``
    and ``gpulab_user_accounts`` attributes); ``(single-server, False)`` for one that does not."""
    return (
        getattr(spawner_class, "gpulab_platform", SINGLE_SERVER),
        bool(getattr(spawner_class, "gpulab_user_accounts", False)),
    )


def _spawner_class(config: Any) -> Any:
    """The class ``c.JupyterHub.spawner_class`` names (a class, an entry-point name such as
    ``gpu-kube``, or an import string), loaded as JupyterHub loads it; ``None`` if unset."""
    try:
        value = config.JupyterHub.spawner_class if config is not None and "JupyterHub" in config else None
    except AttributeError:
        value = None
    if not value or not isinstance(value, str):
        return value or None
    for ep in entry_points(group="jupyterhub.spawners"):
        if ep.name == value:
            return ep.load()
    return import_item(value)
