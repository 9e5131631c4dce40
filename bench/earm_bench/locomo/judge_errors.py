"""Judge error models of the LoCoMo oracle: how its scores of (question, turn) pairs err.

``--judge-errors`` selects one (:class:`~earm_bench.locomo.judge.NoiseModel` ``.errors``):

* ``independent`` (the default): every pair errs on its own
  (:func:`earm_bench.locomo.judge.oracle_score`): an evidence turn scores 1, missed (0) with
  probability ``miss``; any other turn scores 0, a false positive (1) with probability
  ``false``; plus N(0, ``noise``), clipped to [0, 1].
* ``correlated``: errors shared across pairs, as an LLM judge's are (:func:`correlated_score`):

  1. **graded scores**: an evidence turn scores a draw around 0.8 (Kumaraswamy(6, 2): median
     0.82, 10–90% 0.61–0.94), still missed (0) with probability ``miss``;
  2. **partial relevance near the evidence**: a turn 1 or 2 positions from an evidence turn of
     the question in the same session (D3:5 next to D3:6) scores 0.3–0.6 at ±1 and half that,
     0.15–0.3, at ±2, instead of 0;
  3. **lexical false positives**: a non-evidence turn is a false positive (a graded draw as
     for evidence) with probability ``false · (1 + 12 · (jaccard - 0.05))``, at least
     ``0.4 · false`` and at most 0.5, where ``jaccard`` is the overlap of the question's and
     the turn's content words (lowercased words of two letters or more minus a short stopword
     list; speaker names count). 0.05 is about the mean overlap of the dev split's
     non-evidence pairs (0.048), so on average they are false positives at the rate
     ``false``, as under ``independent``, but more often where the words overlap, as in a
     semantic first stage's candidates; ``--judge-false 0`` turns every false positive off;
  4. **per-memory bias**: each turn has an offset added to every question's score of it: 15%
     of the turns "look relevant to everything" (+0.2 to +0.5), the others +0 to +0.04;
  5. then N(0, ``noise``) is added, and
  6. **per-query miscalibration**: each question maps its whole scale by
     ``a_q · score + b_q`` (a_q uniform in [0.5, 1.2], b_q in [-0.1, 0.2]), clipped to [0, 1].

* ``crossencoder``: the ``correlated`` score ``s`` mapped to a cross-encoder's scale,
  ``sigmoid(3.8 · s - 4.2)``: 0.015 at 0, 0.17 at 0.7, 0.41 at 1, so relevant pairs land
  around 0.1–0.3 and irrelevant ones under 0.05 (:func:`crossencoder_score`). The order of
  any two pairs is the correlated model's; thresholds set for a 0–1 judge no longer hold.

Every draw is a blake2b hash of its key, never Python's ``hash()`` nor a global RNG: a pair's
draws are keyed by (seed, conversation, question, turn) as ``independent``'s (the flip and the
Gaussian use the very same uniforms), a turn's bias by (seed, conversation, turn), a question's
miscalibration by (seed, conversation, question). A pair scores the same whatever the call
order, protocol or process.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from functools import lru_cache

JUDGE_ERRORS: tuple[str, ...] = ("independent", "correlated", "crossencoder")

#: What each model does, for the run's report (``settings.judge_model.errors_description``).
ERRORS_DESCRIPTIONS: dict[str, str] = {
    "independent": "each pair errs on its own: miss, false positive and noise drawn per pair",
    "correlated": (
        "errors shared across pairs: graded evidence scores (~0.8, missed with p=miss), "
        "partial scores for turns within 2 of an evidence turn of the same session, false "
        "positives with p=false*(1+12*(content-word jaccard-0.05)) in [0.4*false, 0.5], a "
        "per-turn bias (15% of turns +0.2..0.5), N(0, noise), then per-question a*score+b "
        "(a in [0.5,1.2], b in [-0.1,0.2]), clipped to [0,1]"
    ),
    "crossencoder": (
        "the correlated model's score s on a cross-encoder's scale, sigmoid(3.8*s-4.2): "
        "relevant pairs around 0.1-0.3, irrelevant ones under 0.05"
    ),
}
#: Lexical false positives: p = false · (1 + LEXICAL_GAIN · (jaccard - LEXICAL_MEAN)), at
#: least LEXICAL_FLOOR · false, at most LEXICAL_CAP. LEXICAL_MEAN: about the dev split's mean
#: content-word Jaccard of non-evidence pairs (0.048), so their mean rate stays ``false``.
LEXICAL_GAIN = 12.0
LEXICAL_MEAN = 0.05
LEXICAL_FLOOR = 1.0 - LEXICAL_GAIN * LEXICAL_MEAN
LEXICAL_CAP = 0.5
#: Partial relevance by distance to the nearest evidence turn of the same session:
#: (low, high) of a uniform draw.
PARTIAL: dict[int, tuple[float, float]] = {1: (0.3, 0.6), 2: (0.15, 0.3)}
#: Per-memory bias: a share of the turns biased up by a uniform in BIASED, the others by one
#: in [0, BIAS_SMALL].
BIASED_SHARE = 0.15
BIASED = (0.2, 0.5)
BIAS_SMALL = 0.04
#: Per-query miscalibration: a_q · score + b_q, each uniform in its range.
SLOPE = (0.5, 1.2)
OFFSET = (-0.1, 0.2)
#: Graded relevance: Kumaraswamy(A, B) draws (a Beta-like spread around 0.8).
GRADE_A, GRADE_B = 6.0, 2.0
#: The cross-encoder scale: sigmoid(CE_GAIN · score + CE_SHIFT).
CE_GAIN, CE_SHIFT = 3.8, -4.2

_STOPWORD_TEXT = """
    a about after all also am an and any are as at be been before being but by can could did do
    does doing for from had has have having he her hers him his how i if in into is it its
    just me my of on or our out over she so some than that the their them then there these
    they this those to too up us was we were what when where which while who whom whose why
    will with would you your yours"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
_WORD = re.compile(r"[a-z0-9]+")


def uniforms(key: str, n: int = 3) -> tuple[float, ...]:
    """``n`` (at most 4) independent uniforms in [0, 1) from a blake2b hash of ``key``."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8 * n).digest()
    scale = float(2**64)
    return tuple(int.from_bytes(digest[8 * i : 8 * i + 8], "big") / scale for i in range(n))


def gaussian(u_radius: float, u_angle: float) -> float:
    """A standard normal draw from two uniforms (Box–Muller, ``1 - u`` keeps the log finite)."""
    return math.sqrt(-2.0 * math.log(1.0 - u_radius)) * math.cos(2.0 * math.pi * u_angle)


@lru_cache(maxsize=65536)
def content_words(text: str) -> frozenset[str]:
    """Lowercased words of two characters or more, minus :data:`STOPWORDS`."""
    return frozenset(w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS)


def jaccard(question: str, memory: str) -> float:
    """Content-word Jaccard overlap of two texts (0 when either has none)."""
    a, b = content_words(question), content_words(memory)
    union = len(a | b)
    return len(a & b) / union if union else 0.0


@lru_cache(maxsize=65536)
def _position(dia_id: str) -> tuple[int, int] | None:
    """``"D3:5"`` → (3, 5); None for anything else (e.g. another conversation's ``c/D3:5``)."""
    match = re.fullmatch(r"D(\d+):(\d+)", dia_id)
    return (int(match[1]), int(match[2])) if match else None


def evidence_distance(dia_ids: tuple[str, ...], evidence: frozenset[str]) -> int | None:
    """Positions between the turn and the nearest evidence turn of the same session (None when
    no evidence turn shares its session)."""
    best: int | None = None
    for dia in dia_ids:
        here = _position(dia)
        if here is None:
            continue
        for ev in evidence:
            there = _position(ev)
            if there is not None and there[0] == here[0]:
                d = abs(there[1] - here[1])
                best = d if best is None else min(best, d)
    return best


def false_positive_rate(false: float, overlap: float) -> float:
    """A non-evidence turn's false-positive probability at content-word Jaccard ``overlap``."""
    gain = max(LEXICAL_FLOOR, 1.0 + LEXICAL_GAIN * (overlap - LEXICAL_MEAN))
    return min(LEXICAL_CAP, false * gain)


def grade(u: float) -> float:
    """A graded relevance in (0, 1) around 0.8: the Kumaraswamy(6, 2) quantile of ``u``."""
    return float((1.0 - (1.0 - u) ** (1.0 / GRADE_B)) ** (1.0 / GRADE_A))


def _between(bounds: tuple[float, float], u: float) -> float:
    return bounds[0] + (bounds[1] - bounds[0]) * u


@lru_cache(maxsize=65536)
def memory_bias(seed: int, memory_key: str) -> float:
    """The turn's offset added to every question's score of it (``memory_key``: its
    conversation-qualified ids)."""
    u_share, u_size = uniforms(f"{seed}|bias|{memory_key}", 2)
    if u_share < BIASED_SHARE:
        return _between(BIASED, u_size)
    return BIAS_SMALL * u_size


@lru_cache(maxsize=65536)
def miscalibration(seed: int, sample_id: str, question: str) -> tuple[float, float]:
    """The question's (slope a_q, offset b_q)."""
    u_slope, u_offset = uniforms(f"{seed}|scale|{sample_id}|{question}", 2)
    return _between(SLOPE, u_slope), _between(OFFSET, u_offset)


@dataclass(frozen=True)
class PairFacts:
    """What the error models know of a pair besides its hash key."""

    sample_id: str  # the question's conversation
    question: str
    memory: str  # the turn's text
    dia_ids: tuple[str, ...]  # the turn's ids (``conv/D1:2`` for another conversation's turn)
    evidence: frozenset[str]  # the question's evidence ids in its conversation
    relevant: bool

    @property
    def memory_key(self) -> str:
        """The turn's ids, qualified with their conversation."""
        return "|".join(sorted(d if "/" in d else f"{self.sample_id}/{d}" for d in self.dia_ids))


def correlated_score(
    facts: PairFacts, key: str, seed: int, errors: tuple[float, float, float]
) -> float:
    """The ``correlated`` model's score of a pair (``errors``: miss, false, noise; ``key``: the
    pair's hash key, as :func:`~earm_bench.locomo.judge.pair_key` builds it)."""
    miss, false, noise = errors
    u_flip, u_radius, u_angle = uniforms(key, 3)
    u_grade, u_partial = uniforms(f"{key}|graded", 2)
    if facts.relevant:
        latent = 0.0 if u_flip < miss else grade(u_grade)
    else:
        distance = evidence_distance(facts.dia_ids, facts.evidence)
        bounds = PARTIAL.get(distance) if distance is not None else None
        latent = _between(bounds, u_partial) if bounds else 0.0
        if u_flip < false_positive_rate(false, jaccard(facts.question, facts.memory)):
            latent = max(latent, grade(u_grade))
    score = latent + memory_bias(seed, facts.memory_key)
    if noise > 0:
        score += noise * gaussian(u_radius, u_angle)
    slope, offset = miscalibration(seed, facts.sample_id, facts.question)
    return min(1.0, max(0.0, slope * score + offset))


def crossencoder_scale(score: float) -> float:
    """A 0–1 judge's score on a cross-encoder's scale (monotone increasing)."""
    return 1.0 / (1.0 + math.exp(-(CE_GAIN * score + CE_SHIFT)))
