"""Teams from the identity provider (spawner.core.identity): rules, claims, grants."""

from __future__ import annotations

import pytest

from spawner.core.catalog import catalog_from_dict
from spawner.core.identity import (
    DepartmentGrant,
    IdentityRuleError,
    TeamGrant,
    grants,
    map_identity,
    rules_from_config,
)

RULES = rules_from_config(
    [
        {"group": "ml-vision", "team": "vision"},
        {"claim": "oauth_user.department", "value": "research", "team": "nlp", "department": "research"},
        {"claim": "oauth_user.groups", "value": "/gpu/vision", "team": "vision"},
    ]
)


def test_groups_and_claims_grant_teams_with_evidence():
    got = map_identity(RULES, ["ml-vision", "staff"], {"oauth_user": {"department": "research"}})
    assert got.teams == ("nlp", "vision") and got.departments == ("research",)
    assert got.matched == (
        "group 'ml-vision' -> team vision",
        "claim oauth_user.department='research' -> team nlp (department research)",
    )
    # a list claim that holds the value
    assert map_identity(RULES, [], {"oauth_user": {"groups": ["/gpu/vision", "/all"]}}).teams == ("vision",)
    # nothing matches: no team
    assert map_identity(RULES, ["staff"], {"oauth_user": {"department": "sales"}}).teams == ()
    assert map_identity(RULES, [], None).teams == ()


@pytest.mark.parametrize(
    "claim",
    [
        {"$ne": ""},  # an object where a string belongs
        12,
        ["research", {"team": "vision"}],  # a list holding something else
        ["x"] * 1001,  # more values than any claim needs
        ["research\nvision"],  # control characters
        ["r" * 300],
    ],
)
def test_a_tampered_or_malformed_claim_grants_nothing_and_says_why(claim):
    got = map_identity(RULES, [], {"oauth_user": {"department": claim}})
    assert got.teams == () and got.ignored and "ignored" in got.ignored[0]


def test_a_claim_value_never_names_a_team_by_itself():
    # a claim saying "team: vision" grants nothing: only the rules name teams
    assert map_identity(RULES, [], {"oauth_user": {"department": "vision", "team": "vision"}}).teams == ()


def test_a_grant_is_its_own_type_no_group_name_can_pass_for_it():
    catalog = catalog_from_dict(
        {
            "profiles": [{"slug": "cpu", "display_name": "CPU", "gpus": 0}],
            "teams": [{"name": "vision", "users": [], "guarantee": 1, "burst": 1}],
        },
        "test",
    )
    assert [t.name for t in catalog.teams_for("alice", [TeamGrant("vision")])] == ["vision"]
    assert catalog.teams_for("alice", ["vision"]) == []  # a JupyterHub group named like the team: no
    assert catalog.teams_for("alice", [TeamGrant("ghost")]) == []  # a grant of a team that does not exist


@pytest.mark.parametrize(
    ("rules", "words"),
    [
        ({"group": "x", "team": "vision"}, "must be a list"),
        (["ml"], "a rule is an object"),
        ([{"group": "x"}], "give a 'team', or a 'department'"),
        ([{"group": "x", "department": "Research"}], "'department'"),
        ([{"group": "x", "team": "Vision"}], "'team' must be a team name"),
        ([{"team": "vision"}], "either 'group' or 'claim'"),
        ([{"group": "x", "claim": "y", "value": "z", "team": "vision"}], "either 'group' or 'claim'"),
        ([{"claim": "dept", "team": "vision"}], "'value' must be"),
        ([{"group": "x", "value": "y", "team": "vision"}], "has no 'value'"),
        ([{"claim": "a..b", "value": "y", "team": "vision"}], "dotted path"),
        ([{"group": "", "team": "vision"}], "'group' must be"),
        ([{"group": "x", "team": "vision", "department": "R&D"}], "'department'"),
        ([{"group": "x", "team": "vision", "priority": 1}], "unknown key"),
    ],
)
def test_bad_rules_are_refused_with_their_index(rules, words):
    with pytest.raises(IdentityRuleError, match=words):
        rules_from_config(rules)


def _departments_catalog(vision_department: str | None):
    return catalog_from_dict(
        {
            "profiles": [{"slug": "cpu", "display_name": "CPU", "gpus": 0}],
            "departments": [{"name": "research", "guarantee": 2, "burst": 3}],
            "teams": [
                {"name": "vision", "users": [], "guarantee": 1, "burst": 1, "department": vision_department},
                {"name": "nlp", "users": [], "guarantee": 1, "burst": 1, "department": "research"},
                {"name": "ops", "users": [], "guarantee": 1, "burst": 1},
            ],
        },
        "test",
    )


def test_a_department_rule_grants_every_team_the_catalog_places_in_it_now():
    rules = rules_from_config([{"group": "research-all", "department": "research"}])
    got = map_identity(rules, ["research-all"], None)
    assert got.teams == () and got.whole_departments == ("research",) and got.departments == ("research",)
    assert got.matched == ("group 'research-all' -> every team of department research",)
    grant = grants(got)
    assert grant == (DepartmentGrant("research"),) and type(grant[0]) is DepartmentGrant
    assert [t.name for t in _departments_catalog("research").teams_for("carol", grant)] == ["nlp", "vision"]
    # an admin moves vision out of the department: the next spawn no longer has it
    assert [t.name for t in _departments_catalog(None).teams_for("carol", grant)] == ["nlp"]
    # no rule matched: nothing
    assert grants(map_identity(rules, ["staff"], None)) == ()


def test_a_department_beside_a_team_is_recorded_and_grants_only_the_team():
    rules = rules_from_config([{"group": "ml", "team": "ops", "department": "research"}])
    got = map_identity(rules, ["ml"], None)
    assert got.teams == ("ops",) and got.whole_departments == () and got.departments == ("research",)
    assert [t.name for t in _departments_catalog("research").teams_for("dan", grants(got))] == ["ops"]


def test_a_group_named_like_a_department_grants_nothing():
    catalog = _departments_catalog("research")
    assert catalog.teams_for("eve", ["research"]) == []  # a JupyterHub group, not a grant
    assert catalog.teams_for("eve", [DepartmentGrant("ghost")]) == []  # no such department
    assert catalog.teams_for("eve", [TeamGrant("research")]) == []  # a department is not a team
