"""Teams from the identity provider, in the hub: the rules' config, each user's last login's
claims, and the teams they grant now.

At each login the hub's ``post_auth_hook`` (:func:`hub_config.config.identity.post_auth_hook`)
records, per user, the values of the claims the rules read (never the tokens, never the rest
of ``auth_state``) and what the rules granted then. On each spawn, job or spawn page the
rules are applied again, to those claims and to the user's JupyterHub groups as they are now
(``manage_groups`` keeps them equal to the identity provider's), so a group change the
authenticator's refresh brings takes effect at the next spawn, and a rule change at the next
restart. A running server keeps the team it was admitted in until it stops.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker
from traitlets import Any as TAny
from traitlets import List, TraitError, validate
from traitlets.config import Configurable

from hub_config.storage.db import Base, iso, utcnow
from spawner.core.identity import (
    DepartmentGrant,
    IdentityRuleError,
    IdentityTeams,
    TeamGrant,
    TeamRule,
    claim_values,
    grants,
    map_identity,
    rules_from_config,
)

log = logging.getLogger("gpulab.identity")


class GPULabIdentity(Configurable):
    """How the identity provider's groups and claims map to gpulab teams."""

    team_rules: List[Any] = List(
        config=True,
        help="""Rules granting teams from the authenticator: each
        `{"group": "ml-vision", "team": "vision"}` (a JupyterHub group, which the authenticator
        keeps with `c.Authenticator.manage_groups = True`) or
        `{"claim": "oauth_user.department", "value": "research", "team": "nlp"}` (a value the
        authenticator put in `auth_state`: a string equal to `value` or a list holding it;
        OAuthenticator keeps the provider's user info under `oauth_user`). A rule with
        `"department"` and no `"team"` grants every team the catalog places in that department
        (as the catalog stands at each spawn); beside a `"team"` the department is recorded and
        shown only. A team granted by a rule is joined as if the team listed the user. Checked at
        start: a bad rule stops the hub with its index.""",
    )

    operator_post_auth_hook = TAny(
        None,
        allow_none=True,
        config=True,
        help="""The `c.Authenticator.post_auth_hook` the operator had set before gpulab installed its
        own (set by `configure_gpulab`): called first, and gpulab's hook reads what it returns.""",
    )

    @validate("team_rules")
    def _valid_rules(self, proposal: dict[str, Any]) -> list[Any]:
        try:
            rules_from_config(proposal["value"])
        except IdentityRuleError as e:
            raise TraitError(f"c.GPULabIdentity.team_rules: {e}") from None
        return list(proposal["value"])

    def rules(self) -> tuple[TeamRule, ...]:
        return rules_from_config(self.team_rules)


class IdentityRow(Base):
    """What a user's last login said: the claims the rules read, and the teams granted then."""

    __tablename__ = "gpulab_identity"

    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    teams_json: Mapped[str] = mapped_column(Text)
    departments_json: Mapped[str] = mapped_column(Text)
    #: ``{"claims": {path: [values]}, "matched": [...], "ignored": [...]}``
    evidence_json: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime)


def _nested(claims: dict[str, list[str]]) -> dict[str, Any]:
    """``{"a.b": [...]}`` back into ``{"a": {"b": [...]}}`` (what the rules walk)."""
    out: dict[str, Any] = {}
    for path, values in claims.items():
        node = out
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[last] = list(values)
    return out


class IdentityBook:
    """The rules and each user's recorded login."""

    def __init__(self, sessions: sessionmaker[Session], rules: tuple[TeamRule, ...]):
        self.sessions = sessions
        self.rules = rules

    @property
    def claim_paths(self) -> list[str]:
        return sorted({r.claim for r in self.rules if r.claim is not None})

    def record_login(self, user: str, groups: list[str], auth_state: dict[str, Any] | None) -> IdentityTeams:
        """At a login: keep the claims the rules read, and what the rules grant now."""
        claims: dict[str, list[str]] = {}
        for path in self.claim_paths:
            values, _problem = claim_values(auth_state, path)
            if values:
                claims[path] = sorted(values)
        granted = map_identity(self.rules, groups, auth_state)
        evidence = {"claims": claims, "matched": list(granted.matched), "ignored": list(granted.ignored)}
        with self.sessions.begin() as s:
            row = s.get(IdentityRow, user)
            if row is None:
                row = IdentityRow(user=user)
                s.add(row)
            row.teams_json = json.dumps(list(granted.teams))
            row.departments_json = json.dumps(list(granted.departments))
            row.evidence_json = json.dumps(evidence, sort_keys=True)
            row.at = utcnow()
        for problem in granted.ignored:
            log.warning("gpulab identity: %s at the login of %s", problem, user)
        log.info(
            "gpulab identity: %s logged in; the rules grant team(s) %s%s",
            user,
            ", ".join(granted.teams) or "none",
            "".join(f", every team of department {d}" for d in granted.whole_departments),
        )
        return granted

    def _claims(self, user: str) -> dict[str, Any]:
        with self.sessions() as s:
            row = s.get(IdentityRow, user)
        if row is None:
            return {}
        return _nested(json.loads(row.evidence_json).get("claims", {}))

    def grants(self, user: str, groups: list[str]) -> tuple[TeamGrant | DepartmentGrant, ...]:
        """The teams and whole departments the rules grant ``user`` now: their groups now,
        their last login's claims."""
        if not self.rules:
            return ()
        claims = self._claims(user) if self.claim_paths else {}
        return grants(map_identity(self.rules, [g for g in groups if type(g) is str], claims))

    def explain(self, user: str, groups: list[str]) -> dict[str, Any]:
        """For the admin: what the rules grant ``user`` now and why, and what their last login said."""
        with self.sessions() as s:
            row = s.get(IdentityRow, user)
        claims = _nested(json.loads(row.evidence_json).get("claims", {})) if row is not None else {}
        now = map_identity(self.rules, [g for g in groups if type(g) is str], claims)
        return {
            "user": user,
            "teams": list(now.teams),
            "departments": list(now.departments),
            "whole_departments": list(now.whole_departments),
            "matched": list(now.matched),
            "last_login": iso(row.at) if row is not None else None,
            "teams_at_last_login": json.loads(row.teams_json) if row is not None else [],
            "ignored_at_last_login": json.loads(row.evidence_json).get("ignored", []) if row is not None else [],
        }

    def users(self) -> list[str]:
        with self.sessions() as s:
            return list(s.scalars(select(IdentityRow.user).order_by(IdentityRow.user)))
