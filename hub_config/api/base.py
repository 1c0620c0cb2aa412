"""Shared plumbing for gpulab's hub API handlers.

Every body and every query argument is read here, with the same limits for
every endpoint: a malformed, too deep, too large or non-finite input is a 400
before any handler sees it, never a 500 and never a stored value.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import Scope
from sqlalchemy.exc import SQLAlchemyError
from tornado import web

from hub_config.storage.db import StorageUnavailable, database_file, sqlite_file, storage_failure
from spawner.runtime import GPULabRuntime, get_runtime

#: Largest JSON body any gpulab endpoint accepts.
MAX_BODY_BYTES = 256 * 1024
#: Deepest nesting of arrays and objects in a body. No endpoint needs more than
#: a few levels; Python's json module recurses and fails at ~1000 (a 500).
MAX_JSON_DEPTH = 32
#: Most digits of an integer in a body or a query (SQLite's INTEGER holds 18).
MAX_INT_DIGITS = 18

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


class BodyError(ValueError):
    """A request body gpulab refuses; the message says why (a 400)."""


def _refuse_constant(name: str) -> Any:
    raise BodyError(f"{name} is not a number gpulab accepts (NaN and Infinity are refused)")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise BodyError(f"a number in the body has more than {MAX_INT_DIGITS} digits")
    return int(text)


def _finite_float(text: str) -> float:
    if len(text) > 64:
        raise BodyError("a number in the body is written with more than 64 characters")
    value = float(text)
    if not math.isfinite(value):
        raise BodyError(f"{text[:20]} is too large a number")
    return value


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (strings are skipped)."""
    depth = deepest = 0
    for ch in _JSON_STRING.sub('""', text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json_body(body: bytes, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """A request body as a JSON object, or :class:`BodyError` (``too_large`` set for a 413)."""
    if len(body) > max_bytes:
        err = BodyError(f"request body is larger than {max_bytes} bytes")
        err.too_large = True  # type: ignore[attr-defined]
        raise err
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("request body is not UTF-8") from None
    if not text.strip():
        raise BodyError("request body must be a JSON object")
    if json_depth(text) > MAX_JSON_DEPTH:
        raise BodyError(f"request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int, parse_float=_finite_float)
    except BodyError:
        raise
    except (ValueError, RecursionError):
        raise BodyError("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise BodyError("request body must be a JSON object")
    return data


class GPULabAPIHandler(APIHandler):
    """Base for ``/hub/api/gpulab/...``: JSON in and out, scope checks with filters.

    A database that cannot be used now (locked by another process past
    ``c.GPULabDB.busy_timeout``, its disk full, an I/O error), gpulab's or the
    hub's, is answered with a 503 and a sentence that says which and what to do,
    never a 500 with a traceback, nor "invalid credentials" when it was the hub's
    own lookup of the caller that failed.
    """

    #: The database error JupyterHub met while it looked up the caller, if any.
    _auth_storage_error: BaseException | None = None

    @property
    def gpulab(self) -> GPULabRuntime:
        return get_runtime(config=self.settings.get("config"))

    # -- databases that cannot be used now ------------------------------------

    def storage_failure(self, error: BaseException | None) -> StorageUnavailable | None:
        """What to tell the caller about ``error`` when it is a database that cannot be used now."""
        config = self.settings.get("config")
        hub_section = config.get("JupyterHub", {}) if config is not None else {}
        hub_url = hub_section.get("db_url", "") if "db_url" in hub_section else ""
        hub_db = sqlite_file(str(hub_url)) if hub_url else None
        return storage_failure(error, database_file(config), str(hub_db or ""))

    async def get_current_user(self) -> Any:
        try:
            return await super().get_current_user()
        except SQLAlchemyError as e:  # JupyterHub's prepare() logs it and goes on without a user
            self._auth_storage_error = e
            raise

    def _refuse_when_the_lookup_failed(self) -> None:
        failure = self.storage_failure(self._auth_storage_error)
        if failure is not None:
            raise StorageUnavailable(f"the hub cannot tell who is asking: {failure}", failure.status)

    async def prepare(self) -> None:
        await super().prepare()
        self._refuse_when_the_lookup_failed()

    def check_xsrf_cookie(self) -> Any:
        self._refuse_when_the_lookup_failed()  # before "XSRF cookie does not match" hides it
        return super().check_xsrf_cookie()

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        failure = self.storage_failure(value)
        if failure is None:
            super().log_exception(typ, value, tb)
            return
        self.log.warning(
            "gpulab: %s %s answered %d: %s", self.request.method, self.request.path, failure.status, failure
        )

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        failure = self.storage_failure(exc_info[1] if exc_info else None)
        if failure is None:
            super().write_error(status_code, **kwargs)
            return
        self.set_status(failure.status)
        if failure.status == 503:
            self.set_header("Retry-After", "10")
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"status": failure.status, "message": str(failure)}))

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

    def read_json(self, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
        """The body as a JSON object (see :func:`parse_json_body`); 400/413 otherwise."""
        try:
            return parse_json_body(self.request.body or b"", max_bytes)
        except BodyError as e:
            raise web.HTTPError(413 if getattr(e, "too_large", False) else 400, str(e)) from None

    def int_argument(self, name: str, default: int, lo: int = 0, hi: int = 10**MAX_INT_DIGITS - 1) -> int:
        """A whole-number query argument in ``[lo, hi]``: ASCII digits only ("²" is not 2)."""
        raw = self.get_argument(name, None)
        if raw is None:
            return default
        text = raw.strip()
        digits = text[1:] if text.startswith("-") else text
        if not (digits.isascii() and digits.isdigit()) or len(digits) > MAX_INT_DIGITS:
            raise web.HTTPError(400, f"{name} must be a whole number, got {raw[:20]!r}")
        value = int(text)
        if not lo <= value <= hi:
            raise web.HTTPError(400, f"{name} must be between {lo} and {hi}")
        return value

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, allow_nan=False))


def ascii_id(value: str, max_digits: int = 12) -> int | None:
    """A path id such as a job's: ASCII digits only (``"²".isdigit()`` is true), else ``None``."""
    if value.isascii() and value.isdigit() and len(value) <= max_digits:
        return int(value)
    return None
