"""The embedded hub's demo login: named demo users, one shared demo password.

Deliberately loud about what it is: the login page says which users exist and
what the password is, and the hub refuses to start with it on anything but a
loopback address (see :func:`hub_config.config.embedded.check_bind_safe`).
"""

from __future__ import annotations

from secrets import compare_digest

from jupyterhub.auth import Authenticator
from traitlets import Unicode, default

from spawner.runtime import get_runtime


class DemoAuthenticator(Authenticator):
    """Demo users (the catalog's team members plus admins) with one shared password."""

    demo_password = Unicode(
        "gpulab-demo",
        config=True,
        help="""The password every demo user logs in with. Shown on the login page:
        this authenticator is for a laptop or a closed lab, never for a network.""",
    )

    @default("allow_all")
    def _allow_all_default(self) -> bool:
        return False

    def check_allowed(self, username: str, authentication: dict | None = None) -> bool:
        """Admins and configured users, plus every member of a team *now*.

        Team membership is read from the live catalog, so a user an admin adds
        to a team on the admin page can log in without a hub restart.
        """
        if super().check_allowed(username, authentication):
            return True
        catalog = get_runtime(config=self.config).catalog
        return any(username in team.users for team in catalog.teams.values())

    async def authenticate(self, handler, data):
        username = (data or {}).get("username", "")
        password = (data or {}).get("password", "")
        if not isinstance(username, str) or not isinstance(password, str):
            return None
        if not compare_digest(password.encode(), self.demo_password.encode()):
            self.log.warning("demo login refused for %r: wrong password", username[:64])
            return None
        return username
