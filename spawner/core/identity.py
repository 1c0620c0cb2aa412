"""Teams from the identity provider: rules that map an authenticator's groups and claims to
gpulab teams, or to every team of a department.

Two sources, as JupyterHub's authenticators supply them:

- **groups**: the user's JupyterHub groups. With ``Authenticator.manage_groups = True`` an
  authenticator's ``authenticate()`` (and ``refresh_user()``) returns ``{"name": ...,
  "groups": [...]}`` and JupyterHub keeps the user's groups equal to that list
  (JupyterHub docs, "Authenticator-managed group membership"); OAuthenticator fills it from
  a claim (``auth_state_groups_key``). A rule ``{"group": "ml-vision", "team": "vision"}``.
- **claims**: values the authenticator stored in ``auth_state`` (OAuthenticator keeps the
  identity provider's user info under ``auth_state["oauth_user"]``, an OIDC provider's
  claims). A rule ``{"claim": "oauth_user.department", "value": "research", "team": "nlp"}``
  matches a string claim equal to ``value`` or a list claim that contains it; a dotted
  ``claim`` walks nested objects.

A claim of any other shape (a number, an object, a list holding anything but short
printable strings, more than :data:`MAX_CLAIM_VALUES` values) grants nothing, and the
reason is kept as evidence; a rule never turns a claim into a team name by itself (the
rules name the teams), so a forged value cannot name a team no rule names.

A rule may name a ``department`` instead of a team: it grants every team the catalog
places in that department (:class:`DepartmentGrant`), as the catalog stands at each spawn,
so a team an admin moves into or out of the department follows. A rule naming both a
team and a department grants the team; its department is recorded and shown.

The rule for changes (docs/configuration.md): the teams are taken at each login and on each
spawn or job from the groups JupyterHub holds then; a running server keeps the team it was
admitted in until it stops, and the next spawn uses the new teams.
Pure code: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import is_slug

#: Most values one claim may hold before it is ignored as not a claim gpulab reads.
MAX_CLAIM_VALUES = 1000
#: Longest group name or claim value a rule compares.
MAX_VALUE_CHARS = 256
#: Deepest dotted claim path.
MAX_CLAIM_DEPTH = 8

_RULE_KEYS = {"group", "claim", "value", "team", "department"}


class TeamGrant(str):
    """A team the identity rules grant, passed among a user's group names.

    The policy core matches a user's JupyterHub group names against the teams' ``groups``;
    a grant travels in the same list but is its own type, so no JupyterHub group (a plain
    ``str``), whatever its name, can pass for one (:meth:`spawner.core.catalog.Catalog.teams_for`).
    """

    __slots__ = ()


class DepartmentGrant(str):
    """A department the identity rules grant whole: every team the catalog places in it.

    Travels among a user's group names like :class:`TeamGrant`, as its own type.
    """

    __slots__ = ()


class IdentityRuleError(ValueError):
    """A ``team_rules`` entry that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class TeamRule:
    """One mapping: a JupyterHub group (``claim`` None) or a claim value -> a team, or
    (``team`` None) every team of ``department``."""

    team: str | None
    group: str | None = None
    claim: str | None = None
    value: str | None = None
    department: str | None = None

    def describe(self) -> str:
        source = f"group {self.group!r}" if self.group is not None else f"claim {self.claim}={self.value!r}"
        if self.team is None:
            return f"{source} -> every team of department {self.department}"
        return f"{source} -> team {self.team}" + (f" (department {self.department})" if self.department else "")


def _text(value: object, what: str, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_VALUE_CHARS or not value.isprintable():
        raise IdentityRuleError(f"{where}: '{what}' must be a non-empty printable string of at most {MAX_VALUE_CHARS}")
    return value


def rules_from_config(data: object) -> tuple[TeamRule, ...]:
    """``c.GPULabIdentity.team_rules`` as rules; :class:`IdentityRuleError` names every bad entry."""
    if not isinstance(data, (list, tuple)):
        raise IdentityRuleError("team_rules must be a list of rules")
    rules, problems = [], []
    for n, entry in enumerate(data):
        where = f"team_rules[{n}]"
        try:
            if not isinstance(entry, Mapping):
                raise IdentityRuleError(
                    f"{where}: a rule is an object such as {{'group': 'ml-vision', 'team': 'vision'}}"
                )
            unknown = sorted(str(k) for k in entry if k not in _RULE_KEYS)
            if unknown:
                raise IdentityRuleError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
            team = entry.get("team")
            department = entry.get("department")
            if department is not None and not is_slug(department):
                raise IdentityRuleError(f"{where}: 'department' must be a name like a team's")
            if team is None and department is None:
                raise IdentityRuleError(f"{where}: give a 'team', or a 'department' for every team in it")
            if team is not None and not is_slug(team):
                raise IdentityRuleError(f"{where}: 'team' must be a team name (lower-case letters, digits and '-')")
            if ("group" in entry) == ("claim" in entry):
                raise IdentityRuleError(f"{where}: give either 'group' or 'claim' (with 'value')")
            if "group" in entry:
                if "value" in entry:
                    raise IdentityRuleError(f"{where}: a group rule has no 'value' (the group is the value)")
                rules.append(TeamRule(team, group=_text(entry["group"], "group", where), department=department))
            else:
                claim = _text(entry["claim"], "claim", where)
                if len(claim.split(".")) > MAX_CLAIM_DEPTH or "" in claim.split("."):
                    raise IdentityRuleError(f"{where}: 'claim' is a dotted path of at most {MAX_CLAIM_DEPTH} names")
                value = _text(entry.get("value"), "value", where)
                rules.append(TeamRule(team, claim=claim, value=value, department=department))
        except IdentityRuleError as e:
            problems.append(str(e))
    if problems:
        raise IdentityRuleError("; ".join(problems))
    return tuple(rules)


def claim_values(auth_state: Mapping[str, Any] | None, path: str) -> tuple[frozenset[str], str]:
    """The string values of the claim at dotted ``path`` and ``""``, or no values and why not."""
    node: Any = auth_state or {}
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return frozenset(), ""  # absent: nothing to say
        node = node[part]
    values = [node] if isinstance(node, str) else node
    if not isinstance(values, (list, tuple)):
        return frozenset(), f"claim {path} is {type(node).__name__}, not a string or a list of strings: ignored"
    if len(values) > MAX_CLAIM_VALUES:
        return frozenset(), f"claim {path} holds {len(values)} values, more than {MAX_CLAIM_VALUES}: ignored"
    if not all(isinstance(v, str) and len(v) <= MAX_VALUE_CHARS and v.isprintable() for v in values):
        return frozenset(), f"claim {path} holds something other than short printable strings: ignored"
    return frozenset(values), ""


@dataclass(frozen=True)
class IdentityTeams:
    """What the rules grant a user: teams, departments, and the evidence for each."""

    teams: tuple[str, ...] = ()
    #: Every department a matching rule names (granted whole or recorded beside a team).
    departments: tuple[str, ...] = ()
    #: The departments granted whole: every team the catalog places in them.
    whole_departments: tuple[str, ...] = ()
    #: The rules that matched, in words.
    matched: tuple[str, ...] = ()
    #: Claims that were present but of a shape no rule reads.
    ignored: tuple[str, ...] = field(default_factory=tuple)


def map_identity(
    rules: Iterable[TeamRule], groups: Iterable[str], auth_state: Mapping[str, Any] | None
) -> IdentityTeams:
    """The teams ``rules`` grant a user with JupyterHub ``groups`` and ``auth_state`` claims."""
    group_set = {g for g in groups if isinstance(g, str)}
    cache: dict[str, tuple[frozenset[str], str]] = {}
    teams: set[str] = set()
    departments: set[str] = set()
    whole: set[str] = set()
    matched: list[str] = []
    ignored: list[str] = []
    for rule in rules:
        if rule.group is not None:
            hit = rule.group in group_set
        else:
            assert rule.claim is not None
            if rule.claim not in cache:
                cache[rule.claim] = claim_values(auth_state, rule.claim)
                if cache[rule.claim][1]:
                    ignored.append(cache[rule.claim][1])
            hit = rule.value in cache[rule.claim][0]
        if hit:
            if rule.team is not None:
                teams.add(rule.team)
            elif rule.department:
                whole.add(rule.department)
            if rule.department:
                departments.add(rule.department)
            matched.append(rule.describe())
    return IdentityTeams(
        tuple(sorted(teams)), tuple(sorted(departments)), tuple(sorted(whole)), tuple(matched), tuple(ignored)
    )


def grants(granted: IdentityTeams) -> tuple[TeamGrant | DepartmentGrant, ...]:
    """What travels among a user's group names for :meth:`Catalog.teams_for` to resolve."""
    return (*(TeamGrant(t) for t in granted.teams), *(DepartmentGrant(d) for d in granted.whole_departments))
