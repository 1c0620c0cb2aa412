"""The hub's side of the mediator: one request as a user's account, never waited on past a deadline.

Every action on a user's behalf that touches what the user controls -- read a
file in the home, start a server or a job runner through sudo, signal it,
claim the home -- is one run of the mediator (:mod:`spawner.local.mediator`) as the
user's account, with one JSON request on stdin and one JSON answer on stdout:

- a root hub starts the mediator itself, switched to the account
  (:class:`AccountMediator`); a non-root hub runs it through ``sudo -n -u``
  (:class:`spawner.local.sudo.SudoLauncher`);
- the call is an asyncio subprocess: the hub's event loop never blocks on it,
  and no thread pool is shared between users;
- a deadline (``c.UserAccounts.mediator_timeout``) ends the wait: the process is
  killed (a root hub kills the account's process; through sudo, sudo passes
  SIGTERM and SIGCONT on and is then killed) and the caller gets
  :class:`MediatorTimeout`, a sentence for that user only;
- at most ``max_pending`` calls per account are outstanding; more are refused
  at once (:class:`MediatorBusy`), so a user whose processes are stopped ties up
  nothing of anyone else's;
- the answer is read up to a cap and checked field by field: the account may
  trace or replace its own mediator, so its answer is trusted no further than
  what the account could do itself.

Plain asyncio: no tornado, no JupyterHub.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import binascii
import json
import logging
import os
import pwd
import signal
from collections import Counter
from collections.abc import Callable
from typing import Any

from . import home_files

log = logging.getLogger("gpulab.mediator")

#: Largest answer read from the mediator apart from a file's bytes.
MAX_ANSWER = 64 * 1024
#: Most of the mediator's stderr kept for an error message.
MAX_STDERR = 4096

#: Calls outstanding per account, across every client in this process.
_pending: Counter[str] = Counter()


class MediatorError(RuntimeError):
    """The mediator could not be run, refused, or answered nonsense; the message says what to fix."""


class MediatorTimeout(MediatorError):
    """The mediator did not answer within the deadline (and was stopped)."""


class MediatorBusy(MediatorError):
    """Too many calls as this account are still unanswered; nothing was run."""


def _whole(value: Any, lo: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise MediatorError(f"the mediator answered {str(value)[:40]!r} where a whole number was expected")
    return value


class MediatorClient(abc.ABC):
    """Runs the mediator as an account and exchanges one request for one answer (see the module)."""

    #: How the mediator reaches the account, in words (error messages).
    how = "as"

    def __init__(self, mediator: str, timeout: float = 10.0, max_pending: int = 4):
        self.mediator = mediator
        self.timeout = timeout
        self.max_pending = max_pending

    @abc.abstractmethod
    def command(self, account: str) -> tuple[list[str], dict[str, Any]]:
        """The argument list that runs the mediator as ``account``, and extra ``Popen`` arguments."""

    @abc.abstractmethod
    async def stop(self, proc: asyncio.subprocess.Process) -> None:
        """End a mediator that missed its deadline (the account may have stopped it)."""

    async def call(
        self,
        account: str,
        request: dict[str, Any],
        hub_stderr: bool = False,
        answer_limit: int = MAX_ANSWER,
        preexec: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """One request as ``account``; the mediator's answer (``ok`` checked).

        ``hub_stderr``: the mediator (and the program it starts) write to the
        hub's own stderr; otherwise its stderr is kept for the error message.
        ``preexec``: run in the child before it ``exec``s the mediator (through
        sudo: it joins the workload's cgroup, so sudo, the mediator and what it
        starts run inside).
        """
        action = request.get("action")
        if _pending[account] >= self.max_pending:
            raise MediatorBusy(
                f"{_pending[account]} earlier requests as {account} are still unanswered "
                "(are the account's processes stopped?); nothing more is run as it until they end"
            )
        argv, extra = self.command(account)
        _pending[account] += 1
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=None if hub_stderr else asyncio.subprocess.PIPE,
                    cwd="/",
                    close_fds=True,
                    start_new_session=True,  # no terminal, and a group of its own to stop
                    preexec_fn=preexec,
                    **extra,
                )
            except OSError as e:
                raise MediatorError(f"cannot run {self.mediator} {self.how} {account}: {e}") from None
            try:
                out, err, code = await asyncio.wait_for(
                    self._exchange(proc, json.dumps(request).encode(), answer_limit), self.timeout
                )
            except asyncio.TimeoutError:
                await self._end(proc)
                log.warning(
                    "gpulab: %s %s %s did not answer %s within %g s; stopped it",
                    self.mediator,
                    self.how,
                    account,
                    action,
                    self.timeout,
                )
                raise MediatorTimeout(
                    f"{self.mediator} {self.how} {account} did not answer within {self.timeout:g} s "
                    "(c.UserAccounts.mediator_timeout) and was stopped: the account's processes "
                    "may be stopped or overloaded"
                ) from None
            except BaseException:
                await self._end(proc)
                raise
        finally:
            _pending[account] -= 1
            if _pending[account] <= 0:
                del _pending[account]
        try:
            reply = json.loads(out or b"null")
        except (ValueError, RecursionError):
            reply = None
        if not isinstance(reply, dict):
            text = err.decode(errors="replace").strip()[:500]
            raise MediatorError(
                f"{self.mediator} {self.how} {account} exited with {code}"
                f"{': ' + text if text else ''}{self.setup_hint(account)}"
            )
        if reply.get("ok") is not True:
            raise MediatorError(
                f"{self.mediator} {self.how} {account} refused {action}: {str(reply.get('error'))[:500]}"
            )
        return reply

    def setup_hint(self, account: str) -> str:
        """What to check when the mediator did not answer at all."""
        return ""

    async def _exchange(
        self, proc: asyncio.subprocess.Process, payload: bytes, answer_limit: int
    ) -> tuple[bytes, bytes, int]:
        async def feed() -> None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(payload)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass  # it exited early; its answer (or its exit code) says why
            finally:
                proc.stdin.close()

        async def collect(stream: asyncio.StreamReader | None, cap: int, strict: bool) -> bytes:
            if stream is None:
                return b""
            kept = bytearray()
            while chunk := await stream.read(1 << 16):
                if len(kept) + len(chunk) > cap:
                    if strict:
                        raise MediatorError(f"the mediator's answer is larger than {cap} bytes")
                    chunk = chunk[: max(0, cap - len(kept))]  # keep the start, drain the rest
                kept += chunk
            return bytes(kept)

        out, err, _ = await asyncio.gather(
            collect(proc.stdout, answer_limit, True), collect(proc.stderr, MAX_STDERR, False), feed()
        )
        return out, err, await proc.wait()

    async def _end(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            try:
                await self.stop(proc)
            except (ProcessLookupError, PermissionError):
                pass
        # Close our ends of the pipes: a stopped process that is continued later finds them gone.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:
            log.warning("gpulab: mediator process %d did not exit after it was stopped", proc.pid)

    # -- the actions -------------------------------------------------------------

    async def start_server(
        self,
        account: str,
        args: list[str],
        env: dict[str, str],
        preexec: Callable[[], None] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> int:
        """Start the server; ``extra``: the mediator's own set-up (private /tmp, output capture)."""
        request = {"action": "start-server", "args": args, "env": env, **(extra or {})}
        # Without a capture the server writes to the mediator's stderr: the hub's, never a pipe.
        reply = await self.call(account, request, hub_stderr="output_max_bytes" not in request, preexec=preexec)
        return _whole(reply.get("pid"), 2)

    async def start_job(
        self,
        account: str,
        env: dict[str, str],
        *,
        input: str,
        output: str,
        cwd: str,
        status: str,
        log: str,
        attempt: int,
        checkpoint: str = "",
        run: dict[str, Any] | None = None,
        preexec: Callable[[], None] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> int:
        """Start the job runner as ``account``; ``run``: its kind, grace and processes
        (``hub_config.jobs.backends.local_runner.run_options``)."""
        reply = await self.call(
            account,
            {
                "action": "start-job",
                "env": env,
                "input": input,
                "output": output,
                "cwd": cwd,
                "status": status,
                "log": log,
                "attempt": attempt,
                "checkpoint": checkpoint,
                **(run or {}),
                **(extra or {}),
            },
            preexec=preexec,
        )
        return _whole(reply.get("pid"), 2)

    async def signal(self, account: str, pid: int, sig: int, group: bool = False, started: int | None = None) -> bool:
        """Send ``sig`` to the account's process ``pid`` (started at ``started``); whether it still existed."""
        request: dict[str, Any] = {"action": "signal", "pid": pid, "signal": int(sig), "group": group}
        if started is not None:
            request["started"] = started
        return (await self.call(account, request)).get("alive") is True

    async def read(
        self, account: str, path: str, offset: int = 0, limit: int = 0, max_size: int | None = None
    ) -> home_files.Found:
        """A file below the account's home, read as the account (:func:`spawner.local.home_files.read_beneath`)."""
        request: dict[str, Any] = {"action": "read", "path": str(path), "offset": offset, "limit": limit}
        if max_size is not None:
            request["max_size"] = max_size
        reply = await self.call(account, request, answer_limit=MAX_ANSWER + (limit + 2) * 4 // 3)
        state = reply.get("state")
        if state not in home_files.STATES:
            raise MediatorError(f"the mediator answered the unknown state {str(state)[:40]!r}")
        try:
            data = base64.b64decode(reply.get("data") or "", validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise MediatorError("the mediator answered data that is not base64") from None
        if len(data) > limit:
            raise MediatorError(f"the mediator answered {len(data)} bytes where at most {limit} were asked")
        return home_files.Found(state, data, _whole(reply.get("size", 0)), str(reply.get("detail") or "")[:200])

    async def keep_copy(self, account: str, source: str, target: str, max_size: int) -> tuple[home_files.Found, bool]:
        """Copy ``source`` to the new file ``target`` below the account's home, as the account
        (the mediator's ``keep-copy``): ``(what the read found, whether the target was made)``."""
        request = {"action": "keep-copy", "source": str(source), "target": str(target), "max_size": max_size}
        reply = await self.call(account, request)
        state = reply.get("state")
        if state not in home_files.STATES:
            raise MediatorError(f"the mediator answered the unknown state {str(state)[:40]!r}")
        found = home_files.Found(state, b"", _whole(reply.get("size", 0)), str(reply.get("detail") or "")[:200])
        return found, reply.get("created") is True

    async def prepare_home(self, account: str, hub: str = "") -> dict[str, Any]:
        """Make the home 0700 and claim it for ``hub``; the answer's ``owner`` names the hub holding it."""
        reply = await self.call(account, {"action": "prepare-home", "hub": hub})
        if hub and not isinstance(reply.get("owner"), str):
            raise MediatorError("the mediator did not say which hub holds the home")
        return reply


class AccountMediator(MediatorClient):
    """A root hub's mediator: started as the account itself (groups, gid, uid set before ``exec``)."""

    def command(self, account: str) -> tuple[list[str], dict[str, Any]]:
        try:
            pw = pwd.getpwnam(account)
        except KeyError:
            raise MediatorError(f"there is no system account {account}") from None
        if pw.pw_uid == 0:
            raise MediatorError(f"{account} is root: the mediator never runs as root")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        return [self.mediator], {
            "user": pw.pw_uid,
            "group": pw.pw_gid,
            "extra_groups": os.getgrouplist(account, pw.pw_gid),
            "env": env,
        }

    async def stop(self, proc: asyncio.subprocess.Process) -> None:
        os.killpg(proc.pid, signal.SIGKILL)  # root: a stopped process dies of SIGKILL too
