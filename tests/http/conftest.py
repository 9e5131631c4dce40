"""Fixtures of the HTTP tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from service.cli import main as earm
from service.testing import GatedEmbed

#: Creates an API key for comma-separated namespace patterns with `earm keys create` against
#: the test database (the first key turns key enforcement on); returns the key.
CreateKey = Callable[[str], str]


@pytest.fixture
def create_api_key(
    clean_database: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> CreateKey:
    monkeypatch.setenv("EARM_DATABASE_URL", clean_database)
    monkeypatch.setenv("EARM_EMBEDDER", "none")

    def create(patterns: str) -> str:
        capsys.readouterr()
        assert earm(["keys", "create", "--namespaces", patterns]) == 0
        return capsys.readouterr().out.strip()

    return create


@pytest.fixture
def gate() -> Iterator[GatedEmbed]:
    """An embeddings callback that holds texts starting with "held:" until the test opens it,
    with vectors of the test database's dimension (384)."""
    embedder = GatedEmbed(dim=384)
    yield embedder
    embedder.opened.set()  # never leave a held request behind
