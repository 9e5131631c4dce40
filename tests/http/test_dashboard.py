"""The dashboard over HTTP: who may see what (the API's keys, through a login cookie), errors as
pages, bounded aggregation of the experience matrix, and the files the wheel must ship. The
pages themselves are checked in a real browser by test_dashboard_browser.py."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterator
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.http.dashboard.app import COOKIE_NAME, MATRIX_COLUMNS
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DIM = 384


@pytest.fixture
def app_client(clean_database: str) -> Iterator[TestClient]:
    settings = Settings(
        database_url=clean_database,
        embedder="none",
        scorer="local",
        auth_cache_ttl_s=0,
        _env_file=None,
    )
    with TestClient(create_app(settings, refit_in_request=True), follow_redirects=False) as client:
        yield client


def vectors(n: int, seed: int = 0) -> list[list[float]]:
    return np.random.default_rng(seed).normal(size=(n, DIM)).tolist()


def fill(client: TestClient, namespace: str, n: int, headers: dict | None = None) -> int:
    """n memories with client vectors, then one retrieve; returns its query id."""
    memories = [{"text": f"{namespace} memory {i}", "embedding": v} for i, v in enumerate(
        vectors(n)
    )]
    response = client.post(
        "/memories", json={"namespace": namespace, "memories": memories}, headers=headers or {}
    )
    assert response.status_code == 201, response.text
    response = client.post(
        "/retrieve",
        json={"namespace": namespace, "query": "q", "query_embedding": vectors(1, 1)[0],
              "budget": 5, "candidates": min(n, 50)},
        headers=headers or {},
    )
    assert response.status_code == 200, response.text
    return int(response.json()["query_id"])


def log_in(client: TestClient, key: str) -> None:
    response = client.post("/dashboard/login", data={"key": key})
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/"


def test_on_loopback_without_keys_the_dashboard_is_open_like_the_api(
    app_client: TestClient,
) -> None:
    query_id = fill(app_client, "agent-1", 20)
    for path in (
        "/dashboard/",
        "/dashboard/namespaces/agent-1",
        "/dashboard/namespaces/agent-1/matrix",
        f"/dashboard/queries/{query_id}",
    ):
        response = app_client.get(path)
        assert response.status_code == 200, path
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
    assert "agent-1" in app_client.get("/dashboard/").text


def test_once_keys_exist_the_dashboard_asks_for_one(
    app_client: TestClient, create_api_key: Callable[[str], str]
) -> None:
    create_api_key("*")
    response = app_client.get("/dashboard/namespaces/agent-1")
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/login"


def test_login_refuses_a_wrong_key(
    app_client: TestClient, create_api_key: Callable[[str], str]
) -> None:
    create_api_key("*")
    response = app_client.post("/dashboard/login", data={"key": "earm_not-a-key"})
    assert response.status_code == 401
    assert "unknown or revoked" in response.text
    assert "set-cookie" not in response.headers
    assert app_client.get("/dashboard/").status_code == 303


def test_login_keeps_the_key_in_an_httponly_samesite_strict_cookie(
    app_client: TestClient, create_api_key: Callable[[str], str]
) -> None:
    key = create_api_key("agent-*")
    response = app_client.post("/dashboard/login", data={"key": key})
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    assert app_client.get("/dashboard/").status_code == 200


def test_a_key_sees_only_its_namespaces(
    app_client: TestClient, create_api_key: Callable[[str], str]
) -> None:
    admin, agent = create_api_key("*"), create_api_key("agent-*")
    admin_headers = {"Authorization": f"Bearer {admin}"}
    fill(app_client, "agent-1", 20, admin_headers)
    team_query = fill(app_client, "team-1", 20, admin_headers)
    log_in(app_client, agent)
    listing = app_client.get("/dashboard/").text
    assert "agent-1" in listing and "team-1" not in listing
    for path in (
        "/dashboard/namespaces/team-1",
        "/dashboard/namespaces/team-1/matrix",
        f"/dashboard/queries/{team_query}",
    ):
        response = app_client.get(path)
        assert response.status_code == 403, path
        assert "not allowed to use namespace &#39;team-1&#39;" in response.text


def test_logout_forgets_the_key(
    app_client: TestClient, create_api_key: Callable[[str], str]
) -> None:
    log_in(app_client, create_api_key("*"))
    response = app_client.post("/dashboard/logout")
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/login"
    assert f'{COOKIE_NAME}=""' in response.headers["set-cookie"]
    assert app_client.get("/dashboard/").status_code == 303


def test_an_unknown_namespace_or_query_is_a_404_page(app_client: TestClient) -> None:
    for path in ("/dashboard/namespaces/nowhere", "/dashboard/queries/4242"):
        response = app_client.get(path)
        assert response.status_code == 404 and "<h1>Error 404</h1>" in response.text


@pytest.mark.parametrize(
    "path",
    ["/dashboard/namespaces/a%00b", "/dashboard/namespaces/a%00b/matrix",
     "/dashboard/namespaces/-dash", "/dashboard/namespaces/x%20y"],
)
def test_a_namespace_name_the_api_refuses_is_a_422_not_a_database_error(
    app_client: TestClient, path: str
) -> None:
    response = app_client.get(path)
    assert response.status_code == 422 and "namespace" in response.text


@pytest.mark.parametrize(
    "method, path, status, code",
    [
        ("GET", "/dashboard/namespaces/x%20y", 422, "validation_error"),
        ("GET", "/dashboard/queries/not-a-number", 422, "validation_error"),
        ("GET", "/dashboard/namespaces/agent-1/matrix?before=0", 422, "validation_error"),
        ("GET", "/dashboard/no/such/page", 404, "not_found"),
        ("PUT", "/dashboard/login", 405, "method_not_allowed"),
    ],
)
def test_dashboard_errors_outside_its_pages_answer_in_the_apis_error_shape(
    app_client: TestClient, method: str, path: str, status: int, code: str
) -> None:
    """They answered FastAPI's {"detail": ...} instead of {"error": {"code", "message"}}."""
    response = app_client.request(method, path)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code and response.json()["error"]["message"]


def test_dashboard_requests_are_counted_and_logged_under_their_full_route(
    app_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """They were counted as /namespaces/{namespace}, the API's route for DELETE."""
    fill(app_client, "agent-1", 5)
    with caplog.at_level("INFO", logger="earm.access"):
        assert app_client.get("/dashboard/namespaces/agent-1").status_code == 200
        assert app_client.get("/dashboard/static/dashboard.css").status_code == 200
    paths = [getattr(record, "path", None) for record in caplog.records]
    assert paths == ["/dashboard/namespaces/{namespace}", "/dashboard/static"]
    metrics = app_client.get("/metrics").text
    assert 'route="/dashboard/namespaces/{namespace}"' in metrics
    assert 'route="/namespaces/{namespace}"' not in metrics


def test_the_matrix_groups_many_memories_into_a_bounded_number_of_columns(
    app_client: TestClient,
) -> None:
    fill(app_client, "agent-1", MATRIX_COLUMNS * 3)
    page = app_client.get("/dashboard/namespaces/agent-1/matrix").text
    assert f"{MATRIX_COLUMNS} equal ranges of ids" in page
    assert "about 3 ids per column" in page
    assert 'class="observed"' in page and 'class="estimated"' in page


def test_the_wheel_ships_every_dashboard_template_and_asset() -> None:
    """pyproject's package-data globs cover every file the dashboard loads."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["service.http.dashboard"]
    package = ROOT / "service" / "http" / "dashboard"
    files = [p.relative_to(package).as_posix() for p in package.glob("[st]*/*") if p.is_file()]
    assert any(f.startswith("templates/") for f in files)
    assert any(f.startswith("static/") for f in files)
    for file in files:
        assert any(fnmatch(file, pattern) for pattern in globs), file


def observed_tiles(page: str) -> int:
    """The observed tiles the matrix draws (each colour's path says how many it draws)."""
    return sum(int(n) for n in re.findall(r"<title>observed, [^<]*: (\d+) tiles?</title>", page))


def test_the_matrix_leaves_out_observations_retired_by_an_edit(app_client: TestClient) -> None:
    """An edit retires its memory's observations (they judged the old content): the model no
    longer learns from them, and the matrix of what it learned no longer shows them."""
    fill(app_client, "agent-1", 10)
    assert observed_tiles(app_client.get("/dashboard/namespaces/agent-1/matrix").text) == 5
    memories = app_client.get("/memories", params={"namespace": "agent-1"}).json()["memories"]
    for memory, embedding in zip(memories, vectors(len(memories), seed=2), strict=True):
        response = app_client.patch(f"/memories/{memory['id']}", json={"embedding": embedding})
        assert response.status_code == 200, response.text
    assert observed_tiles(app_client.get("/dashboard/namespaces/agent-1/matrix").text) == 0


def test_a_query_is_named_by_the_query_id_the_api_answered(app_client: TestClient) -> None:
    query_id = fill(app_client, "agent-ids", 20)
    page = app_client.get(f"/dashboard/queries/{query_id}").text
    assert f"<h1>Query {query_id}</h1>" in page
    recent = app_client.get("/dashboard/namespaces/agent-ids").text
    assert f'<td>{query_id}</td>' in recent


def test_a_query_page_says_how_many_scorer_rounds_its_calls_took(app_client: TestClient) -> None:
    query_id = fill(app_client, "agent-rounds", 20)
    page = app_client.get(f"/dashboard/queries/{query_id}").text
    assert "<dd>5 in 1 round</dd>" in page
