"""The admin's budget webhook: each threshold notice POSTed as JSON, retried with back-off.

Every ``c.GPULabBudgets.check_interval`` seconds the hub records the notices that are due
(:meth:`.budgets.BudgetBook.record_due_notices`) and POSTs each pending one to the webhook
URL the admin set, with ``Content-Type: application/json`` and the body of
:func:`spawner.core.budgets.webhook_body` (docs/admin.md). A 2xx answer delivers it. A 5xx,
408, 429 or a network error is retried after ``webhook_retry_seconds``, doubling each time
(at most an hour), until ``webhook_attempts``; any other status is the receiver refusing
the body, which a retry would not change, and the notice is marked failed with the answer.
Pending notices survive a hub restart (they are rows), so a delivery interrupted by a
restart is retried, never lost and never sent twice once delivered.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.ioloop import PeriodicCallback

from hub_config.domain.budgets import MAX_WEBHOOK_URL, BudgetBook
from hub_config.storage.db import utcnow
from spawner.core.budgets import BudgetStatus, webhook_body

log = logging.getLogger("gpulab.budgets")

MAX_RETRY_SECONDS = 3600
#: Statuses worth retrying: the receiver is down or busy, not refusing the body.
RETRYABLE = {408, 429}


class WebhookURLError(ValueError):
    """A webhook URL the hub will not POST to; the message says why."""


def check_webhook_url(value: object) -> str:
    """An admin's webhook URL: ``""`` (none) or an absolute ``http``/``https`` URL with a host,
    without spaces or control characters, at most :data:`MAX_WEBHOOK_URL` characters."""
    if not isinstance(value, str):
        raise WebhookURLError(f"'url' must be a string, not {type(value).__name__}")
    if value == "":
        return ""
    if len(value) > MAX_WEBHOOK_URL:
        raise WebhookURLError(f"'url' is longer than {MAX_WEBHOOK_URL} characters")
    if not value.isascii() or not value.isprintable() or " " in value:
        raise WebhookURLError("'url' must be plain ASCII without spaces or control characters (percent-encode them)")
    try:
        parts = urlsplit(value)
        port = parts.port  # raises on a port that is not a number or out of range
    except ValueError as e:
        raise WebhookURLError(f"'url' is not a URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookURLError(
            f"'url' must be an http:// or https:// URL, not {parts.scheme or 'one without a scheme'}:"
        )
    if not parts.hostname:
        raise WebhookURLError("'url' must name a host, e.g. https://hooks.example.org/gpulab")
    del port
    return value


def retry_delay(attempts: int, first: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: ``first``, doubling, at most an hour."""
    return min(MAX_RETRY_SECONDS, first * 2 ** max(0, attempts - 1))


class BudgetNotifier:
    """The periodic check: record due notices, deliver pending ones."""

    def __init__(self, book: BudgetBook, hub_url: str = ""):
        self.book = book
        self.hub_url = hub_url
        self._periodic: PeriodicCallback | None = None
        self._running = False

    def body_for(self, status: BudgetStatus, threshold: int) -> dict[str, Any]:
        team = self.book.runtime.catalog.team(status.budget.team)
        users = [status.budget.user] if status.budget.user else sorted(team.users) if team else []
        body = webhook_body(status, threshold, users, self.hub_url)
        body["member_groups"] = sorted(team.groups) if team is not None and status.budget.user is None else []
        return body

    async def deliver(self, now: datetime | None = None) -> int:
        """POST every pending notice whose attempt is due; the number delivered."""
        url = self.book.webhook_url()
        now = now or utcnow()
        due = self.book.due_deliveries(now)
        delivered = 0
        settings = self.book.settings
        for notice in due:
            if not url:
                self.book.record_attempt(notice.id, delivered=False, error="no webhook URL is set any more")
                continue
            ok, error, retry = await self._post(url, notice.body, settings.webhook_timeout)
            attempts = notice.attempts + 1
            retry_at = None
            if not ok and retry and attempts < settings.webhook_attempts:
                retry_at = utcnow() + timedelta(seconds=retry_delay(attempts, settings.webhook_retry_seconds))
            self.book.record_attempt(notice.id, delivered=ok, error=error, retry_at=retry_at)
            if ok:
                delivered += 1
                log.info("gpulab budgets: told the webhook that %s reached %d %%", notice.budget_key, notice.threshold)
            else:
                log.warning(
                    "gpulab budgets: webhook POST for %s (%d %%) failed (attempt %d): %s%s",
                    notice.budget_key,
                    notice.threshold,
                    attempts,
                    error,
                    "; retrying" if retry_at else "; giving up",
                )
        return delivered

    async def _post(self, url: str, body: str, timeout: float) -> tuple[bool, str, bool]:
        """``(delivered, error, worth retrying)``."""
        request = HTTPRequest(
            url,
            method="POST",
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": "gpulab-budgets"},
            connect_timeout=timeout,
            request_timeout=timeout,
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except HTTPClientError as e:  # raise_error=False still raises for timeouts (599)
            return False, f"{e.code} {e.message}", True
        except OSError as e:
            return False, f"cannot connect: {e}", True
        if 200 <= response.code < 300:
            return True, "", False
        if response.code == 599:
            return False, f"no answer: {response.error}", True
        retry = response.code >= 500 or response.code in RETRYABLE
        return False, f"HTTP {response.code} {response.reason}", retry

    async def check(self, now: datetime | None = None) -> int:
        """One check: due notices recorded, pending ones delivered."""
        if self._running:
            return 0
        self._running = True
        try:
            self.book.record_due_notices(now, self.body_for)
            return await self.deliver(now)
        finally:
            self._running = False

    async def _safe_check(self) -> None:
        try:
            await self.check()
        except Exception:
            log.exception("gpulab budgets: the budget check failed")

    def start(self, interval: float) -> None:
        try:
            self._periodic = PeriodicCallback(self._safe_check, interval * 1000)
            self._periodic.start()
        except RuntimeError:  # no event loop in this process (a script)
            self._periodic = None
