"""``gpulab-launch``: what a non-root hub runs, through sudo, as a user's account.

The hub runs ``sudo -n -u <account> -- <venv>/bin/gpulab-launch`` with a
fixed argument list (none) and writes one JSON request to its stdin; this
program answers with one JSON object on stdout. The sudoers rule
(``scripts/gpulab.sudoers``) lets the hub's account run exactly this program,
as members of the users' group only, so the hub never needs root.

It can do five things, each as the account it runs as, nothing else:

- ``start-server``: start ``jupyterhub-singleuser`` (the one next to this
  program's interpreter) with the arguments and environment in the request;
- ``start-job``: start the notebook job runner (``hub_config.jobs.runner``)
  of the same interpreter;
- ``signal``: send a signal to one of this account's processes (or its group);
- ``read``: read a file inside this account's home (the job log, output
  notebook and exit status, which the hub cannot read itself);
- ``prepare-home``: make the home ``0700`` and report the account.

Tokens (``JUPYTERHUB_API_TOKEN``) travel in the request on stdin, never on a
command line; the started program gets them in its environment, which only
its own uid (and root) can read. The environment is the hub's explicit list,
minus variables that would change what a fixed program runs (``LD_PRELOAD``,
``PYTHONPATH``, ...); ``HOME``, ``USER``, ``LOGNAME`` and ``SHELL`` come from
the account database, not from the hub.

Standard library only: it starts fast, and what runs as the user is small.
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

from spawner.namespaces import private_tmp
from spawner.output_capture import capture_argv, server_log_path

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
        keep = [os.path.realpath(me().pw_dir), os.path.realpath(sys.prefix)]

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


def start_job(req: dict) -> dict:
    fields: dict[str, str] = {}
    for key in ("input", "output", "cwd", "status", "log"):
        value: Any = req.get(key)
        inside_home(value, must_exist=key in ("input", "cwd"))
        fields[key] = value  # a string: inside_home refused anything else
    attempt = req.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 < attempt < 1_000_000:
        raise Refused("attempt must be a positive integer")
    # A status file left by an earlier hub with the same job id must not be read as this run's.
    Path(fields["status"]).unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        RUNNER_MODULE,
        "--input",
        fields["input"],
        "--output",
        fields["output"],
        "--cwd",
        fields["cwd"],
        "--status",
        fields["status"],
        "--log",
        fields["log"],
        "--attempt",
        str(attempt),
    ]
    return start(argv, clean_env(req.get("env", {})), fields["cwd"], subprocess.DEVNULL, req)


def process_owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def send_signal(req: dict) -> dict:
    pid, sig = req.get("pid"), req.get("signal")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        raise Refused("pid must be an integer above 1")
    if sig not in SIGNALS:
        raise Refused(f"signal must be one of {sorted(SIGNALS)}")
    if process_owner(pid) != os.getuid():
        return {"ok": True, "alive": False}  # gone, or another account's pid now: not ours to touch
    try:
        if req.get("group"):
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return {"ok": True, "alive": False}
    return {"ok": True, "alive": True}


def read(req: dict) -> dict:
    offset, limit = req.get("offset", 0), req.get("limit", MAX_READ)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, limit)):
        raise Refused("offset and limit must be non-negative integers")
    path = req.get("path")
    try:
        real = inside_home(path)
    except Refused as e:
        return {"ok": True, "state": "outside", "error": str(e)}
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return {"ok": True, "state": "absent"}
    except PermissionError:
        return {"ok": True, "state": "denied"}
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not (st.st_mode & 0o170000 == 0o100000):
            return {"ok": True, "state": "not-a-file"}
        f.seek(offset)
        data = f.read(min(limit, MAX_READ))
    return {"ok": True, "state": "ok", "real": str(real), "size": st.st_size, "data": base64.b64encode(data).decode()}


def prepare_home(req: dict) -> dict:
    account = me()
    home = Path(account.pw_dir)
    try:
        st = home.lstat()
    except FileNotFoundError:
        raise Refused(
            f"the home {home} of {account.pw_name} does not exist: create the account "
            "with its home (useradd --create-home)"
        ) from None
    if st.st_uid != account.pw_uid:
        raise Refused(f"the home {home} is not owned by {account.pw_name}")
    if st.st_mode & 0o777 != 0o700:
        os.chmod(home, 0o700)
    return {"ok": True, "name": account.pw_name, "uid": account.pw_uid, "home": str(home)}


ACTIONS = {
    "start-server": start_server,
    "start-job": start_job,
    "signal": send_signal,
    "read": read,
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
        except ValueError:
            raise Refused("the request is not JSON") from None
        reply = answer(request)
    except Refused as e:
        reply = {"ok": False, "error": str(e)}
    except OSError as e:
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(reply))
    sys.stdout.flush()
    return 0 if reply.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
