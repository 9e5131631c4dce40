"""The namespace page's prequential-error chart draws new questions and questions asked before
apart: a stream's error mixes the two, and the second is where reuse shows."""

from __future__ import annotations

from service.db.dashboard import HistoryBucket
from service.http.dashboard.app import _namespace_charts


def bucket(first: int, new: float | None, again: float | None) -> HistoryBucket:
    return HistoryBucket(first_index=first, last_index=first + 9, scorer_calls=50,
                         full_rerank_calls=400, stage=1, budget_share=0.125,
                         prequential_error_new=new, prequential_error_again=again)


def error_chart(history: list[HistoryBucket]) -> str:
    return str(_namespace_charts(history, {}, lambda index: 0)["error"])


def test_new_questions_and_questions_asked_before_are_two_lines() -> None:
    chart = error_chart([bucket(0, 0.2, None), bucket(10, 0.3, 0.15), bucket(20, None, 0.1)])
    assert chart.count('<polyline class="line error"') == 1
    assert chart.count('<polyline class="line error-again"') == 1
    assert "new questions" in chart and "asked before (its scores reused)" in chart


def test_a_stream_without_questions_asked_before_has_one_line() -> None:
    chart = error_chart([bucket(0, 0.2, None), bucket(10, 0.3, None)])
    assert chart.count("<polyline") == 1 and "asked before" not in chart
