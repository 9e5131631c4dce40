"""The `earm` command as an operator meets it: a configuration error is one plain line on stderr
that says how to fix it (no traceback, non-zero exit); `keys` and `migrate` print their result,
not the start-up chatter of Alembic and Postgres."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

CommandRunner = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def run_earm(clean_database: str) -> CommandRunner:
    """Runs `earm ARGV...` as a subprocess against the test database, with extra EARM_* env."""

    def run(*argv: str, **env: str) -> subprocess.CompletedProcess:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
            "EARM_DATABASE_URL": clean_database,
            "EARM_EMBEDDER": "none",
            **{f"EARM_{name.upper()}": value for name, value in env.items()},
        }
        return subprocess.run(
            [sys.executable, "-m", "service", *argv],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


def assert_one_plain_line(result: subprocess.CompletedProcess, *hints: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and not lines[0].startswith("{")
    for hint in hints:
        assert hint in lines[0]


@pytest.mark.parametrize(
    ("argv", "env", "hints"),
    [
        pytest.param(
            ("serve", "--port", "0"),
            {"scorer": "openai"},
            ("EARM_SCORER_BASE_URL",),
            id="scorer-without-url",
        ),
        pytest.param(
            ("serve", "--port", "0"),
            {"embedding_dim": "8"},
            ("384-dimensional", "EARM_EMBEDDING_DIM=8"),
            id="dimension-mismatch",
        ),
        pytest.param(
            ("serve", "--host", "0.0.0.0", "--port", "0"),
            {},
            ("refusing to serve on 0.0.0.0", "earm keys create", "EARM_ALLOW_ANONYMOUS"),
            id="public-address-without-keys",
        ),
        pytest.param(
            ("serve", "--port", "0"),
            {"api_keys": "short=*"},
            ("EARM_API_KEYS", "shorter than"),
            id="bad-seed-key",
        ),
        pytest.param(("serve",), {"port": "eighty"}, ("EARM_PORT",), id="unparseable-setting"),
        pytest.param(
            ("keys", "list"), {"log_level": "VERBOSE"}, ("EARM_LOG_LEVEL", "WARNING"),
            id="unknown-log-level",
        ),
        pytest.param(
            ("serve", "--no-background-work", "--port", "0"),
            {"database_url": ""},
            ("without background work", "EARM_DATABASE_URL"),
            id="no-background-work-on-an-embedded-database",
        ),
        pytest.param(
            ("worker",), {"database_url": ""}, ("earm worker", "EARM_DATABASE_URL"),
            id="worker-without-a-database",
        ),
        *(
            pytest.param(
                argv,
                {"database_url": "postgresql://earm:secret-pw@127.0.0.1:1/earm"},
                ("cannot connect to the database at", "earm:***@127.0.0.1:1/earm", "refused"),
                id=f"unreachable-database-{argv[0]}",
            )
            for argv in (("serve", "--port", "0"), ("worker",), ("migrate",), ("keys", "list"))
        ),
        pytest.param(
            ("keys", "create", "--namespaces", ""),
            {},
            ("--namespaces", "'agent-*'"),
            id="key-without-namespaces",
        ),
        pytest.param(
            ("keys", "create", "--namespaces", "team-["),
            {},
            ("--namespaces", "'team-['", "never closes"),
            id="key-with-an-unclosed-set",
        ),
    ],
)
def test_a_configuration_error_is_one_plain_line_with_the_fix(
    run_earm: CommandRunner, argv: tuple[str, ...], env: dict[str, str], hints: tuple[str, ...]
) -> None:
    assert_one_plain_line(run_earm(*argv, **env), *hints)


@pytest.mark.parametrize(
    ("env", "hints"),
    [
        pytest.param(
            {"default_candidates": "300", "max_candidates": "200"},
            ("invalid settings:", "EARM_DEFAULT_CANDIDATES=300", "EARM_MAX_CANDIDATES=200"),
            id="settings-that-contradict-each-other",
        ),
        pytest.param(
            {"scorer": "openai", "scorer_base_url": "ftp://judge.example/v1"},
            ("EARM_SCORER_BASE_URL", "http:// or https://"),
            id="scorer-url-not-http",
        ),
        pytest.param(
            {"embedder": "openai", "embedder_base_url": "judge.example/v1"},
            ("EARM_EMBEDDER_BASE_URL", "http:// or https://"),
            id="embedder-url-without-scheme",
        ),
    ],
)
def test_an_invalid_setting_is_named_and_refused_by_every_command(
    run_earm: CommandRunner, env: dict[str, str], hints: tuple[str, ...]
) -> None:
    """A check across settings named the setting `EARM_` (its location is empty); a scorer URL
    of another scheme was taken, and failed only at the first scorer call."""
    result = run_earm("keys", "list", **env)
    assert_one_plain_line(result, *hints)
    assert "EARM_:" not in result.stderr


def test_serve_reports_a_missing_provider_url_before_it_starts_anything(
    run_earm: CommandRunner,
) -> None:
    """It was reported once Postgres and the embedder had started: here the database cannot be
    reached, so an earm that tried it first reports the database instead."""
    unreachable = "postgresql+psycopg://earm@127.0.0.1:9/earm?connect_timeout=1"
    result = run_earm("serve", "--port", "0", scorer="rerank", database_url=unreachable)
    assert_one_plain_line(result, "EARM_SCORER=rerank requires EARM_SCORER_BASE_URL")


def test_earm_on_an_embedded_database_prints_no_warning_without_xdg_runtime_dir(
    run_earm: CommandRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """platformdirs' RuntimeDirWarning (not JSON, not earm's) was on stderr of every command
    that started the embedded Postgres."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    result = run_earm("migrate", database_url="", data_dir=str(tmp_path / "pgdata"))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_keys_commands_print_their_result_and_no_log_lines(run_earm: CommandRunner) -> None:
    created = run_earm("keys", "create", "--namespaces", "agent-*", "--name", "ci")
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("earm_") and len(created.stdout.splitlines()) == 1
    assert created.stderr.strip().splitlines() == [
        "key enforcement is now on: every request needs a key, the dashboard included "
        "(`earm keys enforcement off` serves requests without one again)",
        "created key 1 (ci) for namespaces agent-*; store it now, it cannot be shown again:",
    ]
    second = run_earm("keys", "create", "--namespaces", "agent-*", "--name", "second")
    assert second.stderr.strip().splitlines() == [
        "created key 2 (second) for namespaces agent-*; store it now, it cannot be shown again:"
    ]
    listed = run_earm("keys", "list")
    assert listed.returncode == 0 and listed.stderr == ""
    assert [line.split()[:3] for line in listed.stdout.splitlines()] == [
        ["id", "name", "status"],
        ["1", "ci", "active"],
        ["2", "second", "active"],
    ]


def test_migrate_prints_the_schema_revision_and_no_log_lines(
    run_earm: CommandRunner, new_database: Callable[[str], str]
) -> None:
    from service.db import migrate

    result = run_earm("migrate", database_url=new_database("earm_cli_migrate"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"schema at {migrate.head_revision()}"
    assert result.stderr == ""


def test_debug_log_level_shows_the_start_up_details(
    run_earm: CommandRunner, new_database: Callable[[str], str]
) -> None:
    result = run_earm("migrate", database_url=new_database("earm_cli_debug"), log_level="DEBUG")
    assert result.returncode == 0, result.stderr
    assert "Running upgrade" in result.stderr


@pytest.mark.parametrize("workers", [(), ("--workers", "2")], ids=["one-process", "workers"])
def test_serve_on_a_taken_port_is_one_plain_line(
    run_earm: CommandRunner, workers: tuple[str, ...]
) -> None:
    """It was uvicorn's exit from inside the running app (an exception group's tracebacks), or
    with workers its log line after the app's start-up check had started everything."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_earm("serve", "--port", str(port), *workers)
    assert_one_plain_line(result, f"cannot listen on 127.0.0.1:{port}", "--port")
