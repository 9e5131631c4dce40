"""An identical rerank call within the window is answered as it was (service.retrieve.given
.RepeatedCalls): the answer is kept per exact call, expires with the window, is bounded, never
kept when degraded, and forgotten with its namespace."""

from __future__ import annotations

from service.retrieve.given import RepeatedCalls, RerankedDocument, RerankRequest, RerankResult

CALL = RerankRequest("ns", "Is Alice allergic?", ("a", "b", "c"), top_n=2)


def answer(namespace: str = "ns", degraded: bool = False) -> RerankResult:
    return RerankResult(
        namespace=namespace, query_id=7, budget=3, scorer_calls=2, reused=1, estimated=0,
        degraded=degraded,
        documents=[RerankedDocument(1, 11, 0.9), RerankedDocument(0, 10, 0.5),
                   RerankedDocument(2, 12, 0.1)],
        stored=3, timings={"total_ms": 5.0}, retrieve=None,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_identical_call_gets_the_same_order_as_a_repeat_that_cost_nothing() -> None:
    repeats = RepeatedCalls(600.0)
    repeats.remember(CALL, answer())
    again = repeats.answer(CALL)
    assert again is not None
    assert again.documents == answer().documents and again.query_id == 7
    assert (again.budget, again.scorer_calls, again.stored) == (0, 0, 0)
    assert again.reused == 3  # every cell the first answer observed, taken from experience


def test_any_difference_in_the_call_is_another_call() -> None:
    repeats = RepeatedCalls(600.0)
    repeats.remember(CALL, answer())
    for other in (
        RerankRequest("ns", "Is Alice allergic?", ("b", "a", "c"), top_n=2),
        RerankRequest("ns", "Is Alice allergic?", ("a", "b", "c"), top_n=3),
        RerankRequest("ns", "Is Alice allergic? ", ("a", "b", "c"), top_n=2),
        RerankRequest("other", "Is Alice allergic?", ("a", "b", "c"), top_n=2),
        # the parts are length-prefixed: moving a boundary is not the same call
        RerankRequest("ns", "Is Alice allergic?", ("ab", "", "c"), top_n=2),
    ):
        assert repeats.answer(other) is None


def test_an_answer_expires_with_the_window() -> None:
    clock = Clock()
    repeats = RepeatedCalls(60.0, clock=clock)
    repeats.remember(CALL, answer())
    clock.now += 60.0
    assert repeats.answer(CALL) is not None
    clock.now += 0.1
    assert repeats.answer(CALL) is None


def test_the_least_recent_answers_go_first_beyond_the_capacity() -> None:
    repeats = RepeatedCalls(600.0, capacity=2)
    calls = [RerankRequest("ns", f"q{i}", ("a",)) for i in range(3)]
    for call in calls:
        repeats.remember(call, answer())
    assert repeats.answer(calls[0]) is None
    assert repeats.answer(calls[1]) is not None and repeats.answer(calls[2]) is not None


def test_a_degraded_answer_or_a_closed_window_keeps_nothing() -> None:
    repeats = RepeatedCalls(600.0)
    repeats.remember(CALL, answer(degraded=True))
    assert repeats.answer(CALL) is None
    closed = RepeatedCalls(0.0)
    closed.remember(CALL, answer())
    assert closed.answer(CALL) is None


def test_an_erased_namespace_forgets_its_answers_only() -> None:
    repeats = RepeatedCalls(600.0)
    other = RerankRequest("other", CALL.query, CALL.documents, CALL.top_n)
    repeats.remember(CALL, answer())
    repeats.remember(other, answer("other"))
    repeats.forget_namespace("ns")
    assert repeats.answer(CALL) is None and repeats.answer(other) is not None
