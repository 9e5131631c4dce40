"""Agent integrations: MCP (``/mcp`` and ``earm mcp``), LangChain/LangGraph, LlamaIndex.

Each lives in its own module and imports its optional library (extras ``earm[mcp]``,
``earm[langchain]``, ``earm[llamaindex]``) at module level, so only code that uses an
integration needs it. ``mount_mcp`` is what the app factory calls (``earm mcp`` is
``service/cli/mcp.py``); it imports nothing optional until used.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING

from service.settings_groups import IntegrationSettings, ServingSettings

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)

MCP_MISSING = "the mcp package is not installed (pip install 'earm[mcp]')"


def mount_mcp(
    app: FastAPI, serving: ServingSettings, integrations: IntegrationSettings
) -> None:
    """Serve the MCP tools at ``/mcp`` of ``app`` when the ``mcp`` package is installed."""
    if importlib.util.find_spec("mcp") is None:
        log.info("%s: /mcp is not served", MCP_MISSING)
        return
    from service.integrations.mcp import mount

    mount(app, serving, integrations)
