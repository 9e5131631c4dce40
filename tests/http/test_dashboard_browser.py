"""The dashboard and the API docs in a real headless Chromium (Debian's `chromium`, driven by
Playwright's Python package), after a LoCoMo-like replay: a dated two-speaker conversation
stored as memories, questions about it retrieved through the HTTP API, with a loopback judge
(the chat-completions protocol) scoring from known answers.

Each page must load with no console error, draw every chart, and request nothing from another
origin; the login must refuse a wrong key and scope the namespaces; a recent query must open
its trace. With EARM_WRITE_SCREENSHOTS=1 the test also writes the screenshots of
docs/operations.md."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from service.client import EarmClient
from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app
from tests.browser import CHROMIUM

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "docs"
NAMESPACE = "agent-locomo"

if not CHROMIUM.exists():
    pytest.skip(
        "needs Chromium at /usr/bin/chromium: apt-get install -y chromium",
        allow_module_level=True,
    )
pytest.importorskip("playwright.sync_api", reason="pip install playwright")

# ------------------------------------------------------------------- a LoCoMo-like replay

SPEAKERS = ("Caroline", "Melanie")
ACTIVITIES = (
    ("went to a support group", "the community centre"),
    ("painted a sunrise", "the lake"),
    ("ran a charity race", "the park"),
    ("signed up for pottery", "the art school"),
    ("read a book on adoption", "home"),
    ("camped with the kids", "the mountains"),
    ("visited a museum", "the city"),
    ("played the violin", "a concert"),
    ("planted tomatoes", "the garden"),
)
DATES = [f"{day} May 2023" for day in range(1, 21)]


@dataclass
class Conversation:
    turns: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    answer: dict[str, str] = field(default_factory=dict)  # question -> the turn answering it

    def relevance(self, question: str, memory: str) -> float:
        """1 for the answer, 0.3 for another thing the same speaker did, else 0."""
        if self.answer.get(question) == memory:
            return 1.0
        speaker = question.split()[2]  # "What did <speaker> do on <date>?"
        return 0.3 if f"{speaker} said: I" in memory else 0.0


def conversation() -> Conversation:
    talk = Conversation()
    for day, date in enumerate(DATES):
        for number, speaker in enumerate(SPEAKERS):
            activity, place = ACTIVITIES[(day * 2 + number) % len(ACTIVITIES)]
            turn = f"On {date}, {speaker} said: I {activity} at {place}."
            talk.turns.append(turn)
            talk.turns.append(f"{speaker} asked how the week had been, and laughed.")
            if len(talk.questions) < 36:
                question = f"What did {speaker} do on {date}?"
                talk.questions.append(question)
                talk.answer[question] = turn
    return talk


PROMPT = re.compile(r"Query:\n(.*?)\n\nMemory:\n(.*?)\n\nRelevance", re.DOTALL)


def judge(talk: Conversation) -> Callable[[str], str]:
    def reply(prompt: str) -> str:
        match = PROMPT.search(prompt)
        assert match is not None, prompt
        return str(talk.relevance(match.group(1), match.group(2)))

    return reply


# --------------------------------------------------------------------------------- fixtures


@dataclass
class Watched:
    """A page whose console errors and requests are collected."""

    page: Any
    origin: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def visit(self, path: str) -> Any:
        response = self.page.goto(self.origin + path)
        self.page.wait_for_load_state("networkidle")
        return response

    def assert_clean(self) -> None:
        assert self.errors == [], self.errors
        # data: URLs and blob: URLs the page made itself (ReDoc's worker) stay on the machine.
        local = (self.origin + "/", f"blob:{self.origin}/", "data:")
        foreign = [url for url in self.requests if not url.startswith(local)]
        assert foreign == [], foreign
        self.errors.clear()


def watch(browser: Any, origin: str) -> Watched:
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    watched = Watched(page, origin)
    page.on("console", lambda m: m.type == "error" and watched.errors.append(m.text))
    page.on("pageerror", lambda e: watched.errors.append(str(e)))
    page.on("request", lambda r: watched.requests.append(r.url))
    return watched


def service_app(judge_settings: Callable[..., Settings], judge_url: str) -> FastAPI:
    """The service of a replay: its refits run inside the requests that make them due."""
    settings = judge_settings(
        judge_url,
        embedder="local",
        budget_schedule="0:0.5,8:0.25,20:0.1",
        refit_every=6,
        auth_cache_ttl_s=0,
    )
    return create_app(settings, refit_in_request=True)


#: For every svg.chart: its name and how many of its marks draw something visible.
DRAWN_MARKS_JS = """() => Array.from(document.querySelectorAll('svg.chart')).map(svg => {
  const marks = svg.querySelectorAll('polyline, rect.part, path.observed, path.estimated');
  const drawn = Array.from(marks).filter(mark => {
    const box = mark.getBBox();
    if (mark.tagName === 'polyline') return mark.points.numberOfItems >= 2 && box.width > 0;
    return box.width > 0 && box.height > 0;
  });
  return [svg.dataset.chart, drawn.length];
})"""


def assert_charts_drawn(watched: Watched, expected: set[str]) -> None:
    drawn = dict(watched.page.evaluate(DRAWN_MARKS_JS))
    assert set(drawn) == expected, drawn
    assert all(count > 0 for count in drawn.values()), drawn


def screenshot(watched: Watched, name: str) -> None:
    if os.environ.get("EARM_WRITE_SCREENSHOTS") == "1":
        watched.page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


# ------------------------------------------------------------------------------------ tests


def test_after_a_replay_every_page_loads_clean_draws_its_charts_and_links_to_traces(
    browser: Any, judge_settings: Callable[..., Settings]
) -> None:
    talk = conversation()
    with (
        LoopbackServer(chat_completions_app(judge(talk))) as judge_server,
        LoopbackServer(service_app(judge_settings, judge_server.url)) as earm,
        EarmClient(earm.url) as client,
    ):
        client.add(NAMESPACE, talk.turns)
        for question in talk.questions:
            client.retrieve(NAMESPACE, question, k=5, candidates=24)
        watched = watch(browser, earm.url)

        watched.visit("/dashboard/")
        assert watched.page.locator("#namespaces tbody tr").count() == 1
        watched.page.click("#namespaces th:nth-child(3)")  # sort by queries
        assert watched.page.get_attribute("#namespaces th:nth-child(3)", "aria-sort")
        watched.assert_clean()

        watched.visit(f"/dashboard/namespaces/{NAMESPACE}")
        assert_charts_drawn(watched, {"calls", "stage", "error", "sources"})
        watched.assert_clean()
        screenshot(watched, "dashboard-namespace.png")

        latest = watched.page.locator("#recent a.trace-link").first
        question = latest.inner_text()
        latest.click()
        watched.page.wait_for_load_state("networkidle")
        assert re.search(r"/dashboard/queries/\d+$", watched.page.url)
        assert watched.page.inner_text("blockquote.query-text") == question
        assert watched.page.locator("#candidates tbody tr").count() == 24
        assert watched.page.locator("#candidates tr.returned").count() == 5
        assert watched.page.locator("#candidates tr.anchor").count() >= 1
        watched.assert_clean()
        screenshot(watched, "dashboard-trace.png")

        watched.visit(f"/dashboard/namespaces/{NAMESPACE}/matrix")
        assert_charts_drawn(watched, {"matrix", "matrix-legend"})
        for kind in ("observed", "estimated"):
            assert watched.page.locator(f"svg[data-chart=matrix] path.{kind}").count() > 0
        watched.assert_clean()

        for docs, rendered in (("/docs", ".swagger-ui .info"), ("/redoc", "[role=search]")):
            watched.visit(docs)
            watched.page.wait_for_selector(rendered)
            watched.assert_clean()


def test_the_login_refuses_a_wrong_key_and_shows_only_the_key_namespaces(
    browser: Any, judge_settings: Callable[..., Settings], create_api_key: Callable[[str], str]
) -> None:
    talk = conversation()
    with (
        LoopbackServer(chat_completions_app(judge(talk))) as judge_server,
        LoopbackServer(service_app(judge_settings, judge_server.url)) as earm,
    ):
        # `earm keys create` runs its own event loop: not on this thread, where Playwright's is.
        with ThreadPoolExecutor(1) as thread:
            admin, agent = thread.map(create_api_key, ["*", "agent-*"])
        with EarmClient(earm.url, api_key=admin) as client:
            for namespace in (NAMESPACE, "team-locomo"):
                client.add(namespace, talk.turns[:10])
                client.retrieve(namespace, talk.questions[0], k=3)
        watched = watch(browser, earm.url)

        watched.visit("/dashboard/")
        assert watched.page.url == f"{earm.url}/dashboard/login"
        watched.page.fill("#key", "earm_not-a-valid-key")
        watched.page.click("form.login button")
        watched.page.wait_for_load_state("networkidle")
        assert "unknown or revoked" in watched.page.inner_text("p.error")
        assert watched.page.context.cookies() == []

        watched.page.fill("#key", agent)
        watched.page.click("form.login button")
        watched.page.wait_for_load_state("networkidle")
        assert watched.page.url == f"{earm.url}/dashboard/"
        (cookie,) = watched.page.context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        listed = watched.page.locator("#namespaces tbody td:first-child").all_inner_texts()
        assert listed == [NAMESPACE]
        assert watched.visit("/dashboard/namespaces/team-locomo").status == 403

        watched.page.goto(f"{earm.url}/dashboard/")
        watched.page.click("header form button")  # log out
        watched.page.wait_for_load_state("networkidle")
        assert watched.page.url == f"{earm.url}/dashboard/login"
        assert watched.page.context.cookies() == []
