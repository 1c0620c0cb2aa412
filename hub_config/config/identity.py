"""The hub's ``post_auth_hook`` for teams from the identity provider.

JupyterHub calls ``c.Authenticator.post_auth_hook(authenticator, handler, auth_model)`` after a
user passed every authentication check, with the model the authenticator's ``authenticate()``
returned (``name``, ``admin``, ``groups`` when it manages groups, ``auth_state``), and uses what
the hook returns (JupyterHub's ``Authenticator.post_auth_hook`` help). gpulab's hook records
what ``c.GPULabIdentity.team_rules`` read from that model (:mod:`hub_config.domain.identity_teams`)
and returns the model unchanged. :func:`install` sets it, chaining a hook the operator set.
"""

from __future__ import annotations

import logging
from typing import Any

from tornado.web import HTTPError
from traitlets.utils.importstring import import_item

from hub_config.domain.identity_teams import GPULabIdentity, IdentityBook
from hub_config.storage.db import session_factory

log = logging.getLogger("gpulab.identity")

HOOK = "hub_config.config.identity.post_auth_hook"


async def post_auth_hook(authenticator: Any, handler: Any, auth_model: dict[str, Any]) -> dict[str, Any]:
    """Record the login's groups and claims for the identity rules; the model goes on unchanged.

    A login whose record cannot be written is refused (a 503): the user would otherwise get
    the teams of an older login."""
    config = authenticator.config
    settings = GPULabIdentity(config=config)
    chained = settings.operator_post_auth_hook
    if chained:
        hook = import_item(chained) if isinstance(chained, str) else chained
        result = hook(authenticator, handler, auth_model)
        auth_model = (await result) if hasattr(result, "__await__") else result
    if not auth_model:
        return auth_model
    rules = settings.rules()
    if not rules:
        return auth_model
    groups = auth_model.get("groups")
    groups = [g for g in groups if isinstance(g, str)] if isinstance(groups, list) else []
    state = auth_model.get("auth_state")
    try:
        IdentityBook(session_factory(config), rules).record_login(
            str(auth_model["name"]), groups, state if isinstance(state, dict) else None
        )
    except Exception as e:
        log.error("gpulab identity: cannot record the login of %s: %s", auth_model.get("name"), e)
        raise HTTPError(503, "The hub cannot record your teams right now; try to log in again shortly.") from None
    return auth_model


def install(c: Any) -> None:
    """Make :func:`post_auth_hook` the authenticator's, keeping one the operator set (called first)."""
    current = c.Authenticator.get("post_auth_hook")
    if current is None or current is post_auth_hook or current == HOOK:
        c.Authenticator.post_auth_hook = post_auth_hook
        return
    c.GPULabIdentity.operator_post_auth_hook = current
    c.Authenticator.post_auth_hook = post_auth_hook
