"""The wire contract (``service.api``) is the bottom of the dependency rule for the HTTP API: the
Python client loads nothing of the service but the contract, the contract nothing above itself,
and every body the OpenAPI document names is one of the contract's classes."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import service.api
from service.http.app import create_app
from service.settings import Settings

#: Modules of the service the contract may load: itself, and the pure rules it shares with the
#: settings (``service.checks``: the namespace name pattern).
CONTRACT_MODULES = ("service", "service.checks", "service.api")


def _service_modules_loaded_by(*modules: str) -> list[str]:
    """The ``service`` modules a fresh interpreter holds after importing ``modules``."""
    probe = "\n".join(
        [
            "import importlib, json, sys",
            *(f"importlib.import_module({module!r})" for module in modules),
            "print(json.dumps(sorted(m for m in sys.modules if m.partition('.')[0] == 'service')))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def _outside_the_contract(modules: list[str]) -> list[str]:
    return [
        module
        for module in modules
        if module not in CONTRACT_MODULES and not module.startswith("service.api.")
    ]


def test_the_client_loads_nothing_of_the_service_but_the_contract() -> None:
    loaded = _service_modules_loaded_by("service.client")
    assert _outside_the_contract(loaded) == ["service.client"]


def test_the_contract_loads_nothing_above_it() -> None:
    contract = [
        "service.api.errors", "service.api.fields", "service.api.health", "service.api.memories",
        "service.api.namespaces", "service.api.queries", "service.api.rerank",
        "service.api.retrieve", "service.api.stats",
    ]
    assert _outside_the_contract(_service_modules_loaded_by(*contract)) == []


def test_every_body_of_the_openapi_document_is_a_class_of_the_contract() -> None:
    contract: dict[str, str] = {}
    for module in pkgutil.iter_modules(service.api.__path__, "service.api."):
        for name, value in vars(importlib.import_module(module.name)).items():
            if isinstance(value, type) and value.__module__ == module.name:
                contract[name] = module.name
    document = create_app(Settings(embedder="none", _env_file=None)).openapi()
    schemas = set(document["components"]["schemas"])
    assert {"RetrieveIn", "RetrieveResult", "ErrorResponse", "CohereRerankOut"} <= schemas
    assert sorted(schemas - set(contract)) == []
