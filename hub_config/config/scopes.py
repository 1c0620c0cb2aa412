"""gpulab's custom JupyterHub scopes and the roles that use them: one place."""

from __future__ import annotations

JOBS = "custom:gpulab:jobs"
ADMIN = "custom:gpulab:admin"
CULLER = "custom:gpulab:culler"

CUSTOM_SCOPES: dict[str, dict[str, str]] = {
    JOBS: {
        "description": "Submit, list, cancel and read the logs and outputs of one's own gpulab notebook jobs; "
        "read one's own GPU session, quota and idle warnings; press 'keep my GPU'.",
    },
    ADMIN: {
        "description": "Administer gpulab: teams, quotas, profiles, every user's jobs, usage and audit log.",
    },
    CULLER: {
        "description": "Record GPU idle warnings and reclaims (the gpulab idle culler service).",
    },
}

#: Scopes every logged-in user gets for their own resources (JupyterHub's
#: ``!user`` filter resolves to the owner).
USER_SCOPES = ["self", f"{JOBS}!user"]

#: Scopes the single-user server's token carries so the lab extension can
#: forward requests to the hub on the user's behalf, and nothing more:
#: ``delete:servers!server`` lets the server stop itself ("Stop server and
#: release GPU" in the sidebar), not any other server.
SERVER_TOKEN_SCOPES = ["access:servers!server", "delete:servers!server", "users:activity!user", f"{JOBS}!user"]


def roles(admin_users: list[str] | None = None) -> list[dict]:
    """``c.JupyterHub.load_roles`` entries for gpulab (merged with the defaults)."""
    out = [
        {"name": "user", "scopes": list(USER_SCOPES)},
        {"name": "server", "scopes": list(SERVER_TOKEN_SCOPES)},
        {
            "name": "gpulab-admin",
            "description": "gpulab administrators",
            "scopes": [ADMIN, JOBS, "admin-ui", "list:users", "read:users", "read:servers"],
            "users": list(admin_users or []),
        },
    ]
    return out


#: The GPU idle culler service (docs/idle-culler.md): list servers with
#: their spawner state (pod name / devices), stop idle ones, record warnings and
#: reclaims. ``access:servers`` only for shutting down single kernels on the
#: single-server (NVML) mode; drop it on Kubernetes.
CULLER_SERVICE_SCOPES = ["list:users", "read:servers", "admin:server_state", "delete:servers", CULLER, "access:servers"]
