"""``gpulab-launch``: the one program the hub runs as a user's account.

A non-root hub runs ``sudo -n -u <account> -- <venv>/bin/gpulab-launch``; a
root hub runs the same program itself, switched to the account (uid, gid and
groups set in the child before ``exec``). Either way the argument list is
fixed (none), the hub writes one JSON request to its stdin, and this program
answers with one JSON object on stdout. The sudoers rule
(``scripts/gpulab.sudoers``) lets a non-root hub's account run exactly this
program, as members of the users' group only.

It can do six things, each as the account it runs as, nothing else:

- ``start-server``: start ``jupyterhub-singleuser`` (the one next to this
  program's interpreter) with the arguments and environment in the request;
- ``start-job``: start the job runner (``hub_config.jobs.runner``: a notebook
  or a script) of the same interpreter;
- ``signal``: send a signal to one of this account's processes (or its
  group), named by pid and start time (:mod:`spawner.local.processes`);
- ``read``: read a regular file below this account's home, never through a
  symlink, without blocking on a FIFO, up to a size cap
  (:mod:`spawner.local.home_files`): the job's log, output notebook and exit
  status, and a submitted notebook. Every read of a file a user controls
  happens here, with that user's credentials;
- ``keep-copy``: copy a notebook below this account's home to a new file there
  (a job's own copy of what was submitted): read as by ``read``, written with
  :func:`spawner.local.home_files.write_new_file` (no symlink followed, never into
  an existing file, folders ``0700``), up to a size cap;
- ``prepare-home``: make the home ``0700`` and claim it for the asking hub
  (``~/.gpulab/hub``), or say which hub claimed it first.

Tokens (``JUPYTERHUB_API_TOKEN``) travel in the request on stdin, never on a
command line; the started program gets them in its environment, which only
its own uid (and root) can read. The environment is the hub's explicit list,
minus variables that would change what a fixed program runs (``LD_PRELOAD``,
``PYTHONPATH``, ...); ``HOME``, ``USER``, ``LOGNAME`` and ``SHELL`` come from
the account database, not from the hub.

The account may stop, trace or replace this process (it is the account's
own): the hub never waits on it past a deadline and trusts nothing in its
answer beyond what the account could read or do anyway.

Standard library only (and gpulab's standard-library helpers): it starts fast,
and what runs as the user is small.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import signal as signals
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import home_files, processes
from .namespaces import GPULAB_IMPORT_ROOT, private_tmp
from .output_capture import capture_argv, server_log_path

#: Largest request accepted on stdin.
MAX_REQUEST = 1 << 20
#: Largest read returned in one answer.
MAX_READ = 64 << 20
#: The job runner module (run with ``-m`` by this program's interpreter).
RUNNER_MODULE = "hub_config.jobs.runner"
#: Variables that change what a fixed program loads or runs: never passed on.
DROPPED_ENV = frozenset(
    {
        "LD_PRELOAD",
        "LD_AUDIT",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONBREAKPOINT",
        "BASH_ENV",
        "ENV",
        "IFS",
    }
)
SIGNALS = {0, int(signals.SIGINT), int(signals.SIGTERM), int(signals.SIGKILL)}


class Refused(Exception):
    """The request is malformed or not allowed; the hub shows the message."""


def me() -> pwd.struct_passwd:
    return pwd.getpwuid(os.getuid())


def clean_env(requested: Any) -> dict[str, str]:
    """The hub's environment for the program, minus what could change what runs."""
    if not isinstance(requested, dict):
        raise Refused("env must be an object of strings")
    env: dict[str, str] = {}
    for key, value in requested.items():
        if (
            not isinstance(key, str)
            or not isinstance(value, str)
            or not key
            or "=" in key
            or "\0" in key
            or "\0" in value
        ):
            raise Refused(f"invalid environment variable {str(key)[:40]!r}")
        if key in DROPPED_ENV or key.startswith("LD_") and key != "LD_LIBRARY_PATH":
            continue
        env[key] = value
    account = me()
    env.update(
        {
            "HOME": account.pw_dir,
            "USER": account.pw_name,
            "LOGNAME": account.pw_name,
            "SHELL": account.pw_shell or "/bin/sh",
        }
    )
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


def inside_home(path: Any, must_exist: bool = False) -> Path:
    """``path`` (absolute) when its real location is inside this account's home."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise Refused("paths must be absolute")
    home = Path(os.path.realpath(me().pw_dir))
    real = Path(os.path.realpath(path))
    if real != home and home not in real.parents:
        raise Refused(f"{path} is not inside the home {home}")
    if must_exist and not real.exists():
        raise Refused(f"{path} does not exist")
    return real


def strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and "\0" not in v for v in value):
        raise Refused(f"{what} must be a list of strings")
    return value


def start(argv: list[str], env: dict[str, str], cwd: str, output: int, req: dict | None = None) -> dict:
    """Start ``argv`` in a session of its own (its pid is its group), detached from us.

    ``req["private_tmp"]`` (``{"size": bytes or null}``): in a private /tmp and
    /dev/shm, made here as this account in a user namespace of its own.
    """
    preexec = None
    tmp = (req or {}).get("private_tmp")
    if tmp is not None:
        size = tmp.get("size") if isinstance(tmp, dict) else "bad"
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or not 0 < size < 1 << 50):
            raise Refused("private_tmp must be {'size': a positive number of bytes or null}")
        keep = [os.path.realpath(me().pw_dir), os.path.realpath(sys.prefix), GPULAB_IMPORT_ROOT]

        def preexec() -> None:
            private_tmp(size, keep=keep, user_namespace=True)

    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
            close_fds=True,
            preexec_fn=preexec,
        )
    except (OSError, subprocess.SubprocessError) as e:
        what = "make a private /tmp for" if isinstance(e, subprocess.SubprocessError) and tmp is not None else "start"
        raise Refused(f"cannot {what} {argv[0]}: {e}") from None
    return {"ok": True, "pid": proc.pid}


def start_server(req: dict) -> dict:
    singleuser = str(Path(sys.executable).with_name("jupyterhub-singleuser"))
    args = strings(req.get("args", []), "args")
    env = clean_env(req.get("env", {}))
    argv = [singleuser, *args]
    cap = req.get("output_max_bytes")
    if cap is not None:  # the server's output into a bounded file of this account's, not the hub's log
        if not isinstance(cap, int) or isinstance(cap, bool) or not 4096 <= cap < 1 << 40:
            raise Refused("output_max_bytes must be a number of bytes from 4096")
        log = server_log_path(me().pw_dir, env.get("JUPYTERHUB_SERVER_NAME", ""))
        argv = capture_argv(sys.executable, log, cap) + argv
        return start(argv, env, me().pw_dir, subprocess.DEVNULL, req)
    # Without a capture the server logs where the hub logs: our stderr is the hub's.
    return start(argv, env, me().pw_dir, 2, req)


#: What the job runner runs: a notebook with papermill (it writes an output notebook) or a script.
JOB_KINDS = ("notebook", "script")


def start_job(req: dict) -> dict:
    kind = req.get("kind", "notebook")
    if kind not in JOB_KINDS:
        raise Refused(f"kind must be one of {', '.join(JOB_KINDS)}")
    fields: dict[str, str] = {}
    for key in ("input", "output", "cwd", "status", "log", "checkpoint"):
        value: Any = req.get(key)
        if key == "checkpoint" and not value or key == "output" and kind == "script" and not value:
            continue  # optional: a job without a checkpoint folder, a script's (absent) output notebook
        # The checkpoint folder's real place must be in the home too: a symlink out of it is refused here.
        inside_home(value, must_exist=key in ("input", "cwd"))
        fields[key] = value  # a string: inside_home refused anything else
    attempt = req.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 < attempt < 1_000_000:
        raise Refused("attempt must be a positive integer")
    nproc = _int(req.get("nproc", 1), "nproc", lo=1, hi=1024)
    grace = req.get("grace", 10.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0 <= grace <= 86400:
        raise Refused("grace must be a number of seconds from 0 to 86400")
    # A status file left by an earlier hub with the same job id must not be read as this run's.
    Path(fields["status"]).unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        RUNNER_MODULE,
        *(a for key, value in fields.items() for a in (f"--{key}", value)),
        "--attempt",
        str(attempt),
        "--kind",
        kind,
        "--grace",
        str(float(grace)),
        "--nproc",
        str(nproc),
    ]
    return start(argv, clean_env(req.get("env", {})), fields["cwd"], subprocess.DEVNULL, req)


def _int(value: Any, what: str, lo: int = 0, hi: int = (1 << 62) - 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise Refused(f"{what} must be an integer from {lo} to {hi}")
    return value


def send_signal(req: dict) -> dict:
    """A signal to one of this account's processes (or its group), identified by pid and start time."""
    pid = _int(req.get("pid"), "pid", lo=2)
    sig = req.get("signal")
    if sig not in SIGNALS:
        raise Refused(f"signal must be one of {sorted(SIGNALS)}")
    started = req.get("started")
    if started is not None:
        started = _int(started, "started")
    # Gone, another account's pid, or a later process of ours: not the one the hub means.
    send = processes.signal_group if req.get("group") else processes.signal_process
    return {"ok": True, "alive": send(pid, os.getuid(), started, sig)}


def read(req: dict) -> dict:
    """A file below this account's home: never through a symlink, only a regular file, bounded."""
    offset = _int(req.get("offset", 0), "offset")
    limit = _int(req.get("limit", 0), "limit")
    max_size = req.get("max_size")
    if max_size is not None:
        max_size = _int(max_size, "max_size")
    path = req.get("path")
    if not isinstance(path, str):
        raise Refused("path must be a string")
    found = home_files.read_beneath(me().pw_dir, path, offset, min(limit, MAX_READ), max_size)
    reply: dict[str, Any] = {"ok": True, "state": found.state, "size": found.size}
    if found.detail:
        reply["detail"] = found.detail[:200]
    if found.data:
        reply["data"] = base64.b64encode(found.data).decode()
    return reply


def keep_copy(req: dict) -> dict:
    """Copy the regular file ``source`` to the new file ``target``, both below this account's home
    (:func:`home_files.copy_to_new_file`). ``created`` is false when the target exists already."""
    max_size = _int(req.get("max_size"), "max_size", lo=1, hi=MAX_READ)
    source, target = req.get("source"), req.get("target")
    if not isinstance(source, str) or not isinstance(target, str):
        raise Refused("source and target must be strings")
    found, created = home_files.copy_to_new_file(me().pw_dir, source, target, max_size)
    return {"ok": True, "state": found.state, "size": found.size, "detail": found.detail[:200], "created": created}


#: The file in a home that names the hub using the account (see :func:`prepare_home`).
OWNER_MARKER = ".gpulab/hub"


def prepare_home(req: dict) -> dict:
    """Make the home ``0700``; claim it for the asking hub, or say which hub holds it.

    ``hub``: the asking hub's identity. A home whose marker names another hub is
    left as it is and answered with ``"owner"``: two hubs with one account prefix
    would otherwise share accounts and homes.
    """
    account = me()
    home = account.pw_dir
    hub = req.get("hub", "")
    if not isinstance(hub, str) or len(hub) > 1000 or "\0" in hub or "\n" in hub:
        raise Refused("hub must be a one-line string")
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise Refused(
            f"the home {home} of {account.pw_name} does not exist: create the account "
            "with its home (useradd --create-home)"
        ) from None
    except OSError as e:
        raise Refused(f"the home {home} of {account.pw_name} is not a folder: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != account.pw_uid:
            raise Refused(f"the home {home} is not owned by {account.pw_name}")
        if st.st_mode & 0o777 != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    reply: dict[str, Any] = {"ok": True, "name": account.pw_name, "uid": account.pw_uid, "home": home}
    if hub:
        marker = f"{home}/{OWNER_MARKER}"
        try:
            home_files.write_new_file(home, marker, hub.encode() + b"\n")
        except home_files.Beneath as e:
            raise Refused(f"~/{OWNER_MARKER} cannot be written: {e.state} {e.detail}") from None
        found = home_files.read_beneath(home, marker, 0, 4096, 4096)
        if found.state != home_files.OK:
            raise Refused(f"~/{OWNER_MARKER} cannot be read: {found.state}")
        reply["owner"] = found.data.decode(errors="replace").strip()
    return reply


ACTIONS = {
    "start-server": start_server,
    "start-job": start_job,
    "signal": send_signal,
    "read": read,
    "keep-copy": keep_copy,
    "prepare-home": prepare_home,
}


def answer(request: Any) -> dict:
    if os.getuid() == 0 or os.geteuid() == 0:
        raise Refused("gpulab-launch does not run as root (the sudoers rule must name the users' group)")
    if not isinstance(request, dict) or request.get("action") not in ACTIONS:
        raise Refused(f"action must be one of {sorted(ACTIONS)}")
    return ACTIONS[request["action"]](request)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        print("gpulab-launch takes no arguments: it reads one JSON request on stdin", file=sys.stderr)
        return 2
    try:
        os.chdir(me().pw_dir)  # not the hub's folder, which this account may not enter
    except OSError:
        os.chdir("/")
    try:
        raw = sys.stdin.buffer.read(MAX_REQUEST + 1)
        if len(raw) > MAX_REQUEST:
            raise Refused("request too large")
        try:
            request = json.loads(raw)
        except (ValueError, RecursionError):  # Python's parser recurses: deep nesting is a refusal too
            raise Refused("the request is not JSON of a depth this program reads") from None
        reply = answer(request)
    except Refused as e:
        reply = {"ok": False, "error": str(e)}
    except OSError as e:
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    except Exception as e:  # never a traceback: the hub shows this line to the user
        reply = {"ok": False, "error": f"gpulab-launch failed: {type(e).__name__}: {str(e)[:200]}"}
    sys.stdout.write(json.dumps(reply))
    sys.stdout.flush()
    return 0 if reply.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
