"""The hub's runtime hook: what the hub process adds to gpulab's runtime at start.

``c.GPULab.runtime_hooks`` runs :func:`attach_runtime` once, when the runtime is
created in the hub process: the catalog stored in gpulab's database (admin edits)
replaces the file's when it should, the usage recorder follows the ledger, and the
spawners get the reader of the idle culler's records. Everything it sets is a field
declared on :class:`spawner.runtime.GPULabRuntime`.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from hub_config.domain.budget_webhook import BudgetNotifier
from hub_config.domain.budgets import BudgetBook, GPULabBudgets
from hub_config.domain.catalog_store import CatalogStore, GPULabCatalogStore, load_at_start
from hub_config.domain.identity_teams import GPULabIdentity, IdentityBook
from hub_config.domain.idle_records import idle_facts, reclaim_notice_for
from hub_config.domain.last_choice import last_choice, remember_choice
from hub_config.domain.queue_runner import attach as attach_queue
from hub_config.domain.right_size import right_size_line
from hub_config.domain.session_gpu import attach as attach_session_gpu
from hub_config.domain.session_history import job_time_limits, warned_reclaims
from hub_config.domain.usage_records import GPULabUsage
from hub_config.domain.usage_records import attach as attach_usage
from hub_config.storage.db import session_factory
from spawner.runtime import GPULab, GPULabRuntime

#: The import string configure_gpulab puts in ``c.GPULab.runtime_hooks``.
HOOK = "hub_config.config.runtime.attach_runtime"


def attach_runtime(runtime: GPULabRuntime, settings: GPULab) -> None:
    """``c.GPULab.runtime_hooks`` entry: stored catalog, usage history, the culler's notices
    and state, each Kubernetes session's GPU use (Prometheus), each user's last started choice, the spawn queue with its runner, the GPU-hour
    budgets and the identity rules."""
    config: Any = settings.config
    sessions = session_factory(config)
    store = CatalogStore(sessions, GPULabCatalogStore(config=config))
    catalog = load_at_start(store, runtime.catalog)
    if catalog is not runtime.catalog:
        runtime.set_catalog(catalog)
    runtime.catalog_store = store
    runtime.usage = attach_usage(runtime, sessions, config)
    attach_session_gpu(runtime, sessions, config)  # after the usage recorder: it reads its intervals
    runtime.reclaim_notice = reclaim_notice_for
    runtime.idle_facts = idle_facts(config)
    runtime.last_choice = partial(last_choice, sessions)
    runtime.remember_choice = partial(remember_choice, sessions)
    runtime.right_size = partial(right_size_line, runtime, sessions)
    runtime.queue = attach_queue(runtime, sessions, config)
    runtime.queue.idle_warnings = partial(warned_reclaims, sessions)
    runtime.queue.job_ends = partial(job_time_limits, sessions)
    attach_budgets(runtime, sessions, config)
    runtime.identity_grants = IdentityBook(sessions, GPULabIdentity(config=config).rules()).grants


def attach_budgets(runtime: GPULabRuntime, sessions: Any, config: Any) -> BudgetBook:
    """The GPU-hour budgets: the admission check, and the periodic check that tells thresholds."""
    book = BudgetBook(runtime, sessions, GPULabUsage(config=config), GPULabBudgets(config=config))
    runtime.budgets = book
    runtime.budget_verdict = book.gate
    hub = config.get("JupyterHub", {}) if config is not None else {}
    notifier = BudgetNotifier(book, str(hub.get("public_url", "") or ""))
    notifier.start(book.settings.check_interval)
    book.notifier = notifier
    return book
