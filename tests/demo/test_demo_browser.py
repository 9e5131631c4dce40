"""`earm demo`'s replay, as the command runs it (the bundled workload, the simulated scorer on
loopback, the service with its settings otherwise untouched), then its dashboard in a real
headless Chromium (Debian's `chromium`, driven by Playwright): estimated memories among those
returned, and a prequential error lower on the questions asked again than on the new ones at
the last budget stage. With EARM_WRITE_SCREENSHOTS=1 it writes docs/demo-dashboard.png and
docs/demo-trace.png (a new question at the last stage: what it scored and what it estimated).

It asks half the workload's questions (each twice), which shows the same and keeps the suite
fast; `earm demo` asks them all, and so does this test when it writes the screenshots, which
show what `earm demo` shows."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from service.client import EarmClient
from service.demo.replay import NAMESPACE, Request, ingest, mean_prequential_error, replay, stream
from service.demo.scorer import scored_by_stand_in, simulated_scorer_app
from service.demo.workload import load
from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer
from tests.browser import CHROMIUM

pytestmark = pytest.mark.browser

DOCS = Path(__file__).resolve().parents[2] / "docs"
WRITE_SCREENSHOTS = os.environ.get("EARM_WRITE_SCREENSHOTS") == "1"
QUESTIONS = None if WRITE_SCREENSHOTS else 40

if not CHROMIUM.exists():
    pytest.skip(
        "needs Chromium at /usr/bin/chromium: apt-get install -y chromium",
        allow_module_level=True,
    )
pytest.importorskip("playwright.sync_api", reason="pip install playwright")


def test_the_demo_shows_estimated_memories_and_a_lower_error_on_questions_asked_again(
    browser: Any, clean_database: str
) -> None:
    workload = load()
    settings = Settings(database_url=clean_database, _env_file=None)
    with (
        LoopbackServer(simulated_scorer_app(workload)) as scorer,
        LoopbackServer(create_app(scored_by_stand_in(settings, scorer.url))) as earm,
        EarmClient(earm.url) as client,
    ):
        ingest(client, workload)
        phases = replay(client, stream(workload.questions[:QUESTIONS]), Request())
        last_new = [phase for phase in phases if not phase.again][-1]
        again = [outcome for phase in phases if phase.again for outcome in phase.outcomes]
        assert last_new.estimated_share > 0
        new_error, again_error = last_new.prequential_error, mean_prequential_error(again)
        assert new_error is not None and again_error is not None
        assert again_error < new_error

        page = browser.new_page(viewport={"width": 1360, "height": 900})
        errors: list[str] = []
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.on("pageerror", lambda error: errors.append(str(error)))

        visit(page, f"{earm.url}/dashboard/namespaces/{NAMESPACE}")
        sources = page.text_content("svg[data-chart=sources]") or ""
        estimated = re.search(r"estimated (\d+)", sources)
        assert estimated is not None and int(estimated.group(1)) > 0, sources
        assert page.locator("svg[data-chart=error] polyline").count() > 0
        screenshot(page, "demo-dashboard.png")

        visit(page, f"{earm.url}/dashboard/queries/{last_new.outcomes[-1].query_id}")
        assert page.locator("#candidates tr.returned td.source.estimated").count() > 0
        screenshot(page, "demo-trace.png")
        assert errors == []


def visit(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state("networkidle")


def screenshot(page: Any, name: str) -> None:
    if WRITE_SCREENSHOTS:
        page.screenshot(path=str(DOCS / name), full_page=True)
