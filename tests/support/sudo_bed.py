"""A real sudo set-up for tests of a hub that is not root: an account, a group, the drop-in.

``gpulab sudoers`` prints the drop-in (checked by ``visudo``) into /etc/sudoers.d;
the embedded hub runs as the account and creates the users' accounts through the
drop-in's one ``useradd`` line. Everything carries the bed's tag (``gthub<hex>``,
``gtsu<hex>-*``, ``/etc/sudoers.d/gpulab-test-sudo-<hex>``) and :func:`remove_bed`
removes it; :func:`remove_leftovers` removes the beds of killed runs. Modules that
use a bed run under ``flock /tmp/gpulab-sudo-tests.lock`` (CONTRIBUTING.md).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from spawner.local.accounts import Account, delete_account, ensure_account, lookup
from tests.support import VENV_BIN
from tests.support.hub import RunningHub
from tests.support.processes import kill_uids

DROPIN_DIR = Path("/etc/sudoers.d")
DROPIN_PREFIX = "gpulab-test-sudo-"
MEDIATOR = str(VENV_BIN / "gpulab-launch")


@dataclass
class SudoBed:
    """The names one bed uses, all derived from its tag."""

    tag: str

    @property
    def hub_user(self) -> str:
        return f"gthub{self.tag}"

    @property
    def prefix(self) -> str:
        return f"gtsu{self.tag}-"

    @property
    def group(self) -> str:
        return f"gtsu{self.tag}-users"

    @property
    def dropin(self) -> Path:
        return DROPIN_DIR / f"{DROPIN_PREFIX}{self.tag}"

    @property
    def workdir(self) -> Path:
        return Path("/tmp") / f"gpulab-sudo-{self.tag}"


def remove_bed(bed: SudoBed) -> None:
    """Remove the drop-in first (nothing may use it any more), then processes, accounts, group, files."""
    bed.dropin.unlink(missing_ok=True)
    names = [
        line.split(":", 1)[0]
        for line in Path("/etc/passwd").read_text().splitlines()
        if line.startswith((bed.prefix, bed.hub_user + ":"))
    ]
    kill_uids({a.uid for a in map(lookup, names) if a is not None})
    for name in names:
        delete_account(name)
    subprocess.run(["groupdel", bed.group], capture_output=True)
    shutil.rmtree(bed.workdir, ignore_errors=True)


def process_identity(pid: int) -> str:
    """``"<pid> <start time>"``: a pid never names two processes (``""`` when there is none)."""
    try:
        return f"{pid} {Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return ""


def remove_leftovers() -> None:
    """Beds of runs that were killed: the pytest process that made them is gone (its hub may live on)."""
    for dropin in DROPIN_DIR.glob(DROPIN_PREFIX + "*"):
        bed = SudoBed(dropin.name[len(DROPIN_PREFIX) :])
        try:
            maker = (bed.workdir / "made-by").read_text()
        except OSError:
            maker = ""
        if maker != process_identity(int(maker.split()[0]) if maker else -1):
            remove_bed(bed)


def as_account(account: Account, argv: list[str], stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` with exactly ``account``'s credentials (its own groups only, no capabilities)."""
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        user=account.uid,
        group=account.gid,
        extra_groups=[g for g in account.groups if g != account.gid],
        start_new_session=True,
        env={"PATH": os.environ["PATH"], "HOME": str(account.home), "USER": account.name},
    )


@contextmanager
def sudo_bed() -> Iterator[SudoBed]:
    """A fresh bed (its group made), removed at the end, even on failure."""
    remove_leftovers()
    if shutil.which("sudo") is None or shutil.which("visudo") is None:
        raise RuntimeError("sudo is not installed: run scripts/bootstrap.sh --test (it installs Debian's sudo)")
    b = SudoBed(secrets.token_hex(3))
    try:
        b.workdir.mkdir(mode=0o755)
        (b.workdir / "made-by").write_text(process_identity(os.getpid()))
        subprocess.run(["groupadd", b.group], check=True, capture_output=True)
        yield b
    finally:
        remove_bed(b)


def hub_account_of(bed: SudoBed) -> Account:
    """The (non-root) account the bed's hub runs as."""
    return ensure_account(bed.hub_user, bed.workdir)


@contextmanager
def sudo_hub(
    bed: SudoBed,
    hub_account: Account,
    catalog: str,
    extra_config: str = "",
    preexec: Callable[[], None] | None = None,
) -> Iterator[RunningHub]:
    """The embedded hub as ``hub_account``, in sudo mode, with the drop-in ``gpulab sudoers`` prints.

    ``preexec`` runs in the hub's process before it ``exec``s (e.g. it joins a cgroup delegated to the hub).
    """
    from tests.support.jobs import kill_job_runners

    run = bed.workdir / "run"
    h = RunningHub(
        run,
        catalog,
        extra_config=extra_config,
        env={"GPULAB_ACCOUNT_PREFIX": bed.prefix, "GPULAB_ACCOUNT_GROUP": bed.group, "GPULAB_ISOLATION": "sudo"},
        run_as=hub_account,
    )
    h.account_prefix = bed.prefix
    h.preexec = preexec
    for path in (run, *run.iterdir()):
        if not path.is_symlink():
            os.chown(path, hub_account.uid, hub_account.gid)
    rule = subprocess.run(
        [
            str(VENV_BIN / "gpulab"),
            "sudoers",
            "--hub-user",
            bed.hub_user,
            "--group",
            bed.group,
            "--mediator",
            MEDIATOR,
            "--prefix",
            bed.prefix,
            "--home-root",
            str(h.data_dir.resolve() / "homes"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    staged = bed.workdir / "gpulab.sudoers"
    staged.write_text(rule)
    checked = subprocess.run(["visudo", "-cf", str(staged)], capture_output=True, text=True)
    if checked.returncode != 0:
        raise RuntimeError(f"visudo refused the drop-in: {checked.stdout}{checked.stderr}")
    shutil.copyfile(staged, bed.dropin)
    os.chmod(bed.dropin, 0o440)
    try:
        h.start()
        yield h
    finally:
        h.stop()
        kill_job_runners(h)
        h.close()
