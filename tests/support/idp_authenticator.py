"""An authenticator that answers from an identity provider's directory file: a test stand-in.

It imitates what JupyterHub documents an authenticator returns and what OAuthenticator
stores, so gpulab's identity rules meet the same shapes a real provider gives them:

- ``authenticate()`` returns the auth model dict JupyterHub documents ("Authenticators",
  *Authenticator-managed group membership*, JupyterHub 6 docs, reference/authenticators.md):
  ``{"name": ..., "groups": [...], "auth_state": {...}}``; with
  ``c.Authenticator.manage_groups = True`` JupyterHub sets the user's groups to ``groups``
  at every login.
- ``auth_state["oauth_user"]`` holds the provider's user info (its claims), as
  ``oauthenticator.OAuthenticator.build_auth_state_dict`` stores it.

The directory is a JSON file ``{user: {"password", "groups", "claims"}}`` the test edits
between logins, as an identity provider's admin would edit a user.
"""

from __future__ import annotations

import json
from pathlib import Path
from secrets import compare_digest

from jupyterhub.auth import Authenticator
from traitlets import Unicode


class DirectoryAuthenticator(Authenticator):
    directory_file = Unicode(
        config=True, help="JSON file {user: {password, groups, claims}}: the provider's directory."
    )

    async def authenticate(self, handler, data):
        name = (data or {}).get("username", "")
        password = (data or {}).get("password", "")
        entry = json.loads(Path(self.directory_file).read_text()).get(name)
        if not isinstance(entry, dict) or not compare_digest(str(entry.get("password", "")), str(password)):
            return None
        return {
            "name": name,
            "groups": list(entry.get("groups", [])),
            "auth_state": {"access_token": "not-a-real-token", "oauth_user": entry.get("claims", {})},
        }
