"""The groups of settings each component receives, built from the one flat ``Settings``."""

from __future__ import annotations

import dataclasses

import pytest

from service.settings import Settings
from tests.settings_reads import GROUPS, UNGROUPED, fields_read


def test_every_setting_reaches_a_component_through_a_group() -> None:
    read = set().union(*(fields_read(group) for group in GROUPS))
    assert set(Settings.model_fields) - read == set(UNGROUPED)
    assert read <= set(Settings.model_fields)


@pytest.mark.parametrize("group", GROUPS)
def test_a_group_is_a_frozen_value(group: str) -> None:
    value = getattr(Settings(_env_file=None), group)
    field = dataclasses.fields(value)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field.name, None)


def test_a_group_carries_the_values_of_the_flat_settings() -> None:
    settings = Settings(
        _env_file=None, scorer="rerank", scorer_base_url="http://scorer:8080/", scorer_timeout_s=3,
        database_replica_urls="postgresql://a/earm, ,postgresql://b/earm", profile="paper",
    )
    assert settings.scoring.kind == "rerank"
    assert settings.scoring.base_url == "http://scorer:8080"
    assert settings.scoring.timeout_s == 3
    assert settings.database.replica_urls == ("postgresql://a/earm", "postgresql://b/earm")
    assert settings.anchors.policy == "paper" and not settings.anchors.content_prior
    assert settings.completion.model == "plain" and settings.completion.memory_reg == 1.0


def test_a_changed_copy_gives_changed_groups() -> None:
    settings = Settings(_env_file=None).model_copy(update={"rank": 4})
    assert settings.completion.rank == settings.search.rank == 4
