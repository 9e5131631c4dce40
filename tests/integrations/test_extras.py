"""The integrations' optional dependencies: declared as extras, consistent, unneeded by the core."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
OPTIONAL = {
    "mcp": ["mcp"],
    "langchain": ["langchain-core", "langgraph"],
    "llamaindex": ["llama-index-core"],
}


def requirements_by_extra() -> dict[str | None, set[str]]:
    """earm's declared requirements, by extra (None: the core install)."""
    by_extra: dict[str | None, set[str]] = {}
    for line in importlib.metadata.requires("earm") or []:
        requirement = Requirement(line)
        extras = [*OPTIONAL, "dev"]
        marker = requirement.marker
        extra = next((e for e in extras if marker and marker.evaluate({"extra": e})), None)
        by_extra.setdefault(extra, set()).add(requirement.name)
    return by_extra


def test_each_integration_has_an_extra_that_dev_installs_and_the_core_does_not() -> None:
    by_extra = requirements_by_extra()
    for extra, packages in OPTIONAL.items():
        assert set(packages) <= by_extra[extra], extra
        assert not set(packages) & by_extra[None], f"{extra} leaked into the core install"
    assert {"earm"} <= by_extra["dev"]  # dev = earm[mcp,langchain,llamaindex] + test tools
    dev_line = next(
        line for line in importlib.metadata.requires("earm") or [] if line.startswith("earm[")
    )
    assert set(OPTIONAL) <= set(Requirement(dev_line).extras)


def test_the_installed_environment_has_no_broken_requirements() -> None:
    """`pip check`: the extras install cleanly together with the core (CI installs .[dev])."""
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout + check.stderr


PROBE = """
import json, logging, sys
if sys.argv[1] == "without-mcp":
    sys.modules["mcp"] = None  # as if earm[mcp] were not installed
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="LOG %(name)s %(message)s")
from fastapi.routing import iter_route_contexts
from service.http.app import create_app
from service.cli.main import build_parser
from service.settings import Settings
app = create_app(Settings(_env_file=None))
build_parser()
paths = {getattr(route, "path", None) for route in iter_route_contexts(app.routes)}
optional = ["langchain_core", "langgraph", "llama_index", "mcp"]
print(json.dumps({
    "mcp_route": "/mcp" in paths,
    "imported": [name for name in optional if sys.modules.get(name) is not None],
}))
"""


def probe(mode: str) -> tuple[dict, str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    *logs, report = result.stdout.strip().splitlines()
    return json.loads(report), "\n".join(logs)


def test_the_core_app_and_cli_import_no_agent_framework() -> None:
    report, _ = probe("with-mcp")
    assert report == {"mcp_route": True, "imported": ["mcp"]}


def test_without_the_mcp_package_the_app_serves_no_mcp_route_and_says_so() -> None:
    report, logs = probe("without-mcp")
    assert report == {"mcp_route": False, "imported": []}
    assert "the mcp package is not installed (pip install 'earm[mcp]'): /mcp is not served" in logs
