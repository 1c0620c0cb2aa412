"""System accounts for hub users: names, creation, homes, reachability."""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from spawner.local.accounts import (
    MAX_ACCOUNT_LEN,
    AccountError,
    UserAccounts,
    account_name,
    can_switch_users,
    delete_account,
    ensure_account,
    lookup,
    unreachable_by_others,
)

needs_root = pytest.mark.skipif(not can_switch_users(), reason="creating accounts needs root (CI runs as root)")


@pytest.mark.parametrize(
    "user, expected",
    [
        ("alice", "jupyter-alice"),
        ("bob_2", "jupyter-bob_2"),
    ],
)
def test_plain_names_are_prefixed(user, expected):
    assert account_name("jupyter-", user) == expected


@pytest.mark.parametrize("user", ["Alice", "a.b@example.org", "x" * 60, "émile", "root;rm -rf /", "a b"])
def test_unusual_names_become_distinct_safe_account_names(user):
    name = account_name("jupyter-", user)
    assert len(name) <= MAX_ACCOUNT_LEN and name.startswith("jupyter-")
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in name)
    assert name == name.lower()
    # The hash keeps apart names that clean up to the same text.
    assert account_name("jupyter-", user) != account_name("jupyter-", user + "!")


def test_a_prefix_too_long_for_any_name_is_refused():
    with pytest.raises(AccountError, match="too long"):
        account_name("p" * 30, "alice!")


def test_unreachable_by_others_names_the_blocking_folder(tmp_path):
    closed = tmp_path / "closed"
    (closed / "inner").mkdir(parents=True)
    os.chmod(closed, 0o700)
    assert unreachable_by_others(closed / "inner") in {closed, *closed.parents}
    opened = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(opened, 0o711)
        assert unreachable_by_others(opened) is None
    finally:
        opened.rmdir()


@needs_root
def test_concurrent_creation_gives_one_account_with_a_private_home():
    root = Path(tempfile.mkdtemp(prefix="gpulab-accounts-", dir="/tmp"))
    os.chmod(root, 0o711)
    name = f"gt{secrets.token_hex(3)}-x"
    uids: list[int] = []
    try:
        threads = [threading.Thread(target=lambda: uids.append(ensure_account(name, root).uid)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        account = lookup(name)
        assert account is not None and set(uids) == {account.uid} and account.uid != 0
        st = account.home.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.uid, 0o700)
        assert account.home == root / name
        # A home made too open is closed again on the next use.
        os.chmod(account.home, 0o755)
        ensure_account(name, root)
        assert stat.S_IMODE(account.home.stat().st_mode) == 0o700
    finally:
        delete_account(name)
        shutil.rmtree(root, ignore_errors=True)
    assert lookup(name) is None


@needs_root
def test_existing_accounts_only_when_creation_is_off():
    accounts = UserAccounts(prefix=f"gt{secrets.token_hex(3)}-", create=False, home_root="/nonexistent")
    with pytest.raises(AccountError, match="does not exist"):
        accounts.account_for("alice")
    assert accounts.home_of("alice") == Path("/nonexistent") / accounts.name_for("alice")
