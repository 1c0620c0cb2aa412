"""The spawn page's queue and right-size lines, as both spawners' forms get them.

The hub's queue runner (``runtime.queue``) gives the user's entries; the runtime's
``right_size`` reader the line for each profile. Either failing costs only its lines:
the form renders anyway.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from spawner.core.queue_form import queue_panel_html
from spawner.runtime import GPULabRuntime


def right_size_line(runtime: GPULabRuntime, user: str, profile: Any, log: logging.Logger) -> str:
    """The right-size line for ``user`` about to start ``profile`` ('' for none or on failure)."""
    try:
        return runtime.right_size(user, profile)
    except Exception as e:
        log.warning("gpulab: cannot read the sessions of %s for the right-size hint: %s", user, e)
        return ""


def queue_form_parts(
    runtime: GPULabRuntime, user: str, server: str, base_url: str, log: logging.Logger
) -> dict[str, Any]:
    """Keyword arguments of :func:`spawner.core.form.render_options_form` for the queue (this
    server's place in line, where "Queue me" posts) and the right-size lines."""
    parts: dict[str, Any] = {"right_size": lambda c: right_size_line(runtime, user, c.profile, log)}
    runner = runtime.queue
    if runner is None or not runner.settings.enabled:
        return parts
    try:
        entries = runner.view(user)
    except Exception as e:
        log.warning("gpulab: cannot read the queue of %s: %s", user, e)
        return parts
    pending = f"{base_url}spawn-pending/{quote(user, safe='')}" + (f"/{quote(server, safe='')}" if server else "")
    if not any(e.get("server_name") == server and e.get("state") in ("waiting", "starting") for e in entries):
        # this server waits already: its cards offer no second place in line
        parts["queue_url"] = f"{base_url}gpulab/queue?server={quote(server, safe='')}"
    parts["queue_panel"] = queue_panel_html(
        entries,
        server_name=server,
        cancel_url=f"{base_url}gpulab/queue/cancel",
        api_url=f"{base_url}api/gpulab/queue",
        pending_url=pending,
        notice=runner.notices.pop(user, ""),
    )
    return parts
