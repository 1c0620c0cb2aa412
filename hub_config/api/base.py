"""Shared plumbing for gpulab's hub API handlers."""

from __future__ import annotations

import json
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import Scope
from tornado import web

from spawner.config import GPULabRuntime, get_runtime

#: Largest JSON body any gpulab endpoint accepts.
MAX_BODY_BYTES = 256 * 1024


class GPULabAPIHandler(APIHandler):
    """Base for ``/hub/api/gpulab/...``: JSON in and out, scope checks with filters."""

    @property
    def gpulab(self) -> GPULabRuntime:
        return get_runtime(config=self.settings.get("config"))

    def has_scope(self, scope: str, user_name: str | None = None) -> bool:
        """Does the caller hold ``scope`` (for ``user_name``'s resources, if given)?"""
        parsed = getattr(self, "parsed_scopes", {}) or {}
        sub = parsed.get(scope)
        if sub is None:
            return False
        if sub == Scope.ALL:
            return True
        if user_name is None:
            return False
        if user_name in sub.get("user", ()):
            return True
        groups = sub.get("group", ())
        if groups:
            user = self.find_user(user_name)
            if user is not None and {g.name for g in user.groups} & set(groups):
                return True
        return False

    def require_scope(self, scope: str, user_name: str | None = None) -> None:
        if not self.current_user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        if not self.has_scope(scope, user_name):
            what = f" for user {user_name}" if user_name else ""
            raise web.HTTPError(403, f"Action is not authorized with current scopes; requires {scope}{what}")

    @property
    def caller_name(self) -> str:
        user = self.current_user
        return getattr(user, "name", "") if user is not None else ""

    def read_json(self, max_bytes: int = MAX_BODY_BYTES) -> Any:
        body = self.request.body or b""
        if len(body) > max_bytes:
            raise web.HTTPError(413, f"request body is larger than {max_bytes} bytes")
        if not body:
            raise web.HTTPError(400, "request body must be a JSON object")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise web.HTTPError(400, "request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "request body must be a JSON object")
        return data

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))
