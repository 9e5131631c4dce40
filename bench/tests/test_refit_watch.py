"""T6's split of a refit window's retrieves by what ran beside each (a refit's write, the rest
of a refit, none), from the polls of the refit lock: pure, on made-up polls and retrieves."""

from __future__ import annotations

from earm_bench.capacity.refit_watch import FIT, POLL_S, WRITE, RefitWatch
from earm_bench.load.session import Samples


def _samples(spans: list[tuple[float, float]]) -> Samples:
    samples = Samples()
    for start, end in spans:
        samples.spans.append((start, end))
        samples.client_ms.append((end - start) * 1000)
        samples.timings.append({"total_ms": (end - start) * 900, "score_ms": 100.0,
                                "record_ms": 50.0})
        samples.scorer_calls.append(1)
        samples.scorer_requests.append(1)
        samples.scorer_rounds.append(1)
    return samples


def test_each_retrieve_goes_with_the_refit_state_it_overlapped() -> None:
    # A refit fits from 1.0 to 2.0 s, writes at 2.1 and 2.2, and is gone from 2.3 on.
    states = {**{round(1.0 + i * POLL_S, 1): FIT for i in range(11)}, 2.1: WRITE, 2.2: WRITE}
    watch = RefitWatch([(t / 10, states.get(round(t / 10, 1)), 1 if t == 22 else 0,
                         5 if t >= 23 else 0, 2 if t == 24 else 0) for t in range(40)])
    assert watch.intervals(WRITE) == [(2.1 - POLL_S, 2.2 + POLL_S)]
    assert watch.intervals() == [(1.0 - POLL_S, 2.2 + POLL_S)]
    split = watch.split(_samples([(0.0, 0.5), (1.3, 1.6), (2.15, 2.5), (3.0, 3.5)]))
    assert split["during_write"]["client_ms"]["n"] == 1
    assert split["during_read_or_fit"]["client_ms"]["n"] == 1
    assert split["outside_refits"]["client_ms"]["n"] == 2
    assert split["outside_refits"]["phases_ms"]["record_ms"]["p99"] == 50.0
    assert split["lock_waiters"]["write"] == {"polls": 2, "max": 1, "mean": 0.5}
    assert split["refit_s"] == [1.2] and split["write_s"] == [0.1]
    assert split["rows_without_statistics"] == {"max": 5, "at_end": 5}
    assert split["history_readers"]["no_refit"]["max"] == 2
    by_since = {name: part["client_ms"]["n"] for name, part in split["since_write"].items()}
    assert by_since == {"before_any_write": 3, "from_0_to_3_s_after_a_write": 1,
                        "from_3_to_10_s": 0, "from_10_s_on": 0}
