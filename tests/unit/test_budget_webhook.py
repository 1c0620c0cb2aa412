"""The budget webhook's delivery against a real HTTP server on loopback: what is retried, what
is not, each threshold once per period, and a pending notice surviving a restart of the book."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from traitlets.config import Config

from hub_config.domain.budget_webhook import BudgetNotifier, check_webhook_url, retry_delay
from hub_config.domain.budgets import BudgetBook, GPULabBudgets
from hub_config.domain.usage_records import GPULabUsage, UsageInterval
from hub_config.storage.db import session_factory, utcnow
from spawner.core.catalog import catalog_from_dict
from spawner.runtime import GPULabRuntime
from tests.support.webhook_receiver import WebhookReceiver

CATALOG = {
    "profiles": [{"slug": "h100", "display_name": "1 × H100", "gpus": 1}],
    "teams": [{"name": "vision", "users": ["alice", "bob"], "guarantee": 2, "burst": 4}],
}


def make_book(tmp_path, **budget_settings) -> BudgetBook:
    config = Config()
    for k, v in {"webhook_retry_seconds": 0, "webhook_timeout": 2, **budget_settings}.items():
        setattr(config.GPULabBudgets, k, v)
    sessions = session_factory(url=f"sqlite:///{tmp_path / 'gpulab.sqlite'}")
    runtime = GPULabRuntime(catalog_from_dict(CATALOG, "test"))
    return BudgetBook(runtime, sessions, GPULabUsage(), GPULabBudgets(config=config))


def spend(book: BudgetBook, gpu_hours: float) -> None:
    now = utcnow()
    with book.sessions.begin() as s:
        s.add(
            UsageInterval(
                key=f"job:{gpu_hours}",
                team="vision",
                user="bob",
                profile="h100",
                kind="job",
                gpu_milli=int(gpu_hours * 1000),
                gpu_model=None,
                over_quota=False,
                started_at=now - timedelta(hours=1),
                ended_at=now - timedelta(seconds=1),
            )
        )


def check(notifier: BudgetNotifier) -> int:
    return asyncio.run(notifier.check())


def test_a_failing_receiver_is_retried_until_it_answers_and_told_once(tmp_path):
    book = make_book(tmp_path)
    with WebhookReceiver() as receiver:
        book.set_webhook_url(receiver.url, "admin")
        book.set_budget({"team": "vision", "gpu_hours": 1}, "admin")
        spend(book, 0.85)
        receiver.answers += [500, 429]
        notifier = BudgetNotifier(book)
        assert [check(notifier) for _ in range(4)] == [0, 0, 1, 0]
        [notice] = book.notices()
        assert notice.state == "delivered" and notice.attempts == 3
        assert [r["status"] for r in receiver.received] == [500, 429, 200]
        assert receiver.delivered()[0]["threshold_percent"] == 80


def test_a_refusing_receiver_is_not_retried_and_attempts_are_capped(tmp_path):
    book = make_book(tmp_path, webhook_attempts=2)
    with WebhookReceiver() as receiver:
        book.set_webhook_url(receiver.url, "admin")
        book.set_budget({"team": "vision", "gpu_hours": 1}, "admin")
        spend(book, 0.9)
        receiver.answers += [400]  # the receiver refuses the body: a retry would not change it
        notifier = BudgetNotifier(book)
        check(notifier)
        check(notifier)
        [notice] = book.notices()
        assert notice.state == "failed" and notice.attempts == 1 and "HTTP 400" in notice.last_error
        # 100 %: a receiver that stays down gets webhook_attempts tries, then the notice fails
        spend(book, 0.2)
        receiver.answers += [503, 503, 503]
        for _ in range(4):
            check(notifier)
        latest = book.notices()[0]
        assert latest.threshold == 100 and latest.state == "failed" and latest.attempts == 2


def test_an_unreachable_webhook_stays_pending_across_a_restart_of_the_hub(tmp_path):
    book = make_book(tmp_path, webhook_attempts=5)
    dead = WebhookReceiver()  # its socket is bound but nothing serves it yet: POSTs time out
    book.set_webhook_url(dead.url, "admin")
    book.set_budget({"team": "vision", "gpu_hours": 1}, "admin")
    spend(book, 1.05)
    assert check(BudgetNotifier(book)) == 0
    assert {n.threshold: n.state for n in book.notices()} == {80: "pending", 100: "pending"}
    assert all("599" in n.last_error and n.attempts == 1 for n in book.notices())
    # a new hub process (a new book over the same database) delivers them, once each
    again = make_book(tmp_path, webhook_attempts=5)
    with dead:
        assert check(BudgetNotifier(again)) == 2
        assert check(BudgetNotifier(again)) == 0
        # a POST that timed out may still arrive (here: the ones queued while nothing served):
        # delivery is at least once, and every attempt of a notice carries the same id
        ids = {b["id"]: b["threshold_percent"] for b in dead.delivered()}
        assert sorted(ids.values()) == [80, 100] and len(dead.delivered()) <= 4


def test_without_a_webhook_the_notice_is_recorded_as_not_sent(tmp_path):
    book = make_book(tmp_path)
    book.set_budget({"team": "vision", "gpu_hours": 1}, "admin")
    spend(book, 0.81)
    assert check(BudgetNotifier(book)) == 0
    [notice] = book.notices()
    assert notice.state == "no-webhook" and notice.last_error == "no webhook URL was set"


def test_retry_delays_double_up_to_an_hour():
    assert [retry_delay(n, 30) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert retry_delay(20, 30) == 3600


@pytest.mark.parametrize("url", ["http://hooks.example.org/x", "https://127.0.0.1:8443/gpulab", ""])
def test_webhook_urls_accepted(url):
    assert check_webhook_url(url) == url
