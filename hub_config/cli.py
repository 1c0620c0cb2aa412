"""The ``gpulab`` command: ``gpulab up``, ``gpulab check-config FILE``,
``gpulab prepuller-values FILE`` (z2jh values that pre-pull the catalog's images),
``gpulab sudoers`` (the drop-in a non-root hub needs) and ``gpulab check-isolation``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from spawner.core.catalog import Catalog, CatalogError, catalog_from_dict
from spawner.core.catalog.sharing import known_gpu_models as sharing_known_models
from spawner.core.catalog.yaml_text import catalog_from_yaml, gpu_model_issues
from spawner.core.units import format_gpus
from spawner.kube.conventions import prepuller_extra_images
from spawner.local.nvml import detect_gpus

CONFIG = Path(__file__).with_name("jupyterhub_config.py")


def check_config(path: str, kubernetes: bool = False) -> int:
    """Validate a teams/profiles YAML file; print every problem, one per line, in file order.

    A profile's GPU model must be one this server has (its NVML devices or its
    declared inventory): an error on a single server. With ``kubernetes`` it
    must be one the sharing backends know a node selector for: a warning, as
    a cluster may gain nodes.
    """
    try:
        text = Path(path).read_text()
    except OSError as e:
        print(f"{path}: cannot read: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        catalog = catalog_from_yaml(text, path)
    except CatalogError as e:
        issues = sorted(e.issues, key=lambda i: (i.line is None, i.line or 0))
        for issue in issues:
            print(issue.format(path))
        print(f"{path}: {len(issues)} problem(s) found", file=sys.stderr)
        return 1
    model_issues = gpu_model_issues(text, known_gpu_models(catalog, kubernetes))
    if model_issues and not kubernetes:
        for issue in model_issues:
            print(issue.format(path))
        print(
            f"{path}: {len(model_issues)} problem(s) found (a single server offers only the GPUs it has)",
            file=sys.stderr,
        )
        return 1
    for issue in model_issues:
        print("warning: " + issue.format(path))
    print(f"{path}: OK: {len(catalog.teams)} team(s), {len(catalog.profiles)} profile(s)")
    for team in catalog.teams.values():
        profiles = ", ".join(p.slug for p in catalog.profiles_for(team)) or "none"
        print(
            f"  team {team.name}: guarantee {format_gpus(team.guarantee_milli)} GPU, "
            f"burst {format_gpus(team.burst_milli)} GPU; profiles: {profiles}"
        )
    return 0


def prepuller_values(path: str) -> int:
    """Print z2jh values pre-pulling every image of a catalog (or of a gpulab chart values file)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        print(f"{path}: cannot read: {e}", file=sys.stderr)
        return 2
    if isinstance(data, dict) and isinstance(data.get("gpulab"), dict):
        data = data["gpulab"]  # the gpulab chart's values: the catalog is its `gpulab:` block
    try:
        images = prepuller_extra_images(catalog_from_dict(data, path))
    except (CatalogError, ValueError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    print("# z2jh values: pass with -f to the jupyterhub release (gpulab prepuller-values " + path + ")")
    print(yaml.safe_dump({"prePuller": {"extraImages": images}}, sort_keys=True), end="")
    return 0


def known_gpu_models(catalog: Catalog, kubernetes: bool) -> set[str]:
    """GPU models profiles may name: this server's (NVML asked here), or those the cluster's backends can select."""
    detected = [] if kubernetes else [d.model for d in detect_gpus() or []]
    return sharing_known_models(catalog, kubernetes, detected)


def sudoers(args: argparse.Namespace) -> int:
    """Print the sudoers drop-in for a hub running as ``--hub-user`` (see docs/single-server.md)."""
    from spawner.local.sudo import sudoers_rule

    try:
        print(
            sudoers_rule(
                args.hub_user,
                args.mediator,
                group=args.group,
                prefix=args.prefix,
                home_root=args.home_root,
                shell=args.shell,
                create_accounts=not args.no_create,
            ),
            end="",
        )
    except ValueError as e:
        print(f"gpulab sudoers: {e}", file=sys.stderr)
        return 2
    return 0


def check_isolation() -> int:
    """Say which mode a hub started by this account would run in: root, sudo or not isolated."""
    from spawner.local.accounts import UserAccounts
    from spawner.local.confinement import Confiner, LimitsUnavailable, UserLimits
    from spawner.local.sudo import NONE, isolation_mode

    accounts = UserAccounts()
    mode, why = isolation_mode(accounts.mediator, accounts.sudo)
    print(f"isolation mode: {mode} ({why})")
    try:  # what a hub of this account gets: limits, GPU device rules, private /tmp
        for line in Confiner(UserLimits(), mode).status.lines():
            print(line)
    except LimitsUnavailable as e:
        print(f"limits: {e}", file=sys.stderr)
    if mode == NONE:
        print(
            "users would NOT be isolated: run the hub as root, or install the drop-in from "
            "`gpulab sudoers` (docs/single-server.md#the-sudoers-rule)",
            file=sys.stderr,
        )
        return 1
    return 0


def up(args: argparse.Namespace, extra: list[str]) -> int:
    """Start the embedded hub (exec jupyterhub with gpulab's config)."""
    env = os.environ
    env.setdefault("GPULAB_BIND", f"http://{args.ip}:{args.port}")
    if args.catalog:
        env["GPULAB_CATALOG"] = str(Path(args.catalog).resolve())
    if args.data_dir:
        env["GPULAB_DATA_DIR"] = str(Path(args.data_dir).resolve())
    jupyterhub = Path(sys.executable).with_name("jupyterhub")
    cmd = [str(jupyterhub), "-f", str(CONFIG), *extra]
    print(f"gpulab: starting the embedded hub on {env['GPULAB_BIND']}", file=sys.stderr, flush=True)
    os.execv(cmd[0], cmd)
    return 0  # not reached


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpulab", description="Self-service fractional GPUs for JupyterHub.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the embedded single-server hub")
    p_up.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p_up.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p_up.add_argument("--catalog", help="teams/profiles YAML (default: the demo teams)")
    p_up.add_argument("--data-dir", help="where the hub keeps its state (default ./.gpulab)")
    p_check = sub.add_parser("check-config", help="validate a teams/profiles YAML file")
    p_check.add_argument("file")
    p_check.add_argument(
        "--kubernetes",
        action="store_true",
        help="check for a Kubernetes cluster (unknown GPU models warn) instead of this server",
    )
    p_pull = sub.add_parser("prepuller-values", help="print z2jh prePuller.extraImages for a catalog's images")
    p_pull.add_argument("file", help="a catalog YAML, or the gpulab chart's values file")
    p_sudo = sub.add_parser("sudoers", help="print the sudoers drop-in a non-root hub needs to isolate users")
    p_sudo.add_argument("--hub-user", default=_current_user(), help="the account the hub runs as")
    p_sudo.add_argument(
        "--group", default="jupyterhub-users", help="the group of the users' accounts (GPULAB_ACCOUNT_GROUP)"
    )
    p_sudo.add_argument(
        "--mediator",
        default=str(Path(sys.executable).with_name("gpulab-launch")),
        help="path of gpulab-launch (default: next to this interpreter)",
    )
    p_sudo.add_argument(
        "--prefix",
        default=os.environ.get("GPULAB_ACCOUNT_PREFIX", "jupyter-"),
        help="account name prefix (GPULAB_ACCOUNT_PREFIX)",
    )
    p_sudo.add_argument(
        "--home-root",
        default=os.environ.get("GPULAB_HOME_ROOT", "/home"),
        help="where created accounts get their homes (GPULAB_HOME_ROOT)",
    )
    p_sudo.add_argument("--shell", default="/bin/bash", help="login shell of created accounts")
    p_sudo.add_argument(
        "--no-create", action="store_true", help="no useradd rule: the admin creates the accounts ahead"
    )
    sub.add_parser("check-isolation", help="say whether a hub run by this account isolates users (root/sudo)")
    args, extra = parser.parse_known_args(argv)
    if args.command in ("sudoers", "check-isolation"):
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return sudoers(args) if args.command == "sudoers" else check_isolation()
    if args.command in ("check-config", "prepuller-values"):
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command == "prepuller-values":
            return prepuller_values(args.file)
        return check_config(args.file, kubernetes=args.kubernetes)
    return up(args, extra)


if __name__ == "__main__":
    sys.exit(main())
