"""Which candidates of a retrieve the scorer sees (``EARM_ANCHOR_POLICY``): by default two
rounds of calls, and an exploring share each namespace learns from what its anchors found; or
the EARM paper's one round (``paper``). Pure numpy, no I/O.

Round 1 scores the head: the most similar unobserved candidates, a fixed share of the budget
(a query judges its own head itself; the head is also what its parameters are folded in from).
Round 2 spends the rest on the unobserved candidates the completion estimates highest (with
this query folded in from round one, paraphrase evidence included), except an exploring share
drawn uniformly from the rest. By default (``EARM_ANCHOR_ROUNDS=1``) the rest is picked with
the head, by the estimates the namespace had before this query (:class:`OneRound`), and every
anchor leaves in one round; with ``EARM_ANCHOR_ROUNDS=2`` it waits for the head's scores.

Why the exploring share is learned and not fixed: exploring pays only where a memory found
below the head is relevant to later queries too (the model then ranks it high for them), and
that is a property of the namespace's traffic. Each anchor is valued by what it found: 1 if
the scorer rated it relevant, plus, if it was the first anchor of the recent queries to find
that memory relevant, one for every later estimate-chosen anchor that found it relevant again
(the discovery paid off later). The exploring anchors are compared with the exploiting anchors they
displace (the lower half of round two's exploiting picks) over the namespace's recent queries,
and the share rises from its floor only as far as the evidence says exploring is worth more.

When to stop (:func:`expected_entrants`, for the plan): round two is skipped when the unscored
candidates are expected, by round one's posterior, to put fewer than ``EARM_STOP_EXPECTED`` of
them above the k-th observed score (:func:`kth_score`), the bar to enter the top k.
docs/design.md "Budget and anchors" has the measurements.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from service.completion import ScorePosterior

#: Anchor kinds, stored with each observation: the head round; round two's exploiting picks by
#: estimate, upper half (EXPLOIT) and lower half (MARGINAL, what exploring displaces first);
#: round two's exploring picks. The paper's rule has a head and exploring picks only.
HEAD, EXPLOIT, MARGINAL, EXPLORE = 0, 1, 2, 3
#: Why an anchor of each kind was scored, as ``GET /queries/{id}`` says.
REASONS = {HEAD: "head", EXPLOIT: "estimate", MARGINAL: "estimate", EXPLORE: "explore"}


def anchor_seed(namespace: str, query_index: int, seed: int) -> int:
    """A stable 64-bit seed: the same (namespace, index, seed) replays the same anchors."""
    digest = hashlib.blake2b(f"{namespace}\x1f{query_index}\x1f{seed}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


@dataclass(frozen=True)
class AnchorRule:
    """The rule's parameters (the settings)."""

    head_share: float = 2 / 3  # of the budget, scored in round one
    floor: float = 0.1  # least exploring share of round two: keeps the tail observed
    ceiling: float = 0.5  # largest: the exploiting picks stay measured too
    # How many standard errors exploring must be ahead before it gets half of the way from
    # floor to ceiling: without evidence, the rule exploits.
    evidence: float = 1.0
    window: int = 100  # recent queries whose anchors the share is learned from
    relevant: float = 0.5  # a score at least this is a find

    def __post_init__(self) -> None:
        if not 0.0 <= self.head_share <= 1.0:
            raise ValueError(f"head_share must be in [0, 1], got {self.head_share}")
        if not 0.0 <= self.floor <= self.ceiling <= 1.0:
            raise ValueError(f"need 0 <= floor <= ceiling <= 1, got {self.floor}, {self.ceiling}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


def first_round(
    n_candidates: int, observed: np.ndarray, budget: int, rule: AnchorRule
) -> np.ndarray:
    """Round 1: the first ⌈head_share · budget⌉ candidate positions (most similar first) that
    the query's family has not ``observed``."""
    remaining = np.setdiff1d(np.arange(n_candidates, dtype=np.int64), observed)
    size = min(len(remaining), max(0, budget))
    head: np.ndarray = remaining[: math.ceil(rule.head_share * size)]
    return head


@dataclass(frozen=True)
class SecondRound:
    exploit: np.ndarray  # positions, highest estimate first
    explore: np.ndarray  # positions, ascending
    # Anchors the round would have scored that the stop rule left unscored (then no positions).
    stopped: int = 0

    @classmethod
    def stop(cls, size: int) -> SecondRound:
        """No round two: the ``size`` anchors it had are not scored."""
        nothing = np.zeros(0, dtype=np.int64)
        return cls(nothing, nothing, stopped=size)

    @property
    def marginal(self) -> np.ndarray:
        """The exploiting picks exploring would displace first: the lower half by estimate."""
        lower: np.ndarray = self.exploit[(len(self.exploit) + 1) // 2 :]
        return lower

    @property
    def positions(self) -> np.ndarray:
        return np.concatenate([self.exploit, self.explore]).astype(np.int64)

    def kinds(self) -> np.ndarray:
        """The kind of each of :attr:`positions`."""
        n_upper = (len(self.exploit) + 1) // 2
        return np.concatenate([
            np.full(n_upper, EXPLOIT), np.full(len(self.exploit) - n_upper, MARGINAL),
            np.full(len(self.explore), EXPLORE),
        ]).astype(np.int8)


def acquisition_values(
    estimates: np.ndarray, posterior: ScorePosterior | None, level: float
) -> np.ndarray:
    """What round two's exploiting picks are the highest of: each candidate's posterior
    quantile at ``level`` (``EARM_ACQUISITION_QUANTILE``): the estimate at 0.5, above it an
    upper confidence bound that favours candidates the anchors leave uncertain; the
    ``estimates`` without a posterior. Why an upper bound: a candidate unlike the anchors is
    where the fold-in knows least, and scoring it teaches the most (the UCB rule of
    bandits)."""
    if posterior is None:
        return estimates
    return posterior.quantile(level)


def second_round(
    values: np.ndarray,
    unscored: np.ndarray,
    size: int,
    share: float,
    rng_seed: int,
    not_explored: np.ndarray | None = None,
) -> SecondRound:
    """Round 2 among the ``unscored`` candidate positions: ``size`` anchors, of which
    round(share · size) are drawn uniformly from those the exploiting picks leave (never from
    ``not_explored``: candidates paraphrases' evidence already speaks for) and the rest are the
    highest ``values`` (the plan's acquisition values; ties: the more similar first). Seeded,
    so a replay picks the same."""
    size = min(max(0, size), len(unscored))
    n_explore = min(size, int(round(share * size)))
    by_value = unscored[np.argsort(-values[unscored], kind="stable")]
    exploit = by_value[: size - n_explore]
    rest = np.setdiff1d(unscored, exploit)
    if not_explored is not None:
        rest = np.setdiff1d(rest, not_explored)
    explore = np.random.default_rng(rng_seed).choice(
        rest, size=min(n_explore, len(rest)), replace=False
    )
    return SecondRound(exploit.astype(np.int64), np.sort(explore).astype(np.int64))


@dataclass(frozen=True)
class AnchorHistory:
    """The fresh anchors of a namespace's recent queries, one entry per scored pair."""

    query_index: np.ndarray  # int64
    kind: np.ndarray  # int8, HEAD / EXPLOIT / MARGINAL / EXPLORE
    memory_ids: np.ndarray  # int64
    scores: np.ndarray  # float64

    @classmethod
    def empty(cls) -> AnchorHistory:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, np.zeros(0, dtype=np.int8), none, np.zeros(0))

    def __len__(self) -> int:
        return len(self.query_index)


def anchor_values(history: AnchorHistory, relevant: float) -> np.ndarray:
    """Each anchor's value: 1 for a find, plus, for the first find of its memory in
    ``history`` (a discovery, as far as the recent queries tell), the later finds of that
    memory by estimate-chosen anchors (EXPLOIT or MARGINAL).

    Discoveries are judged within the window, not over the namespace's whole life: the rule
    then needs no state beyond its recent observations, and a memory found long ago and
    forgotten by the model is rediscovered in effect when exploring finds it again."""
    found = history.scores >= relevant
    values = found.astype(np.float64)
    later_finds = found & np.isin(history.kind, (EXPLOIT, MARGINAL))
    discoveries = _first_finds(history, found)
    # A discovery is its memory's earliest find, and a query scores a memory once, so the
    # memory's estimate-chosen finds after it are all of them but the discovery itself: one
    # count per memory (a loop over discoveries, each scanning the window, was a fifth of a
    # retrieve's CPU at 35 anchors per query).
    memories, memory = np.unique(history.memory_ids, return_inverse=True)
    finds_per_memory = np.bincount(memory, weights=later_finds, minlength=len(memories))
    values[discoveries] += finds_per_memory[memory[discoveries]] - later_finds[discoveries]
    return values


def _first_finds(history: AnchorHistory, found: np.ndarray) -> np.ndarray:
    """Positions of the earliest find of each memory found in ``history`` (several anchors of
    one query cannot score the same memory, so the earliest is unique)."""
    finds = np.flatnonzero(found)
    # Sorted by memory, then query index: the first row of each memory's run is its first find.
    order = finds[np.lexsort((history.query_index[finds], history.memory_ids[finds]))]
    memories = history.memory_ids[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = memories[1:] != memories[:-1]
    return order[first]


def exploring_share(history: AnchorHistory, rule: AnchorRule) -> float:
    """The exploring share of round two for the next query, from ``history`` (its queries < t):
    floor + (ceiling − floor) · Φ(z − evidence), z the standardised difference between the
    mean value of the exploring anchors and of the marginal exploiting ones (Welch; each arm
    starts from one anchor of value 0, so an arm without anchors counts as worthless)."""
    values = anchor_values(history, rule.relevant)
    means, variances = [], []
    for kind in (EXPLORE, MARGINAL):
        arm = np.concatenate([[0.0], values[history.kind == kind]])
        means.append(float(arm.mean()))
        variances.append(max(float(arm.var()), 1e-4) / len(arm))
    z = (means[0] - means[1]) / math.sqrt(variances[0] + variances[1])
    advance = 0.5 * (1.0 + math.erf((z - rule.evidence) / math.sqrt(2.0)))
    return rule.floor + (rule.ceiling - rule.floor) * advance


def kth_score(scores: np.ndarray, k: int) -> float | None:
    """The k-th highest of a query's observed ``scores``: what an unscored candidate must beat
    to enter its top k (None: fewer than k observed, the top k is not yet full of scores)."""
    if len(scores) < k or k < 1:
        return None
    return float(np.partition(scores, len(scores) - k)[len(scores) - k])


def expected_entrants(
    posterior: ScorePosterior, observed_scores: np.ndarray, unscored: np.ndarray, k: int
) -> float | None:
    """How many of the ``unscored`` candidates the ``posterior`` expects to score above the
    k-th observed score (the plan's stop rule weighs this against ``EARM_STOP_EXPECTED``).
    None with fewer than k observed: the top k is not full of judgements yet, so every
    unscored candidate could still enter it."""
    bar = kth_score(observed_scores, k)
    if bar is None:
        return None
    return float(posterior.beat_probability(bar)[unscored].sum())


# --- the plan of a retrieve: round one now, round two from round one's scores ---------------------


@dataclass(frozen=True)
class AnchorPlan:
    """What a retrieve scores: round one at once, then, once its scores are in, ``second_size``
    anchors chosen by :func:`second_round` with the exploring ``share`` (None: no choice was
    left to make, nothing explores) seeded by ``seed``."""

    first: np.ndarray  # candidate positions
    first_kinds: np.ndarray  # int8, one kind per position
    second_size: int
    share: float | None
    seed: int


@dataclass(frozen=True)
class OneRound:
    """What a one-round plan chooses the picks after the head by, before any score of this
    query: each candidate's estimate from what the namespace knew (``prior_estimates``), and
    the candidates paraphrases' evidence speaks for (``steered``: never explored)."""

    prior_estimates: np.ndarray
    steered: np.ndarray


def learned_plan(
    n_candidates: int, observed: np.ndarray, budget: int, history: AnchorHistory, seed: int,
    one_round: OneRound | None = None,
) -> AnchorPlan:
    """The default rule's plan for a budget among the candidates the query's family has not
    ``observed``: the head, then the rest by estimate with the share ``history`` has earned.
    In two rounds (``one_round`` None) the rest waits for the head's scores, folded in; with
    ``one_round`` it is picked now, by the prior estimates, and all anchors leave together.
    A budget that covers every unobserved candidate leaves nothing to choose: one round."""
    rule = AnchorRule()
    remaining = np.setdiff1d(np.arange(n_candidates, dtype=np.int64), observed)
    if budget >= len(remaining):
        return AnchorPlan(remaining, np.full(len(remaining), HEAD, np.int8), 0, None, seed)
    first = first_round(n_candidates, observed, budget, rule)
    second_size = max(0, budget) - len(first)
    share = exploring_share(history, rule) if second_size > 0 else None
    head_kinds = np.full(len(first), HEAD, np.int8)
    if one_round is None:
        return AnchorPlan(first, head_kinds, second_size, share, seed)
    rest = second_round(
        one_round.prior_estimates, np.setdiff1d(remaining, first), second_size, share or 0.0,
        seed, one_round.steered,
    )
    positions = np.concatenate([first, rest.positions]).astype(np.int64)
    return AnchorPlan(positions, np.concatenate([head_kinds, rest.kinds()]), 0, share, seed)


def paper_plan(
    n_candidates: int, observed: np.ndarray, budget: int, seed: int, steered: np.ndarray
) -> AnchorPlan:
    """The EARM paper's rule, in one round: :func:`unobserved_anchors`; its exploring half is
    all the budget after the head, hence a share of 1. A budget that covers every unobserved
    candidate (``full``) explores nothing: all of them are the head."""
    anchors, kinds = unobserved_anchors(n_candidates, observed, budget, seed, steered)
    if budget >= n_candidates - len(observed):
        return AnchorPlan(anchors, np.full(len(anchors), HEAD, np.int8), 0, None, seed)
    share = 1.0 if np.any(kinds == EXPLORE) else None
    return AnchorPlan(anchors, kinds, 0, share, seed)


def sample_anchors(
    n_candidates: int, budget: int, rng_seed: int, not_explored: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's anchors: candidate positions (0 = most similar) to score, ascending, and
    the kind of each.

    Half the budget (rounded up) exploits the top of the semantic ranking; the other half is
    drawn uniformly from the lower-ranked rest, which both finds relevant memories that
    similarity under-ranks and spreads observations over the matrix for completion to learn from.
    The exploring half leaves ``not_explored`` alone (fewer anchors if nothing else is left).
    """
    budget = max(0, min(budget, n_candidates))
    n_top = (budget + 1) // 2
    top = np.arange(n_top)
    rest = np.arange(n_top, n_candidates)
    if not_explored is not None:
        rest = np.setdiff1d(rest, not_explored)
    explored = np.random.default_rng(rng_seed).choice(
        rest, size=min(budget - n_top, len(rest)), replace=False
    )
    positions = np.concatenate([top, explored]).astype(np.int64)
    order = np.argsort(positions, kind="stable")
    kinds = np.where(positions < n_top, HEAD, EXPLORE).astype(np.int8)
    return positions[order], kinds[order]


def unobserved_anchors(
    n_candidates: int, observed: np.ndarray, budget: int, rng_seed: int, steered: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's anchors among the candidates the query's family has not ``observed``, as
    :func:`sample_anchors` picks them from that shorter, still most-similar-first list: the
    exploiting half takes its head, whatever paraphrases observed of it (a query judges its
    own head itself: a distinct question that merely reads alike would otherwise speak for
    it), and the exploring half leaves the ``steered`` candidates to the paraphrases' evidence,
    so a rephrased need widens coverage as a repeated one does."""
    remaining: np.ndarray = np.setdiff1d(np.arange(n_candidates, dtype=np.int64), observed)
    not_explored = np.flatnonzero(np.isin(remaining, steered))
    picked, kinds = sample_anchors(len(remaining), budget, rng_seed, not_explored)
    anchors: np.ndarray = remaining[picked]
    return anchors, kinds
