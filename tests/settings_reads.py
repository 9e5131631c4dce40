"""Which of ``Settings``'s fields each of its groups reads (``service.settings_groups``): the
unit tests check that every setting reaches a group, the docs test that each settings table of
docs/operations.md lists settings its group reads."""

from __future__ import annotations

from typing import Any

from service.settings import Settings

#: Every group property of Settings.
GROUPS = (
    "database", "indexing", "learning", "embedding", "scoring", "retrieval", "search", "anchors",
    "completion", "limits", "auth", "serving", "observability", "integrations",
)

#: Settings no component reads once the settings are loaded.
UNGROUPED = {"profile": "a preset the validation applies to the learning settings"}


class _Reads:
    """Stands in for a Settings while a group property runs, noting the fields it reads."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(Settings, name, None)
        if isinstance(attribute, property):  # a derived value or a nested group: its reads
            return attribute.fget(self)  # type: ignore[misc]
        self.names.add(name)
        return getattr(self.settings, name)


def fields_read(group: str) -> set[str]:
    """The fields of Settings that ``settings.<group>`` is built from."""
    reads = _Reads(Settings(_env_file=None))
    getattr(Settings, group).fget(reads)
    return reads.names
