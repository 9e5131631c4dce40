"""API keys: 401 without a valid key, 403 outside the key's namespace patterns, on every route
but the public ones; keys hashed at rest, managed by `earm keys`, seeded from EARM_API_KEYS."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import create_engine, text

from service.auth import Principal, is_loopback_host, parse_seed_keys, validate_patterns
from service.cli import main as earm
from service.errors import ConfigurationError
from service.http.app import create_app
from service.http.deps import PUBLIC_PATHS
from service.settings import Settings

VECTOR = (np.arange(384) % 5 + 1.0).tolist()
SEED_ADMIN = "seeded-admin-key-0123456789abcdef"
SEED_AGENT = "seeded-agent-key-0123456789abcdef"


@pytest.fixture
def auth_settings(clean_database: str) -> Settings:
    return Settings(
        database_url=clean_database, embedder="none", auth_cache_ttl_s=0, _env_file=None
    )


@pytest.fixture
def keys(clean_database: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """`earm keys ...` against the test database; returns a runner giving (exit code, stdout)."""
    monkeypatch.setenv("EARM_DATABASE_URL", clean_database)
    monkeypatch.setenv("EARM_EMBEDDER", "none")

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = earm(["keys", *argv])
        return code, capsys.readouterr().out

    return run


def create_key(keys, patterns: str, name: str | None = None) -> str:
    code, out = keys("create", "--namespaces", patterns, *(["--name", name] if name else []))
    assert code == 0
    return out.strip()


def api_routes(app) -> list[tuple[str, set[str]]]:
    """(path, methods) of every API route, through included routers too."""
    try:  # FastAPI >= 0.16x keeps included routers as nodes; this walks them.
        from fastapi.routing import iter_route_contexts

        routes = list(iter_route_contexts(app.routes))
    except ImportError:
        routes = list(app.routes)
    return [
        (route.path, set(route.methods))
        for route in routes
        if isinstance(getattr(route, "original_route", route), APIRoute)
    ]


def has_route(app, path: str) -> bool:
    return any(route_path == path for route_path, _ in api_routes(app))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def api(auth_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(auth_settings)) as client:
        yield client


def ingest(client: TestClient, namespace: str, key: str, text: str = "a memory") -> int:
    response = client.post(
        "/memories",
        json={"namespace": namespace, "memories": [{"text": text, "embedding": VECTOR}]},
        headers=bearer(key),
    )
    assert response.status_code == 201, response.text
    return response.json()["ids"][0]


def assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


# ---------------------------------------------------------------------------- unit level


def test_patterns_are_fnmatch_globs_and_star_is_admin() -> None:
    scoped = Principal(1, "k", ("agent-*", "team-?"))
    assert scoped.allows("agent-42") and scoped.allows("team-a")
    assert not scoped.allows("agent") and not scoped.allows("team-ab") and not scoped.is_admin
    assert scoped.visible(["agent-1", "other", "team-b"]) == ["agent-1", "team-b"]
    assert Principal(2, "admin", ("*",)).is_admin


@pytest.mark.parametrize(
    "pattern", ["team-[", "team-[ab", "team-]", "team-!x", "[]", "agent-[!"]
)
def test_a_pattern_no_namespace_name_can_match_is_refused(pattern: str) -> None:
    """fnmatch reads an unclosed '[' (and a ']' or '!' outside a set) as that character, which
    no namespace name holds: `earm keys create --namespaces 'team-['` made a key for nothing."""
    with pytest.raises(ValueError, match=re.escape(repr(pattern))):
        validate_patterns([pattern])


def test_patterns_with_sets_are_kept() -> None:
    patterns = ("team-[ab]*", "agent-[!x]?", "[a-z]*", "*")
    assert validate_patterns(patterns) == patterns
    assert Principal(1, "k", patterns[:1]).allows("team-b1")


def test_loopback_hosts() -> None:
    assert all(map(is_loopback_host, ["127.0.0.1", "localhost", "::1", "127.0.0.2"]))
    assert not any(map(is_loopback_host, ["0.0.0.0", "::", "10.1.2.3", "example.com"]))


def test_seed_setting_parses_and_never_echoes_a_short_key() -> None:
    seeds = parse_seed_keys(f"{SEED_ADMIN}=*; {SEED_AGENT}=agent-*,team-*")
    assert [s.patterns for s in seeds] == [("*",), ("agent-*", "team-*")]
    with pytest.raises(ValueError, match="shorter than") as error:
        parse_seed_keys("tooshort-secret=*")
    assert "tooshort-secret" not in str(error.value)
    with pytest.raises(ValueError, match="pattern"):
        parse_seed_keys(f"{SEED_ADMIN}=agent-'; DROP TABLE x")


# ------------------------------------------------------------------------ anonymous mode


def test_without_keys_loopback_clients_are_served(api: TestClient) -> None:
    assert api.get("/memories", params={"namespace": "agent-1"}).status_code == 200


def test_without_keys_a_key_never_issued_counts_as_none(
    api: TestClient, auth_settings: Settings
) -> None:
    # SDKs made for hosted rerankers always send a key: on a keyless install it is no key
    response = api.get("/memories", params={"namespace": "a"}, headers=bearer("earm_made-up"))
    assert response.status_code == 200
    # ... under the keyless rules: a remote client gets no more with a made-up key than without
    with TestClient(create_app(auth_settings), client=("203.0.113.9", 4711)) as remote:
        response = remote.get("/memories", params={"namespace": "a"},
                              headers=bearer("earm_made-up"))
        assert_error(response, 401, "unauthenticated")
        assert "only answers loopback clients" in response.json()["error"]["message"]


def test_without_enforcement_a_revoked_key_is_still_refused(api: TestClient, keys) -> None:
    key = create_key(keys, "*", name="to-revoke")
    assert keys("revoke", key_id(keys, "to-revoke"))[0] == 0
    assert keys("enforcement", "off")[0] == 0
    assert anonymous_listing(api).status_code == 200
    response = api.get("/memories", params={"namespace": "a"}, headers=bearer(key))
    assert_error(response, 401, "unauthenticated")
    assert "unknown or revoked" in response.json()["error"]["message"]


def test_without_keys_a_loopback_peer_naming_a_foreign_host_is_refused(
    auth_settings: Settings,
) -> None:
    """DNS rebinding: a web page whose domain now resolves to 127.0.0.1 reaches the service
    from a loopback peer, but its requests name the page's host."""
    app = create_app(auth_settings)
    rebound = "http://rebound.example:8000"
    with TestClient(app, base_url=rebound, client=("127.0.0.1", 4711)) as page:
        response = page.get("/memories", params={"namespace": "a"})
        assert_error(response, 401, "unauthenticated")
        assert "'rebound.example'" in response.json()["error"]["message"]
        assert page.get("/healthz").status_code == 200
        # The dashboard's keyless view is refused the same way (its login page instead).
        assert "login" in page.get("/dashboard/", follow_redirects=False).headers["location"]
    for name in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "localhost"):
        with TestClient(app, base_url=f"http://{name}", client=("127.0.0.1", 4711)) as local:
            assert local.get("/memories", params={"namespace": "a"}).status_code == 200, name
    allowed = auth_settings.model_copy(update={"allow_anonymous": True})
    with TestClient(
        create_app(allowed), base_url="http://earm.internal:8000", client=("127.0.0.1", 4711)
    ) as proxied:
        assert proxied.get("/memories", params={"namespace": "a"}).status_code == 200


def test_without_keys_a_non_loopback_peer_is_refused(auth_settings: Settings) -> None:
    with TestClient(create_app(auth_settings), client=("203.0.113.9", 4711)) as remote:
        response = remote.get("/memories", params={"namespace": "a"})
        assert_error(response, 401, "unauthenticated")
        assert "only answers loopback clients" in response.json()["error"]["message"]
        assert remote.get("/healthz").status_code == 200
    allowed = auth_settings.model_copy(update={"allow_anonymous": True})
    with TestClient(create_app(allowed), client=("203.0.113.9", 4711)) as remote:
        assert remote.get("/memories", params={"namespace": "a"}).status_code == 200


def test_app_refuses_a_non_loopback_bind_address_without_keys(auth_settings: Settings) -> None:
    exposed = auth_settings.model_copy(update={"host": "0.0.0.0"})
    with (
        pytest.raises(ConfigurationError, match="EARM_ALLOW_ANONYMOUS"),
        TestClient(create_app(exposed)),
    ):
        pass
    with TestClient(create_app(exposed.model_copy(update={"allow_anonymous": True}))) as client:
        assert client.get("/healthz").status_code == 200


def test_app_accepts_a_non_loopback_bind_address_once_a_key_exists(
    auth_settings: Settings, keys
) -> None:
    create_key(keys, "*")
    with TestClient(create_app(auth_settings.model_copy(update={"host": "0.0.0.0"}))) as client:
        assert client.get("/healthz").status_code == 200


def test_earm_serve_refuses_a_public_bind_address_without_keys(clean_database: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
        "EARM_DATABASE_URL": clean_database,
        "EARM_EMBEDDER": "none",
    }
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--host", "0.0.0.0", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "refusing to serve on 0.0.0.0" in result.stderr


# ---------------------------------------------------------------------------- keys mode


def protected_requests(memory_id: int = 1) -> list[tuple[str, str, dict]]:
    """One request per protected endpoint, all aimed at namespace `agent-1`."""
    return [
        (
            "POST",
            "/memories",
            {"json": {"namespace": "agent-1", "memories": [{"text": "x", "embedding": VECTOR}]}},
        ),
        ("GET", f"/memories/{memory_id}", {}),
        ("GET", "/memories", {"params": {"namespace": "agent-1"}}),
        ("DELETE", f"/memories/{memory_id}", {}),
        (
            "POST",
            "/retrieve",
            {"json": {"namespace": "agent-1", "query": "q", "query_embedding": VECTOR}},
        ),
        (
            "POST",
            "/feedback",
            {
                "json": {
                    "namespace": "agent-1",
                    "query_id": 1,
                    "scores": [{"memory_id": memory_id, "score": 1.0}],
                }
            },
        ),
        ("GET", "/stats", {"params": {"namespace": "agent-1"}}),
        ("PATCH", f"/memories/{memory_id}", {"json": {"metadata": {"edited": True}}}),
        ("DELETE", "/namespaces/agent-1", {}),
        ("GET", "/queries/1", {}),
    ]


def test_every_protected_endpoint_answers_401_without_a_valid_key(api: TestClient, keys) -> None:
    admin = create_key(keys, "*")
    ingest(api, "agent-1", admin)
    revoked = create_key(keys, "*", name="to-revoke")
    code, listing = keys("list")
    revoked_id = next(line.split()[0] for line in listing.splitlines() if "to-revoke" in line)
    assert keys("revoke", revoked_id)[0] == 0
    for headers in (
        {},
        bearer("earm_not-a-key"),
        {"Authorization": f"Basic {admin}"},
        bearer(revoked),
    ):
        for method, path, kwargs in protected_requests():
            if path == "/stats" and not has_route(api.app, "/stats"):
                continue
            response = api.request(method, path, headers=headers, **kwargs)
            assert_error(response, 401, "unauthenticated")
            assert response.headers["www-authenticate"].startswith("Bearer")


def test_every_route_but_the_public_ones_requires_a_key(api: TestClient, keys) -> None:
    """The inventory: a route added later is protected by default, or this fails."""
    create_key(keys, "*")
    checked = 0
    for route_path, methods in api_routes(api.app):
        if route_path in PUBLIC_PATHS:
            continue
        path = route_path.replace("{memory_id}", "1").replace("{namespace}", "agent-1")
        for method in methods:
            response = api.request(method, path, json={}, params={"namespace": "agent-1"})
            assert_error(response, 401, "unauthenticated")
            checked += 1
    assert checked >= 6


def test_public_endpoints_stay_open_when_keys_exist(api: TestClient, keys) -> None:
    create_key(keys, "*")
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
        assert api.get(path).status_code == 200, path
    for path in ("/healthz", "/readyz"):
        assert api.head(path).status_code == 200, path


def test_metrics_names_namespaces_so_it_needs_an_admin_key(api: TestClient, keys) -> None:
    admin = create_key(keys, "*")
    scoped = create_key(keys, "agent-*")
    ingest(api, "agent-secret-tenant", admin)
    assert_error(api.get("/metrics"), 401, "unauthenticated")
    refused = api.get("/metrics", headers=bearer(scoped))
    assert_error(refused, 403, "forbidden")
    assert "EARM_METRICS_PUBLIC" in refused.json()["error"]["message"]
    scraped = api.get("/metrics", headers=bearer(admin))
    assert scraped.status_code == 200
    assert 'namespace="agent-secret-tenant"' in scraped.text


def test_metrics_public_serves_metrics_without_a_key(auth_settings: Settings, keys) -> None:
    create_key(keys, "*")
    public = auth_settings.model_copy(update={"metrics_public": True})
    with TestClient(create_app(public)) as client:
        assert client.get("/metrics").status_code == 200
        assert_error(client.get("/stats"), 401, "unauthenticated")


def test_a_namespace_outside_the_key_scope_is_forbidden_everywhere(api: TestClient, keys) -> None:
    admin = create_key(keys, "*")
    other = create_key(keys, "team-*")
    memory_id = ingest(api, "agent-1", admin)
    query = {"namespace": "agent-1", "query": "q", "query_embedding": VECTOR}
    assert api.post("/retrieve", json=query, headers=bearer(admin)).json()["query_id"] == 1
    for method, path, kwargs in protected_requests(memory_id):
        if path == "/stats" and not has_route(api.app, "/stats"):
            continue
        assert_error(api.request(method, path, headers=bearer(other), **kwargs), 403, "forbidden")
    # The forbidden DELETE deleted nothing, the forbidden PATCH changed nothing.
    kept = api.get(f"/memories/{memory_id}", headers=bearer(admin))
    assert kept.status_code == 200 and kept.json()["metadata"] == {}


def test_a_scoped_key_works_inside_its_patterns(api: TestClient, keys) -> None:
    agent = create_key(keys, "agent-*,bot-?")
    memory_id = ingest(api, "agent-7", agent)
    ingest(api, "bot-1", agent)
    assert api.get(f"/memories/{memory_id}", headers=bearer(agent)).json()["namespace"] == "agent-7"
    listing = api.get("/memories", params={"namespace": "agent-7"}, headers=bearer(agent))
    assert [m["id"] for m in listing.json()["memories"]] == [memory_id]
    result = api.post(
        "/retrieve",
        json={"namespace": "agent-7", "query": "q", "query_embedding": VECTOR},
        headers=bearer(agent),
    )
    assert result.status_code == 200, result.text
    feedback = api.post(
        "/feedback",
        json={
            "namespace": "agent-7",
            "query_id": result.json()["query_id"],
            "scores": [{"memory_id": memory_id, "score": 0.5}],
        },
        headers=bearer(agent),
    )
    assert feedback.status_code == 200, feedback.text
    edit = api.patch(f"/memories/{memory_id}", json={"metadata": {"a": 1}}, headers=bearer(agent))
    assert edit.status_code == 200, edit.text
    assert api.delete(f"/memories/{memory_id}", headers=bearer(agent)).status_code == 204
    assert api.delete("/namespaces/bot-1", headers=bearer(agent)).status_code == 200


def test_feedback_cannot_reach_a_query_of_another_namespace(api: TestClient, keys) -> None:
    admin, agent = create_key(keys, "*"), create_key(keys, "agent-*")
    team_memory = ingest(api, "team-1", admin)
    team_query = api.post(
        "/retrieve",
        json={"namespace": "team-1", "query": "q", "query_embedding": VECTOR},
        headers=bearer(admin),
    ).json()["query_id"]
    ingest(api, "agent-1", agent)
    response = api.post(
        "/feedback",
        json={
            "namespace": "agent-1",
            "query_id": team_query,
            "scores": [{"memory_id": team_memory, "score": 1.0}],
        },
        headers=bearer(agent),
    )
    assert_error(response, 404, "not_found")


def test_stats_without_a_namespace_lists_only_namespaces_in_scope(api: TestClient, keys) -> None:
    if not has_route(api.app, "/stats"):
        pytest.skip("no /stats route in this build")
    admin, agent = create_key(keys, "*"), create_key(keys, "agent-*")
    for namespace in ("agent-1", "agent-2", "team-1"):
        ingest(api, namespace, admin)

    def names(key: str) -> set[str]:
        response = api.get("/stats", headers=bearer(key))
        assert response.status_code == 200, response.text
        body = response.json()
        items = body["namespaces"] if isinstance(body, dict) and "namespaces" in body else body
        return {item["namespace"] for item in items}

    assert names(agent) == {"agent-1", "agent-2"}
    assert names(admin) == {"agent-1", "agent-2", "team-1"}


# ------------------------------------------------------------------------- key lifecycle


def test_keys_are_stored_only_as_sha256(keys, clean_database: str) -> None:
    key = create_key(keys, "agent-*", name="stored")
    assert key.startswith("earm_") and len(key) >= 40
    engine = create_engine(clean_database)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM api_keys")).mappings().one()
    engine.dispose()
    assert row["key_hash"] == hashlib.sha256(key.encode()).hexdigest()
    assert key not in " ".join(str(value) for value in row.values())
    assert row["namespace_patterns"] == ["agent-*"]
    code, listing = keys("list")
    assert (
        code == 0 and "stored" in listing and key not in listing and row["key_hash"] not in listing
    )


def test_revoking_an_unknown_key_fails(keys) -> None:
    assert keys("revoke", "999")[0] == 1


def test_a_revoked_key_stops_working_within_the_cache_ttl(
    auth_settings: Settings, keys
) -> None:
    key = create_key(keys, "*", name="short-lived")
    cached = auth_settings.model_copy(update={"auth_cache_ttl_s": 1.0})
    with TestClient(create_app(cached)) as client:
        listing = lambda: client.get("/memories", params={"namespace": "a"}, headers=bearer(key))  # noqa: E731
        assert listing().status_code == 200
        keys("revoke", keys("list")[1].splitlines()[1].split()[0])
        time.sleep(1.1)
        assert_error(listing(), 401, "unauthenticated")


def test_seeded_keys_are_hashed_into_the_table_idempotently(
    auth_settings: Settings, clean_database: str, keys
) -> None:
    seeded = Settings(
        **auth_settings.model_dump(exclude={"api_keys"}),
        api_keys=f"{SEED_ADMIN}=*;{SEED_AGENT}=agent-*",
        _env_file=None,
    )
    for _ in range(2):  # a restart seeds nothing twice
        with TestClient(create_app(seeded)) as client:
            assert ingest(client, "agent-1", SEED_AGENT)
            assert_error(
                client.get("/memories", params={"namespace": "team-1"}, headers=bearer(SEED_AGENT)),
                403,
                "forbidden",
            )
            assert (
                client.get(
                    "/memories", params={"namespace": "team-1"}, headers=bearer(SEED_ADMIN)
                ).status_code
                == 200
            )
    engine = create_engine(clean_database)
    with engine.connect() as conn:
        hashes = conn.execute(text("SELECT key_hash FROM api_keys ORDER BY id")).scalars().all()
    engine.dispose()
    assert hashes == [hashlib.sha256(k.encode()).hexdigest() for k in (SEED_ADMIN, SEED_AGENT)]
    # Revoked with the CLI, a seeded key stays revoked across restarts.
    agent_id = next(l.split()[0] for l in keys("list")[1].splitlines() if "agent-*" in l)  # noqa: E741
    assert keys("revoke", agent_id)[0] == 0
    with TestClient(create_app(seeded)) as client:
        assert_error(
            client.get("/memories", params={"namespace": "agent-1"}, headers=bearer(SEED_AGENT)),
            401,
            "unauthenticated",
        )


def test_keys_never_appear_in_logs(
    auth_settings: Settings, keys, caplog: pytest.LogCaptureFixture
) -> None:
    key = create_key(keys, "agent-*")
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(auth_settings)) as client:
        ingest(client, "agent-1", key)
        client.get("/memories", params={"namespace": "team-1"}, headers=bearer(key))
        client.get("/memories", params={"namespace": "agent-1"}, headers=bearer(key + "x"))
    assert caplog.records
    assert all(
        key not in record.getMessage() and key not in str(record.__dict__)
        for record in caplog.records
    )


# ----------------------------------------------------------------------- key enforcement


def anonymous_listing(client: TestClient):
    return client.get("/memories", params={"namespace": "agent-1"})


def key_id(keys, name: str) -> str:
    return next(line.split()[0] for line in keys("list")[1].splitlines() if name in line)


def test_revoking_every_key_keeps_requiring_keys(api: TestClient, keys) -> None:
    key = create_key(keys, "*", name="only")
    assert keys("revoke", key_id(keys, "only"))[0] == 0
    assert_error(anonymous_listing(api), 401, "unauthenticated")
    assert_error(
        api.get("/memories", params={"namespace": "a"}, headers=bearer(key)), 401, "unauthenticated"
    )
    assert keys("enforcement", "status")[1].startswith("key enforcement: on")


def test_enforcement_off_restores_the_keyless_rules_and_on_ends_them(
    auth_settings: Settings, api: TestClient, keys
) -> None:
    key = create_key(keys, "agent-*")
    assert keys("enforcement", "off")[0] == 0
    assert keys("enforcement", "status")[1].startswith("key enforcement: off")
    assert anonymous_listing(api).status_code == 200
    # Keyless rules: loopback only, and a key sent is still checked.
    with TestClient(create_app(auth_settings), client=("203.0.113.9", 4711)) as remote:
        assert_error(anonymous_listing(remote), 401, "unauthenticated")
    assert_error(
        api.get("/memories", params={"namespace": "team-1"}, headers=bearer(key)), 403, "forbidden"
    )
    # A key created later leaves the operator's choice alone.
    create_key(keys, "*")
    assert anonymous_listing(api).status_code == 200
    assert keys("enforcement", "on")[0] == 0
    assert_error(anonymous_listing(api), 401, "unauthenticated")


def test_a_seeded_key_turns_enforcement_on_for_good(auth_settings: Settings, keys) -> None:
    seeded = auth_settings.model_copy(update={"api_keys": SecretStr(f"{SEED_AGENT}=agent-*")})
    with TestClient(create_app(seeded)) as client:
        assert_error(anonymous_listing(client), 401, "unauthenticated")
    assert keys("revoke", key_id(keys, "agent-*"))[0] == 0
    with TestClient(create_app(auth_settings)) as client:  # setting removed, key revoked
        assert_error(anonymous_listing(client), 401, "unauthenticated")


def test_app_accepts_a_non_loopback_bind_address_once_every_key_is_revoked(
    auth_settings: Settings, keys
) -> None:
    create_key(keys, "*", name="gone")
    assert keys("revoke", key_id(keys, "gone"))[0] == 0
    with TestClient(create_app(auth_settings.model_copy(update={"host": "0.0.0.0"}))) as client:
        assert_error(anonymous_listing(client), 401, "unauthenticated")


def test_upgrade_turns_enforcement_on_where_keys_were_created(
    new_database, auth_settings: Settings
) -> None:
    """A deployment migrated from before the explicit mode keeps requiring keys, even if every
    key it created is revoked by now."""
    from alembic import command

    from service.db import migrate

    url = new_database("earm_enforcement_upgrade")
    command.upgrade(migrate.alembic_config(url, 384), "0006")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO api_keys (name, key_hash, namespace_patterns, revoked_at) "
                "VALUES ('old', 'x', '{*}', now())"
            )
        )
    engine.dispose()
    migrate.upgrade_to_head(url, 384)
    with TestClient(create_app(auth_settings.model_copy(update={"database_url": url}))) as client:
        assert_error(anonymous_listing(client), 401, "unauthenticated")
