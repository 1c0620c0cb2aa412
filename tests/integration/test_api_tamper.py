"""Tampering with every way in: the spawn form, REST spawns and the jobs, admin, idle and me APIs.

Each request in the corpus is one an attacker or a broken client would send:
bodies nested thousands deep, NaN and Infinity, numbers with thousands of
digits or exponents of a billion, dates at the ends of time, non-ASCII digits
in ids, wrong JSON types, paths that name folders. Every one must get a 4xx
(never a 5xx, never a 2xx) and nothing may change: the state snapshot of the
hub's teams, profiles, prices, audit log, jobs, idle records, servers (stopped
ones included) and GPU holdings is the same before and after the corpus.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from tests.support.hub import ADMIN_AND_CULLER_SCOPES, RunningHub
from tests.support.jobs import user_token, write_notebook

CATALOG = """
inventory:
  - {model: H100-80GB, count: 2, memory_mib: 81559}
prices: {H100-80GB: 2.5}
profiles:
  - {slug: cpu, display_name: "CPU", gpus: 0}
  - {slug: h100-half, display_name: "0.5 × H100", gpus: 0.5, gpu_model: H100-80GB}
  - {slug: h100-2, display_name: "2 × H100", gpus: 2, gpu_model: H100-80GB}
teams:
  - {name: vision, users: [alice, bob], guarantee: 1, burst: 2, allowed_profiles: [cpu, h100-half]}
  - {name: nlp, users: [carol], guarantee: 1, burst: 1, allowed_profiles: [cpu, h100-2]}
"""

DEEP = "[" * 100_000 + "]" * 100_000
JUST_TOO_DEEP = '{"a": ' + "[" * 40 + "]" * 40 + "}"
HUGE_DIGITS = "9" * 5000
#: Raw JSON number texts no field may accept.
BAD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", HUGE_DIGITS, "0." + "0" * 5000 + "1", "-" + HUGE_DIGITS]
#: Values (as Python objects) a numeric field written as text must refuse too.
BAD_NUMBER_STRINGS = ["1e999999999", "1e-999999999", HUGE_DIGITS, "0." + "0" * 4000 + "5", "NaN", "inf", "-1"]
BAD_IDS = ["²", "１", "٣", "9" * 40, "-1", "0x1", "1.0", "1e3", "%00", " 1"]


def raw_body(template: dict[str, Any], field: str, number_text: str) -> str:
    """``template`` as JSON with ``field`` (dotted) set to an unquoted number text."""
    marker = "__NUMBER__"
    doc = json.loads(json.dumps(template))
    node = doc
    *parents, last = field.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = marker
    return json.dumps(doc).replace(f'"{marker}"', number_text)


@pytest.fixture(scope="module")
def hub(start_hub):
    h = start_hub(CATALOG, admin_scopes=ADMIN_AND_CULLER_SCOPES)
    h.give("alice", write_notebook(h.home("alice") / "exp" / "calc.ipynb"))
    (h.home("alice") / "exp" / "folder.ipynb").mkdir(exist_ok=True)
    return h


@pytest.fixture(scope="module")
def alice(hub):
    return user_token(hub, "alice")


_ALICE_TOKENS: dict[str, str] = {}


def alice_token(hub: RunningHub) -> str:
    """A token of alice's own for reading her queue (one per hub)."""
    if hub.url not in _ALICE_TOKENS:
        _ALICE_TOKENS[hub.url] = user_token(hub, "alice")
    return _ALICE_TOKENS[hub.url]


def snapshot(hub: RunningHub) -> dict[str, Any]:
    """Everything a tampered request could change, read through the hub's APIs."""

    def get(path: str, **params) -> Any:
        r = hub.api("GET", path, params=params)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
        return r.json()

    users = get("/users", include_stopped_servers="1")
    return {
        "teams": get("/gpulab/teams"),
        "profiles": get("/gpulab/profiles"),
        "prices": get("/gpulab/prices"),
        "audit": get("/gpulab/audit", limit="1000"),
        "jobs": get("/gpulab/jobs", user="alice"),
        "all jobs": get("/gpulab/jobs"),
        "idle state": {k: v for k, v in get("/gpulab/idle/state").items() if k != "now"},
        "idle audit": get("/gpulab/idle/audit"),
        "servers": {u["name"]: sorted(u.get("servers", {})) for u in users},
        "holdings": hub.holdings(),
        "alice's queue": hub.api("GET", "/gpulab/queue", token=alice_token(hub)).json(),
    }


def corpus(hub: RunningHub, alice: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(label, method, path, request kwargs)`` for :meth:`RunningHub.api`."""
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    admin = {"token": hub.token}
    as_alice = {"token": alice}
    job = {"notebook": "exp/calc.ipynb", "job_class": "batch", "profile": "cpu", "team": "vision"}
    team = {"name": "tampered", "users": ["bob"], "guarantee": 1, "burst": 1, "allowed_profiles": ["cpu"]}
    profile = {"slug": "tampered", "display_name": "T", "gpus": 0.5, "gpu_model": "H100-80GB"}
    warning = {"user": "alice", "server": "", "grace_seconds": 60, "reason": "idle", "gpu_milli": 500}
    reclaim = {"user": "alice", "server": "", "reason": "idle", "gpu_milli": 500}
    bodies = [  # every endpoint that reads a body, with a valid-looking body to tamper with
        ("jobs submit", "POST", "/gpulab/jobs", as_alice, job, ["time_limit_seconds", "parameters.x"]),
        (
            "teams create",
            "POST",
            "/gpulab/teams",
            admin,
            team,
            ["guarantee", "burst", "per_user_cap", "idle_timeout", "max_lifetime"],
        ),
        (
            "team patch",
            "PATCH",
            "/gpulab/teams/vision",
            admin,
            {"guarantee": 1},
            ["guarantee", "burst", "max_lifetime"],
        ),
        (
            "profiles create",
            "POST",
            "/gpulab/profiles",
            admin,
            profile,
            ["gpus", "gpu_milli", "cpu.limit", "memory.limit", "idle_timeout", "max_lifetime"],
        ),
        (
            "profile patch",
            "PATCH",
            "/gpulab/profiles/h100-half",
            admin,
            {"gpus": 0.5},
            ["gpus", "cpu.limit", "memory.limit", "idle_timeout", "max_lifetime"],
        ),
        ("prices", "PUT", "/gpulab/prices", admin, {"prices": {"H100-80GB": 2.5}}, ["prices.H100-80GB"]),
        ("idle warning", "POST", "/gpulab/idle/warnings", admin, warning, ["grace_seconds", "gpu_milli"]),
        ("idle reclaim", "POST", "/gpulab/idle/reclaims", admin, reclaim, ["gpu_milli"]),
        ("idle keepalive", "POST", "/gpulab/idle/keepalive", as_alice, {"user": "alice", "server": ""}, []),
        ("queue join", "POST", "/gpulab/queue", as_alice, {"team": "vision", "profile": "h100-half"}, []),
    ]
    for label, method, path, auth, template, numeric in bodies:
        out.append((f"{label}: nested 100000 deep", method, path, {**auth, "data": DEEP}))
        out.append((f"{label}: nested 40 deep", method, path, {**auth, "data": JUST_TOO_DEEP}))
        out.append((f"{label}: array body", method, path, {**auth, "data": "[]"}))
        out.append((f"{label}: not UTF-8", method, path, {**auth, "data": b"\xff\xfe{}"}))
        for field in numeric:
            for text in BAD_NUMBERS:
                out.append(
                    (f"{label}: {field}={text[:12]}", method, path, {**auth, "data": raw_body(template, field, text)})
                )
    # Amounts written as strings: quotas, GPU amounts, memory, CPU, timeouts. Each refusal
    # must name the field, so it comes from the unit parser and not from an unknown key.
    for field in ("guarantee", "burst", "per_user_cap", "idle_timeout"):
        for text in BAD_NUMBER_STRINGS:
            out.append(
                (
                    f"teams create: {field}={text[:12]!r}",
                    "POST",
                    "/gpulab/teams",
                    {**admin, "data": json.dumps({**team, field: text}), "expect": field},
                )
            )
            out.append(
                (
                    f"team patch: {field}={text[:12]!r}",
                    "PATCH",
                    "/gpulab/teams/vision",
                    {**admin, "data": json.dumps({field: text}), "expect": field},
                )
            )
    for field in ("gpus", "memory.limit", "cpu.limit", "idle_timeout"):
        for text in BAD_NUMBER_STRINGS:
            body = {field.split(".")[0]: {"limit": text}} if "." in field else {field: text}
            out.append(
                (
                    f"profile patch: {field}={text[:12]!r}",
                    "PATCH",
                    "/gpulab/profiles/h100-half",
                    {**admin, "data": json.dumps(body), "expect": field},
                )
            )
    for text in BAD_NUMBER_STRINGS:
        out.append(
            (
                f"prices: {text[:12]!r}",
                "PUT",
                "/gpulab/prices",
                {**admin, "data": json.dumps({"prices": {"H100-80GB": text}})},
            )
        )
    for value in (1e308, 10**18 - 1, -1, True, "2.5"):
        out.append(
            (
                f"prices: {str(value)[:12]}",
                "PUT",
                "/gpulab/prices",
                {**admin, "data": json.dumps({"prices": {"H100-80GB": value}})},
            )
        )
    # GPU models: only those this server has (a typo, a known product it lacks, wrong types, oversized).
    for value in ("H100-80G", "A100-80GB", 5, ["H100-80GB"], "x" * 5000, {"model": "H100-80GB"}):
        out.append(
            (
                f"profiles create: gpu_model={str(value)[:12]!r}",
                "POST",
                "/gpulab/profiles",
                {**admin, "data": json.dumps({**profile, "gpu_model": value}), "expect": "gpu_model"},
            )
        )
        out.append(
            (
                f"profile patch: gpu_model={str(value)[:12]!r}",
                "PATCH",
                "/gpulab/profiles/h100-half",
                {**admin, "data": json.dumps({"gpu_model": value}), "expect": "gpu_model"},
            )
        )
    out.append(
        (
            "profile patch as alice: gpu_model",
            "PATCH",
            "/gpulab/profiles/h100-half",
            {**as_alice, "data": json.dumps({"gpu_model": "H100-80GB"})},
        )
    )
    # JSON is typed: no one-item-list unwrapping, no strings for numbers, no numbers for strings.
    for field, value in [
        ("profile", ["cpu"]),
        ("team", ["vision"]),
        ("profile", 1),
        ("team", {"a": 1}),
        ("notebook", ["exp/calc.ipynb"]),
        ("job_class", ["batch"]),
        ("name", 5),
        ("time_limit_seconds", "60"),
        ("time_limit_seconds", 60.5),
        ("time_limit_seconds", True),
        ("parameters", ["x"]),
        ("idempotency_key", 7),
        ("image", ["x"]),
    ]:
        out.append(
            (
                f"jobs submit: {field}={value!r}",
                "POST",
                "/gpulab/jobs",
                {**as_alice, "data": json.dumps({**job, field: value})},
            )
        )
    for path in (
        "exp/calc.ipynb/",
        "exp/",
        "exp/folder.ipynb",
        "exp/folder.ipynb/",
        "/etc/passwd.ipynb",
        "../alice/exp/calc.ipynb",
        "exp/calc.ipynb\x00",
        "",
        ".",
    ):
        out.append(
            (
                f"jobs submit: notebook={path!r}",
                "POST",
                "/gpulab/jobs",
                {**as_alice, "data": json.dumps({**job, "notebook": path})},
            )
        )
    # Ids and query arguments.
    for bad in BAD_IDS:
        for suffix, method in (
            ("", "GET"),
            ("/cancel", "POST"),
            ("/rerun", "POST"),
            ("/logs", "GET"),
            ("/output", "GET"),
        ):
            out.append((f"job {bad!r}{suffix}", method, f"/gpulab/jobs/{bad}{suffix}", as_alice))
    for bad in ("²", "-1", HUGE_DIGITS, "nan", "1e3", "١"):
        out.append((f"audit limit={bad[:12]!r}", "GET", "/gpulab/audit", {**admin, "params": {"limit": bad}}))
        out.append((f"audit offset={bad[:12]!r}", "GET", "/gpulab/audit", {**admin, "params": {"offset": bad}}))
        out.append((f"idle audit limit={bad[:12]!r}", "GET", "/gpulab/idle/audit", {**admin, "params": {"limit": bad}}))
    for period in (
        HUGE_DIGITS + "d",
        "99999999999999999d",
        "1e999d",
        "-1d",
        "0d",
        "nan",
        "inf",
        "²d",
        "9" * 40 + "s",
        "1" + "0" * 20 + "h",
    ):
        for path in ("/gpulab/usage", "/gpulab/usage.csv"):
            out.append((f"{path} period={period[:12]!r}", "GET", path, {**admin, "params": {"period": period}}))
    for start, end in (
        ("0001-01-01", "0001-01-02"),
        ("9999-12-30", "9999-12-31T23:59:59"),
        ("0001-01-01T00:00+01:00", "0001-01-02"),
        ("9999-12-31T23:59:59-14:00", None),
        ("1969-12-31", "1970-01-01"),
        ("2026-01-02", "2026-01-01"),
        ("²", None),
        ("2026-01-01", "2028-01-01"),
        ("2026-13-01", None),
        (HUGE_DIGITS, None),
    ):
        params = {"start": start, **({"end": end} if end else {})}
        for path in ("/gpulab/usage", "/gpulab/usage.csv"):
            out.append((f"{path} {start[:12]}..{(end or '')[:12]}", "GET", path, {**admin, "params": params}))
    for user in ("x" * 300, "\x00", "bob", "nobody-here"):
        out.append((f"me user={user[:12]!r} as alice", "GET", "/gpulab/me", {**as_alice, "params": {"user": user}}))
    out.append(("me user=x*300 as admin", "GET", "/gpulab/me", {**admin, "params": {"user": "x" * 300}}))
    out.append(("jobs logs offset=²", "GET", "/gpulab/jobs/1/logs", {**as_alice, "params": {"offset": "²"}}))
    # The spawn queue: typed fields, no GPU size of its own, only one's own teams and entries.
    for body in (
        {"team": "vision", "profile": ["h100-half"]},
        {"team": "vision", "profile": "h100-half", "gpus": 8},
        {"team": "vision", "profile": "h100-half", "milli": 1},
        {"team": "nlp", "profile": "h100-2"},
        {"team": "vision", "profile": "h100-2"},
        {"team": "vision", "profile": "cpu"},
        {"team": "vision", "profile": "h100-half", "server_name": "../x"},
        {"team": "vision", "profile": "h100-half", "server_name": ["x"]},
        {"team": "vision", "profile": "h100-half", "server_name": "x" * 300},
        {"team": "vision", "profile": "x" * 5000},
    ):
        out.append((f"queue join {str(body)[:60]}", "POST", "/gpulab/queue", {**as_alice, "data": json.dumps(body)}))
    out.append(("queue join as the admin service", "POST", "/gpulab/queue", {**admin, "data": '{"team": "vision"}'}))
    for bad in BAD_IDS + ["1"]:  # no entry 1 of alice's: "no such entry", nothing said of others'
        out.append((f"queue cancel {bad!r}", "DELETE", f"/gpulab/queue/{bad}", as_alice))
    # REST spawns of a named server with tampered options.
    for options in (
        {"team": "vision", "profile": ["cpu"]},
        {"team": ["vision"], "profile": "cpu"},
        {"team": "vision", "profile": 1},
        {"team": "vision", "profile": "h100-2"},
        {"team": "nlp", "profile": "cpu"},
        {"team": "vision", "profile": "cpu", "gpus": 8},
        {"team": "vision", "profile": "nope"},
        {"team": "vision", "profile": "cpu", "image": ["x"]},
    ):
        out.append((f"REST spawn {options}", "POST", "/users/alice/servers/tamper", {"data": json.dumps(options)}))
    out.append(("REST spawn: nested 100000 deep", "POST", "/users/alice/servers/tamper", {"data": DEEP}))
    return out


SPAWN_FORMS = [
    {},
    {"choice": ""},
    {"choice": "vision"},
    {"choice": "vision:"},
    {"choice": ":cpu"},
    {"choice": "vision:nope"},
    {"choice": "nlp:cpu"},
    {"choice": "vision:h100-2"},
    {"choice": "x" * 5000},
    {"choice": "vision:cpu\x00"},
    {"choice": ["vision:cpu", "vision:h100-half"]},
    {"choice": "vision:cpu", "gpu_milli": "8000"},
    {"choice": "vision:cpu", "cpu_limit": "64"},
    {"choice": "vision:h100-half", "image-vision:h100-half": "evil:latest"},
    {"choice": "vision:cpu", "profile": "h100-2"},
]


#: One-click spawn URLs (``/hub/spawn/alice/NAME?opt-choice=...``) someone edited or forged.
SPAWN_QUERIES = [
    {"opt-choice": "nlp:cpu"},
    {"opt-choice": "vision:nope"},
    {"opt-choice": "vision:h100-2"},
    {"opt-choice": "x" * 5000},
    {"opt-choice": "vision:cpu\x00"},
    {"opt-choice": ["vision:cpu", "vision:h100-half"]},
    {"opt-choice": "vision:cpu", "opt-gpu_milli": "8000"},
    {"opt-choice": "vision:cpu", "opt-profile": "h100-2"},
    {"opt-choice": ""},
    {"opt-choice": "vision:h100-half", "opt-image-vision:h100-half": "evil:latest"},
]


def test_tamper_corpus_refused_without_5xx_or_state_change(hub, alice):
    before = snapshot(hub)
    statuses: Counter[int] = Counter()
    wrong: list[str] = []
    requests_sent = accepted = 0
    for label, method, path, kwargs in corpus(hub, alice):
        kwargs = dict(kwargs)
        token = kwargs.pop("token", None)
        expect = kwargs.pop("expect", None)
        r = hub.api(method, path, token=token, **kwargs)
        requests_sent += 1
        statuses[r.status_code] += 1
        accepted += r.status_code < 400
        if not 400 <= r.status_code < 500:
            wrong.append(f"{label}: {r.status_code} {r.text[:200]}")
        elif expect and expect not in r.json().get("message", ""):
            wrong.append(f"{label}: refused for another reason: {r.text[:200]}")
    session = hub.login("alice")
    for i, form in enumerate(SPAWN_FORMS):
        name = f"form{i}"
        page = hub.spawn_page(session, name, "alice")
        requests_sent += 1
        statuses[page.status_code] += 1
        if page.status_code != 200:
            wrong.append(f"spawn page {name}: {page.status_code}")
        r = hub.post_spawn(session, "alice", form, server_name=name)
        requests_sent += 2  # post_spawn reads the page first
        statuses[r.status_code] += 1
        accepted += r.status_code < 400
        if not 400 <= r.status_code < 500:
            wrong.append(f"spawn form {form!r:.80}: {r.status_code}")
    for i, query in enumerate(SPAWN_QUERIES):
        r = session.get(f"{hub.url}/hub/spawn/alice/query{i}", params=query, timeout=30, allow_redirects=False)
        requests_sent += 1
        statuses[r.status_code] += 1
        accepted += r.status_code < 400
        if not 400 <= r.status_code < 500:
            wrong.append(f"spawn query {query!r:.80}: {r.status_code}")
    after = snapshot(hub)
    print(
        f"\ntamper corpus: {requests_sent} requests; statuses {dict(sorted(statuses.items()))}; "
        f"5xx: {sum(n for s, n in statuses.items() if s >= 500)}; accepted wrongly: {accepted}; "
        f"state changed: {before != after} (the {len(SPAWN_FORMS)} spawn pages shown are 200s)"
    )
    assert requests_sent >= 300
    assert not wrong, "\n".join(wrong)
    assert after == before


def test_visiting_named_spawn_pages_leaves_no_server_records(hub):
    session = hub.login("bob")
    limit = 4  # c.JupyterHub.named_server_limit_per_user of the embedded hub
    for i in range(limit + 2):
        assert hub.spawn_page(session, f"visit{i}", "bob").status_code == 200
    servers = hub.api("GET", "/users/bob", params={"include_stopped_servers": "1"}).json()["servers"]
    assert not [n for n in servers if n.startswith("visit")], servers
    # The limit still has room: a real named spawn goes through.
    r = hub.post_spawn(session, "bob", {"choice": "vision:cpu"}, server_name="real")
    assert r.status_code == 302, r.status_code
    hub.wait_server("bob", "real")
    hub.api("DELETE", "/users/bob/servers/real", data=json.dumps({"remove": True}))
    hub.wait_server("bob", "real", ready=False)


@pytest.mark.parametrize("body", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_prices_refuse_non_finite_and_stay_valid_json(hub, body):
    r = hub.api("PUT", "/gpulab/prices", data=f'{{"prices": {{"H100-80GB": {body}}}}}')
    assert r.status_code == 400, r.text
    for path in ("/gpulab/prices", "/gpulab/usage"):
        r = hub.api("GET", path)
        assert r.status_code == 200
        json.loads(r.text, parse_constant=lambda c, path=path: pytest.fail(f"{path} answered {c}"))


def test_admin_csv_link_carries_no_xsrf_token_and_downloads(hub):
    session = hub.login("admin")
    page = session.get(hub.url + "/hub/gpulab/admin", timeout=30)
    assert page.status_code == 200
    href = page.text.split('id="gpulab-csv"', 1)[1].split('href="', 1)[1].split('"', 1)[0]
    assert "_xsrf" not in href and "usage.csv" in href
    r = session.get(hub.url + href.replace("&amp;", "&"), headers={"Sec-Fetch-Mode": "navigate"}, timeout=30)
    assert r.status_code == 200 and r.text.startswith("start,end,team,user")
