"""Teams from the identity provider through a real hub and a real authenticator path.

The hub's authenticator is :class:`tests.support.idp_authenticator.DirectoryAuthenticator`
(JupyterHub's documented auth model: ``name``, ``groups`` with ``manage_groups``, and the
provider's claims in ``auth_state["oauth_user"]``, as OAuthenticator stores them). The catalog
names nobody: every membership comes from ``c.GPULabIdentity.team_rules``.
"""

from __future__ import annotations

import html
import json

import pytest

from tests.support import REPO
from tests.support.catalogs import CPU_PROFILE, H100_HALF, h100_inventory
from tests.support.hub import RunningHub

CATALOG = (
    h100_inventory(2)
    + "profiles:\n"
    + CPU_PROFILE
    + H100_HALF
    + "departments:\n  - {name: research, guarantee: 2, burst: 2}\n"
    + """teams:
  - {name: vision, users: [], guarantee: 1, burst: 2}
  - {name: nlp, users: [], guarantee: 1, burst: 2, department: research}
"""
)
RULES = [
    {"group": "ml-vision", "team": "vision"},
    {"group": "nlp-people", "team": "nlp"},
    {"claim": "oauth_user.department", "value": "research", "team": "nlp", "department": "research"},
    {"group": "research-all", "department": "research"},
]
DIRECTORY = {
    "alice": {"password": "pw-alice", "groups": ["ml-vision", "staff"], "claims": {"department": "eng"}},
    "carol": {"password": "pw-carol", "groups": [], "claims": {"department": "research"}},
    "dora": {"password": "pw-dora", "groups": ["research-all"], "claims": {}},
    # a claim of a shape no rule reads (an injected object, a team named in a claim)
    "mallory": {
        "password": "pw-mallory",
        "groups": [],
        "claims": {"department": {"$in": ["research"]}, "team": "vision", "groups": ["vision"]},
    },
}


@pytest.fixture(scope="module")
def hub(start_hub, tmp_path_factory):
    directory = tmp_path_factory.mktemp("idp") / "directory.json"
    directory.write_text(json.dumps(DIRECTORY))
    extra = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
c.JupyterHub.authenticator_class = "tests.support.idp_authenticator.DirectoryAuthenticator"
c.DirectoryAuthenticator.directory_file = {str(directory)!r}
c.Authenticator.manage_groups = True
c.Authenticator.allow_all = True
c.GPULabIdentity.team_rules = {RULES!r}
"""
    hub = start_hub(CATALOG, extra_config=extra, env={"GPULAB_DEMO_AUTH": "0"})
    hub.directory = directory
    return hub


def identity(hub: RunningHub, user: str) -> dict:
    r = hub.api("GET", "/gpulab/identity", params={"user": user})
    assert r.status_code == 200, r.text
    [view] = r.json()["users"]
    return view


def test_teams_come_from_the_providers_groups_and_claims(hub):
    alice = hub.login("alice", "pw-alice")
    assert sorted(g for g in hub.api("GET", "/users/alice").json()["groups"]) == ["ml-vision", "staff"]
    page = html.unescape(hub.spawn_page(alice).text)
    assert 'value="vision:h100-half"' in page and 'value="nlp:' not in page
    view = identity(hub, "alice")
    assert view["member_of"] == ["vision"] and view["matched"] == ["group 'ml-vision' -> team vision"]
    r = hub.api("POST", "/users/alice/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice")
    # carol is in no group: her provider's department claim puts her in nlp (and its department)
    hub.login("carol", "pw-carol")
    view = identity(hub, "carol")
    assert view["member_of"] == ["nlp"] and view["departments"] == ["research"]
    assert view["teams_at_last_login"] == ["nlp"] and view["last_login"]


def test_a_tampered_claim_grants_no_team(hub):
    hub.login("mallory", "pw-mallory")
    view = identity(hub, "mallory")
    assert view["member_of"] == [] and view["teams"] == []
    assert view["ignored_at_last_login"] == [
        "claim oauth_user.department is dict, not a string or a list of strings: ignored"
    ]
    # naming the team in the spawn options does not make her a member
    r = hub.api("POST", "/users/mallory/server", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code == 403 and "not a member of any GPU team" in r.json()["message"], r.text
    assert "" not in hub.api("GET", "/users/mallory").json()["servers"]


def test_when_groups_change_a_running_server_keeps_its_team_and_the_next_spawn_uses_the_new(hub):
    assert hub.wait_server("alice")  # running in vision since the first test
    directory = json.loads(hub.directory.read_text())
    directory["alice"]["groups"] = ["nlp-people"]
    hub.directory.write_text(json.dumps(directory))
    hub.login("alice", "pw-alice")  # the provider's new groups arrive with the login
    assert hub.api("GET", "/users/alice").json()["groups"] == ["nlp-people"]
    assert hub.wait_server("alice")["ready"]
    [held] = [w for w in hub.holdings() if w["key"] == "notebook:alice/"]
    assert held["team"] == "vision"
    view = identity(hub, "alice")
    assert view["member_of"] == ["nlp"]
    assert view["kept_servers"] == [
        {"key": "notebook:alice/", "team": "vision", "kind": "notebook", "rule": "keeps its team until it stops"}
    ]
    r = hub.api("POST", "/users/alice/servers/second", json={"team": "vision", "profile": "h100-half"})
    assert r.status_code == 403 and "you are not a member of team 'vision'" in r.json()["message"], r.text
    r = hub.api("POST", "/users/alice/servers/second", json={"team": "nlp", "profile": "h100-half"})
    assert r.status_code in (201, 202), r.text
    hub.wait_server("alice", "second")
    for name in ("second", ""):
        hub.api("DELETE", f"/users/alice/servers/{name}" if name else "/users/alice/server")
        hub.wait_server("alice", name, ready=False)
    assert identity(hub, "alice")["kept_servers"] == []


def test_a_department_rule_grants_the_teams_the_catalog_places_in_it_at_each_spawn(hub):
    dora = hub.login("dora", "pw-dora")
    view = identity(hub, "dora")
    assert view["member_of"] == ["nlp"] and view["whole_departments"] == ["research"]
    assert view["matched"] == ["group 'research-all' -> every team of department research"]
    page = html.unescape(hub.spawn_page(dora).text)
    assert 'value="nlp:h100-half"' in page and 'value="vision:' not in page
    r = hub.api("POST", "/users/dora/server", json={"team": "vision", "profile": "cpu"})
    assert r.status_code == 403 and "not a member of team 'vision'" in r.json()["message"], r.text
    # an admin moves vision into the department: dora's next spawn has it, no login needed
    assert hub.api("PATCH", "/gpulab/teams/vision", json={"department": "research"}).status_code == 200
    try:
        assert identity(hub, "dora")["member_of"] == ["nlp", "vision"]
        r = hub.api("POST", "/users/dora/server", json={"team": "vision", "profile": "cpu"})
        assert r.status_code in (201, 202), r.text
        hub.wait_server("dora")
        hub.api("DELETE", "/users/dora/server")
        hub.wait_server("dora", ready=False)
    finally:
        assert hub.api("PATCH", "/gpulab/teams/vision", json={"department": None}).status_code == 200
    assert identity(hub, "dora")["member_of"] == ["nlp"]
