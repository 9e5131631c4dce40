"""The anchor rule of service.retrieve.anchors: its rounds, its reproducibility, and that the
exploring share it learns rises on a stream where exploring pays and falls on one where it
does not.

The synthetic streams stand in for a namespace: memories, a similarity order per query, a
scorer that rates relevant pairs 1 (and a seeded 5% of the others 1 too, as a noisy judge
does), and an estimate that learns per memory from its past scores, as the completion does
when a memory's history forecasts its relevance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from service.completion.posterior import ScorePosterior
from service.retrieve.anchors import (
    EXPLOIT,
    EXPLORE,
    HEAD,
    MARGINAL,
    AnchorHistory,
    AnchorRule,
    OneRound,
    acquisition_values,
    anchor_values,
    expected_entrants,
    exploring_share,
    first_round,
    kth_score,
    learned_plan,
    second_round,
)
from service.settings import Settings

RULE = AnchorRule()


# --- the rounds ---------------------------------------------------------------------------


def test_first_round_takes_the_head_share_of_the_unobserved_candidates() -> None:
    head = first_round(200, np.array([0, 2]), 30, RULE)
    assert head.tolist() == [1, *range(3, 22)]  # ⌈2/3 · 30⌉ = 20, observed 0 and 2 skipped


def test_first_round_never_exceeds_what_is_left() -> None:
    assert first_round(5, np.array([0, 1, 2]), 30, RULE).tolist() == [3, 4]


def test_second_round_exploits_the_highest_estimates_and_explores_the_rest() -> None:
    estimates = np.linspace(0.0, 1.0, 100)
    unscored = np.arange(20, 100)
    second = second_round(estimates, unscored, 10, 0.3, rng_seed=7)
    assert second.exploit.tolist() == list(range(99, 92, -1))  # 7 highest, best first
    assert len(second.explore) == 3
    assert not set(second.explore) & set(second.exploit)
    assert set(second.explore) <= set(unscored)
    assert second.marginal.tolist() == [95, 94, 93]  # the lower half of the exploit picks
    assert second.kinds().tolist() == [EXPLOIT] * 4 + [MARGINAL] * 3 + [EXPLORE] * 3


def test_second_round_leaves_not_explored_candidates_to_the_estimates() -> None:
    unscored = np.arange(50)
    second = second_round(np.zeros(50), unscored, 40, 0.5, 1, not_explored=np.arange(20, 50))
    assert second.exploit.tolist() == list(range(20))
    assert second.explore.size == 0  # the only candidates left are not to be explored


def test_second_round_is_reproducible_for_a_seed() -> None:
    estimates = np.random.default_rng(0).random(200)
    unscored = np.arange(30, 200)
    first = second_round(estimates, unscored, 20, 0.5, rng_seed=11)
    again = second_round(estimates, unscored, 20, 0.5, rng_seed=11)
    other = second_round(estimates, unscored, 20, 0.5, rng_seed=12)
    assert first.positions.tolist() == again.positions.tolist()
    assert first.explore.tolist() != other.explore.tolist()


# --- valuing anchors and learning the share -------------------------------------------------


def _history(rows: list[tuple[int, int, int, float]]) -> AnchorHistory:
    """(query index, kind, memory, score) rows."""
    return AnchorHistory(
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.int8),
        np.array([r[2] for r in rows], dtype=np.int64),
        np.array([r[3] for r in rows], dtype=np.float64),
    )


def test_a_discovery_is_worth_its_later_finds_by_estimate() -> None:
    history = _history([
        (0, EXPLORE, 7, 0.9),  # discovers memory 7
        (1, EXPLOIT, 7, 1.0),  # found again because the model now ranks it high
        (2, MARGINAL, 7, 0.8),
        (3, HEAD, 7, 1.0),  # similarity found it: no credit to the discovery
        (3, EXPLORE, 8, 0.1),
    ])
    assert anchor_values(history, 0.5).tolist() == [3.0, 1.0, 1.0, 1.0, 0.0]


def test_only_the_first_find_of_a_memory_in_the_window_is_a_discovery() -> None:
    history = _history([
        (0, EXPLOIT, 7, 0.9),  # the estimate found memory 7 first
        (1, EXPLORE, 7, 1.0),  # exploring finding it again discovers nothing
        (2, EXPLOIT, 7, 0.8),
    ])
    assert anchor_values(history, 0.5).tolist() == [2.0, 1.0, 1.0]


def reference_anchor_values(history: AnchorHistory, relevant: float) -> np.ndarray:
    """anchor_values by its definition: per anchor 1 for a find, plus, for the earliest find
    of a memory, the estimate-chosen finds of that memory by later queries."""
    values = np.zeros(len(history))
    for i in range(len(history)):
        if history.scores[i] < relevant:
            continue
        values[i] = 1.0
        same = (history.memory_ids == history.memory_ids[i]) & (history.scores >= relevant)
        if history.query_index[i] > history.query_index[same].min():
            continue  # not the memory's first find
        later = same & (history.query_index > history.query_index[i])
        values[i] += np.count_nonzero(later & np.isin(history.kind, (EXPLOIT, MARGINAL)))
    return values


@pytest.mark.parametrize("seed", range(5))
def test_anchor_values_equal_their_definition_on_random_windows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = [(query, int(kind), int(memory), float(score))
            for query in range(40)
            for memory, kind, score in zip(
                rng.choice(60, size=12, replace=False), rng.integers(0, 4, size=12),
                rng.random(12), strict=True)]
    history = _history(rows)
    np.testing.assert_array_equal(anchor_values(history, 0.6),
                                  reference_anchor_values(history, 0.6))
    assert len(anchor_values(AnchorHistory.empty(), 0.6)) == 0


def test_without_history_the_share_is_one_evidence_short_of_half_way() -> None:
    share = exploring_share(AnchorHistory.empty(), RULE)
    assert share == pytest.approx(0.1 + 0.4 * 0.158655, abs=1e-4)


def test_the_share_follows_the_evidence() -> None:
    rows = [(t, MARGINAL, 1000 + t, 1.0 if t % 4 == 0 else 0.0) for t in range(100)]
    worse = _history(rows + [(t, EXPLORE, 2000 + t, 0.0) for t in range(100)])
    better = _history(rows + [(t, EXPLORE, 3000 + t, 1.0) for t in range(100)])
    assert exploring_share(worse, RULE) == pytest.approx(RULE.floor, abs=1e-3)
    assert exploring_share(better, RULE) == pytest.approx(RULE.ceiling, abs=1e-3)


# --- synthetic streams ----------------------------------------------------------------------


@dataclass
class World:
    """``n_memories`` memories; per query a fresh similarity order with ``own`` relevant
    memories in the head and one below it, relevant to that query only, which the estimate
    recognises imperfectly (a bonus against noise, as the content prior ranks the tail better
    than chance). With ``hubs``, hub memories relevant to ``hub_rate`` of the queries that
    similarity always ranks low and that the estimate knows only once it has seen them scored
    relevant: exploring finds them, and then they pay for every later query."""

    hubs: int
    seed: int
    n_memories: int = 300
    own: int = 2
    hub_rate: float = 0.5
    false_positive: float = 0.05
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def query(self) -> tuple[np.ndarray, set[int], np.ndarray]:
        """The candidates, most similar first; the relevant ones; what the estimate recognises
        of them before any score (per candidate position)."""
        hub_ids = np.arange(self.hubs)
        others = self.rng.permutation(np.arange(self.hubs, self.n_memories))
        order = np.insert(others, self.rng.integers(100, len(others), self.hubs), hub_ids)
        below = int(self.rng.integers(100, len(order)))
        relevant = set(order[: self.own].tolist()) | {int(order[below])}
        relevant |= {int(h) for h in hub_ids if self.rng.random() < self.hub_rate}
        recognised = self.rng.normal(0.0, 0.05, len(order))
        recognised[below] += 0.15
        return order, relevant, recognised

    def score(self, memory: int, relevant: set[int]) -> float:
        return 1.0 if memory in relevant or self.rng.random() < self.false_positive else 0.0


def _stream(world: World, n_queries: int, budget: int = 30) -> list[float]:
    """The share the rule explores with at each query of the stream."""
    sums = np.zeros(world.n_memories)
    counts = np.zeros(world.n_memories)
    history = AnchorHistory.empty()
    shares = []
    for t in range(n_queries):
        order, relevant, recognised = world.query()
        head = first_round(len(order), np.zeros(0, dtype=np.int64), budget, RULE)
        # the estimate learns per memory (a shrunk mean of its past scores) on top of what it
        # recognises without history
        estimates = (0.1 + sums[order]) / (1.0 + counts[order]) + recognised
        share = exploring_share(history, RULE)
        shares.append(share)
        unscored = np.setdiff1d(np.arange(len(order)), head)
        second = second_round(estimates, unscored, budget - len(head), share, rng_seed=t)
        positions = np.concatenate([head, second.positions])
        kinds = np.concatenate([np.full(len(head), HEAD), second.kinds()]).astype(np.int8)
        memories = order[positions]
        scores = np.array([world.score(int(m), relevant) for m in memories])
        sums[memories] += scores
        counts[memories] += 1
        history = _recent(history, t, kinds, memories, scores)
    return shares


def _recent(
    history: AnchorHistory, t: int, kinds: np.ndarray, memories: np.ndarray, scores: np.ndarray
) -> AnchorHistory:
    keep = history.query_index > t - RULE.window
    query_index = np.concatenate([history.query_index[keep], np.full(len(kinds), t)])
    memory_ids = np.concatenate([history.memory_ids[keep], memories])
    return AnchorHistory(
        query_index.astype(np.int64),
        np.concatenate([history.kind[keep], kinds]).astype(np.int8),
        memory_ids.astype(np.int64),
        np.concatenate([history.scores[keep], scores]),
    )


def _rolling(shares: list[float], width: int = 20) -> np.ndarray:
    return np.convolve(shares, np.ones(width) / width, mode="valid")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_share_rises_where_exploring_finds_memories_relevant_to_many_queries(
    seed: int,
) -> None:
    """... and falls back once exploring has found them: the estimate then ranks them high
    and exploiting picks them, so exploring discovers nothing new."""
    shares = _stream(World(hubs=20, seed=seed), 200)
    rolling = _rolling(shares)
    peak = int(np.argmax(rolling))
    assert rolling[peak] > shares[0] + 0.15
    assert rolling[-1] < rolling[peak] - 0.1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_share_falls_where_relevant_memories_below_the_head_serve_one_query(
    seed: int,
) -> None:
    shares = _stream(World(hubs=0, seed=seed), 200)
    assert np.mean(shares[50:]) < shares[0] - 0.02
    assert max(_rolling(shares)) < RULE.floor + 0.1


def test_a_stream_is_reproducible_for_a_seed() -> None:
    assert _stream(World(hubs=20, seed=3), 60) == _stream(World(hubs=20, seed=3), 60)


def test_the_share_of_query_t_depends_on_earlier_queries_only() -> None:
    """Causal: a stream cut after 25 queries explores with the same shares over them as the
    whole stream, so nothing of a later query reaches an earlier one."""
    world = World(hubs=20, seed=4)
    shares = _stream(world, 40)
    replay = World(hubs=20, seed=4)
    assert _stream(replay, 25) == shares[:25]


# --- what round two scores: an upper confidence bound -------------------------------------


def test_round_two_prefers_the_uncertain_of_two_equal_estimates_under_an_upper_bound() -> None:
    estimates = np.array([0.3, 0.3, 0.1])
    posterior = ScorePosterior(estimates, np.array([0.05, 0.3, 0.05]))
    unscored = np.arange(3)
    by_bound = second_round(acquisition_values(estimates, posterior, 0.8), unscored, 1, 0.0, 0)
    by_estimate = second_round(acquisition_values(estimates, posterior, 0.5), unscored, 1, 0.0, 0)
    assert by_bound.exploit.tolist() == [1]
    assert by_estimate.exploit.tolist() == [0]  # the tie keeps the more similar


def test_without_a_posterior_round_two_goes_by_the_estimates() -> None:
    estimates = np.array([0.1, 0.4])
    assert acquisition_values(estimates, None, 0.9) is estimates


# --- the stop rule: what round two could still change ---------------------------------------


def test_the_bar_to_enter_the_top_k_is_the_kth_observed_score() -> None:
    scores = np.array([0.1, 0.9, 0.4, 0.7])
    assert kth_score(scores, 1) == 0.9
    assert kth_score(scores, 3) == 0.4
    assert kth_score(scores, 5) is None  # the top 5 is not full of scores


def test_unscored_candidates_far_below_the_top_k_are_expected_to_enter_none() -> None:
    observed = np.array([0.9, 0.8, 0.7])
    posterior = ScorePosterior(np.array([0.9, 0.8, 0.7, 0.1, 0.1]), np.full(5, 0.05))
    expected = expected_entrants(posterior, observed, unscored=np.array([3, 4]), k=3)
    assert expected is not None and expected < 1e-6


def test_an_unscored_candidate_at_the_bar_counts_half() -> None:
    observed = np.array([0.9, 0.6, 0.2])
    posterior = ScorePosterior(np.array([0.0, 0.0, 0.0, 0.6, 0.1]), np.array([1, 1, 1, 0.1, 0.01]))
    assert expected_entrants(posterior, observed, np.array([3, 4]), k=2) == pytest.approx(0.5)


def test_with_fewer_than_k_observed_every_unscored_candidate_may_still_enter() -> None:
    posterior = ScorePosterior(np.zeros(4), np.full(4, 0.01))
    assert expected_entrants(posterior, np.array([0.9, 0.8]), np.array([2, 3]), k=3) is None


def test_one_round_picks_the_rest_by_the_prior_estimates_with_the_head() -> None:
    n, budget = 40, 15
    prior = np.zeros(n)
    prior[[30, 35, 38]] = [0.3, 0.2, 0.1]  # what the namespace knew: three far candidates
    plan = learned_plan(n, np.zeros(0, dtype=np.int64), budget, AnchorHistory.empty(), seed=3,
                        one_round=OneRound(prior, np.zeros(0, dtype=np.int64)))
    assert plan.second_size == 0 and len(plan.first) == budget
    head = plan.first[plan.first_kinds == HEAD]
    np.testing.assert_array_equal(head, np.arange(10))
    exploiting = plan.first[np.isin(plan.first_kinds, (EXPLOIT, MARGINAL))]
    n_explore = round(plan.share * 5)
    # the highest prior estimates first, ties by similarity
    assert list(exploiting) == [30, 35, 38, 10, 11][: 5 - n_explore]
    assert np.count_nonzero(plan.first_kinds == EXPLORE) == n_explore


def test_two_rounds_leave_the_rest_to_round_two() -> None:
    plan = learned_plan(40, np.zeros(0, dtype=np.int64), 15, AnchorHistory.empty(), seed=3)
    assert plan.second_size == 5 and len(plan.first) == 10


def test_one_scorer_round_is_a_setting_of_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("EARM_ANCHOR_ROUNDS", "1")
    assert Settings(_env_file=None).anchor_rounds == 1


def test_the_stop_rule_is_refused_without_a_round_two_to_skip() -> None:
    with pytest.raises(ValueError, match="EARM_ANCHOR_ROUNDS=2"):
        Settings(_env_file=None, stop_expected=0.5)
    assert Settings(_env_file=None, stop_expected=0.5, anchor_rounds=2).stop_expected == 0.5
