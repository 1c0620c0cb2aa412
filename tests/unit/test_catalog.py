"""Catalog loading and validation, units, policy, and `gpulab check-config`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spawner.core.catalog import CatalogError, catalog_from_dict
from spawner.core.catalog.write import catalog_to_dict
from spawner.core.catalog.yaml_text import catalog_from_yaml
from spawner.core.ledger import Ledger
from spawner.core.policy import PolicyError, choices_for_user, resolve_request
from spawner.core.units import UnitError, format_gpus, parse_duration, parse_gpus, parse_memory
from spawner.runtime import GPULab
from tests.support import REPO

DEMO = REPO / "hub_config" / "demo-teams.yaml"


@pytest.mark.parametrize("value, milli", [(0.25, 250), ("0.5", 500), (2, 2000), ("7.5", 7500), (0.001, 1)])
def test_parse_gpus(value, milli):
    assert parse_gpus(value) == milli


@pytest.mark.parametrize("value", [-1, "0.0001", 0.2501, float("nan"), float("inf"), True, None, "1e9999", "x", [1]])
def test_parse_gpus_refuses(value):
    with pytest.raises(UnitError):
        parse_gpus(value)


@given(st.integers(0, 10**7))
def test_format_parse_roundtrip(milli):
    assert parse_gpus(format_gpus(milli)) == milli


def test_units_misc():
    assert parse_memory("16Gi") == 16 * 2**30 and parse_memory("8G") == 8 * 10**9
    assert parse_duration("1h30m") == 5400 and parse_duration(60) == 60
    with pytest.raises(UnitError):
        parse_duration("soon")


def test_demo_catalog_loads_and_roundtrips():
    c = catalog_from_yaml(DEMO.read_text(), str(DEMO))
    assert c.teams["vision"].burst_milli == 3000
    assert c.profiles["h100-half"].gpu_milli == 500
    again = catalog_from_dict(catalog_to_dict(c))
    assert again == c


BROKEN = """\
profiles:
  - slug: Bad_Slug
    gpus: 0.25
  - slug: ok
    gpus: 1.5
    priority_class: urgent
teams:
  - name: vision
    guarantee: 4
    burst: 2
    allowed_profiles: [ok, missing]
    per_usr_cap: 1
"""


def test_errors_name_file_line_key_and_problem():
    with pytest.raises(CatalogError) as e:
        catalog_from_yaml(BROKEN, "teams.yaml")
    text = str(e.value)
    assert "teams.yaml:2: profiles[0].slug: profile slug 'Bad_Slug' must be lowercase" in text
    assert "teams.yaml:5: profiles[1].gpus: 1.5 GPUs: more than one GPU must be a whole number" in text
    assert "teams.yaml:6: profiles[1].priority_class: unknown priority class 'urgent'" in text
    assert "teams.yaml:10: teams[0].burst: burst limit (2 GPUs) is below the guarantee (4 GPUs)" in text
    assert "teams.yaml:11: teams[0].allowed_profiles[1]: unknown profile 'missing'" in text
    assert "teams.yaml:12: teams[0].per_usr_cap: unknown key (did you mean 'per_user_cap'?)" in text


def test_invalid_yaml_reports_line():
    with pytest.raises(CatalogError) as e:
        catalog_from_yaml("teams:\n  - name: [unclosed\n", "x.yaml")
    assert "x.yaml:" in str(e.value) and "not valid YAML" in str(e.value)


def test_traitlets_config_merges_with_file(tmp_path):
    cfg = GPULab(catalog_file=str(DEMO), teams=[{"name": "extra", "users": ["zed"], "guarantee": 1}])
    c = cfg.load_catalog()
    assert set(c.teams) == {"vision", "nlp", "extra"}
    dup = GPULab(catalog_file=str(DEMO), teams=[{"name": "vision"}])
    with pytest.raises(CatalogError, match="duplicate team name 'vision'"):
        dup.load_catalog()
    missing = GPULab(catalog_file=str(tmp_path / "nope.yaml"))
    with pytest.raises(CatalogError, match="cannot read"):
        missing.load_catalog()


def test_check_config_cli(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "hub_config.cli", "check-config", str(DEMO)], capture_output=True, text=True, cwd=REPO
    )
    assert ok.returncode == 0 and "OK: 2 team(s), 6 profile(s)" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    out = subprocess.run(
        [sys.executable, "-m", "hub_config.cli", "check-config", str(bad)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 1
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith(f"{bad}:") for line in lines)


def test_policy_choices_and_resolution():
    c = catalog_from_yaml(DEMO.read_text(), "demo")
    ledger = Ledger(c.teams)
    choices = choices_for_user(c, ledger, "alice")
    assert {ch.team.name for ch in choices} == {"vision", "nlp"}
    assert all(ch.available for ch in choices)
    assert not any(ch.profile.slug == "h100-4" and ch.team.name == "vision" for ch in choices)
    with pytest.raises(PolicyError, match="several teams"):
        resolve_request(c, "alice", [], {"profile": "h100-half"})
    r = resolve_request(c, "bob", [], {"profile": "h100-half"})
    assert r.team.name == "vision" and r.milli == 500
    for bad, status in [
        ({"profile": "h100-4"}, 403),
        ({"profile": "nope"}, 400),
        ({"profile": "h100-half", "team": "nlp"}, 403),
        ({"profile": "h100-half", "gpus": 8}, 400),
        ({"profile": 5}, 400),
    ]:
        with pytest.raises(PolicyError) as e:
            resolve_request(c, "bob", [], bad)
        assert e.value.status == status
    with pytest.raises(PolicyError, match="not a member of any GPU team"):
        resolve_request(c, "mallory", [], {"profile": "h100-half"})


def test_teams_for_follows_the_member_index_exactly():
    """The indexed lookup finds exactly the teams a scan over every team finds."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from spawner.core.catalog import catalog_from_dict

    names = st.sampled_from(["ann", "bo", "cy", "dee"])
    groups = st.sampled_from(["g1", "g2", "g3"])
    team = st.fixed_dictionaries(
        {"users": st.lists(names, max_size=3, unique=True), "groups": st.lists(groups, max_size=2, unique=True)}
    )

    @settings(max_examples=100, deadline=None)
    @given(st.lists(team, min_size=1, max_size=6), names, st.lists(groups, max_size=3, unique=True))
    def check(teams, user, user_groups):
        cat = catalog_from_dict(
            {
                "profiles": [{"slug": "cpu", "display_name": "CPU", "gpus": 0}],
                "teams": [{"name": f"t{i}", "guarantee": 1, "burst": 1, **t} for i, t in enumerate(teams)],
            },
            "test",
        )
        scan = sorted(
            (t for t in cat.teams.values() if t.has_member(user, frozenset(user_groups))), key=lambda t: t.name
        )
        assert cat.teams_for(user, user_groups) == scan

    check()


MODEL_TYPO = """\
inventory:
  - {model: H100-80GB, count: 8, memory_mib: 81559}
profiles:
  - {slug: cpu, display_name: CPU, gpus: 0}
  - {slug: h100-1, display_name: 1 x H100, gpus: 1, gpu_model: H100-80G}
teams:
  - {name: vision, users: [alice], guarantee: 1, burst: 2, allowed_profiles: [cpu, h100-l]}
  - {name: nlp, users: [bob], guarantee: 1, burst: 2, allowd_profiles: [cpu]}
"""


def test_check_config_sorts_by_line_and_suggests_profile_slugs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MODEL_TYPO)
    out = subprocess.run(
        [sys.executable, "-m", "hub_config.cli", "check-config", str(bad)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 1
    lines = out.stdout.strip().splitlines()
    numbers = [int(line.split(":")[1]) for line in lines]
    assert numbers == sorted(numbers) == [7, 8]
    assert "unknown profile 'h100-l' (did you mean 'h100-1'?)" in lines[0]
    assert "unknown key (did you mean 'allowed_profiles'?)" in lines[1]


def test_check_config_gpu_model_error_on_a_server_warning_on_kubernetes(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text(MODEL_TYPO.replace("h100-l", "h100-1").replace("allowd_profiles", "allowed_profiles"))
    server = subprocess.run(
        [sys.executable, "-m", "hub_config.cli", "check-config", str(typo)], capture_output=True, text=True, cwd=REPO
    )
    assert server.returncode == 1, server.stdout
    assert server.stdout.strip() == (
        f"{typo}:5: profiles[1].gpu_model: GPU model 'H100-80G' is not known here "
        f"(did you mean 'H100-80GB'?); known: H100-80GB"
    )
    kube = subprocess.run(
        [sys.executable, "-m", "hub_config.cli", "check-config", "--kubernetes", str(typo)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert kube.returncode == 0, kube.stdout + kube.stderr
    first = kube.stdout.splitlines()[0]
    assert first.startswith(f"warning: {typo}:5: profiles[1].gpu_model: GPU model 'H100-80G' is not known here")
    assert "known: A100-40GB, A100-80GB, H100-80GB, H200-141GB" in first
