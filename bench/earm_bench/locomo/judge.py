"""Relevance judges for the LoCoMo replay: a label-based oracle served as a chat-completions LLM
or, with ``protocol="rerank"``, as a ``/rerank`` endpoint (Cohere/vLLM shape).

The service scores (query, memory) pairs through its OpenAI-compatible scorer. In the benchmark
that "LLM" is a real HTTP server on loopback (:mod:`service.testing`) whose answers come
from LoCoMo's evidence labels, through a documented noise model:

* the pair is identified by finding a known question text and a known turn (memory) text inside
  the prompt (:meth:`OracleJudge.identify`);
* base label: 1 if the turn is one of the question's evidence turns, else 0;
* an evidence turn is **missed** (label 0) with probability ``miss`` (default 0.2);
* a non-evidence turn is a **false positive** (label 1) with probability ``false`` (default
  0.05);
* Gaussian noise with standard deviation ``noise`` (default 0.1) is added, and the score is
  clipped to [0, 1].

All randomness for a pair comes from ``blake2b(f"{seed}|{sample_id}|{question}|{dia_id}")``,
so a pair always gets the same score for a given seed, whichever policy, namespace, process or
call order asks for it (never Python's salted ``hash()``). An unknown pair is answered ``"0"``.
Through the rerank protocol each (query, document) pair is resolved from the chat scorer's own
user prompt for it and answered the same 3-decimal score, so a run gives the same scores, hence
the same recall, through either protocol.

``--judge-errors`` selects how the scores err: ``independent`` (the default, above: each pair
on its own), ``correlated`` (per-memory bias, partial relevance near the evidence, lexical
false positives, per-query miscalibration, graded scores) or ``crossencoder`` (the correlated
scores on a cross-encoder's scale); see :mod:`earm_bench.locomo.judge_errors`.

The ``local`` judge is the service's own offline scorer: no judge server is started and the
service is configured with ``scorer="local"``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

from earm_bench.locomo.data import Conversation
from earm_bench.locomo.judge_errors import (
    ERRORS_DESCRIPTIONS,
    JUDGE_ERRORS,
    PairFacts,
    correlated_score,
    crossencoder_scale,
    gaussian,
    uniforms,
)
from service.providers.chat_scorer import USER_PROMPT, fill
from service.testing import LoopbackServer, chat_completions_app, rerank_app

logger = logging.getLogger(__name__)

JudgeKind = Literal["oracle", "local", "scorer"]
JudgeProtocol = Literal["chat", "rerank"]

#: Texts at least this long are found through a prefix index; shorter ones by substring search.
_PREFIX_LEN = 16
#: Bound on the prompt → result cache (keys are 16-byte digests).
_CACHE_MAX = 400_000


@dataclass(frozen=True)
class NoiseModel:
    """The oracle's noise model (see the module docstring); ``errors`` names the judge error
    model (:mod:`earm_bench.locomo.judge_errors`)."""

    miss: float = 0.2
    false: float = 0.05
    noise: float = 0.1
    seed: int = 0
    errors: str = "independent"

    def __post_init__(self) -> None:
        if self.errors not in JUDGE_ERRORS:
            raise ValueError(f"errors must be one of {', '.join(JUDGE_ERRORS)}, "
                             f"got {self.errors!r}")
        for name in ("miss", "false"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")


def pair_key(seed: int, sample_id: str, question: str, dia_id: str) -> str:
    """The hash key of one (question, turn) pair."""
    return f"{seed}|{sample_id}|{question}|{dia_id}"


def oracle_score(relevant: bool, key: str, model: NoiseModel) -> float:
    """Score of one pair under ``model``: flipped label plus Gaussian noise, clipped to [0, 1].

    Deterministic in (``relevant``, ``key``, ``model``).
    """
    u_flip, u_radius, u_angle = uniforms(key, 3)
    if relevant:
        label = 0.0 if u_flip < model.miss else 1.0
    else:
        label = 1.0 if u_flip < model.false else 0.0
    if model.noise > 0:
        label += model.noise * gaussian(u_radius, u_angle)
    return min(1.0, max(0.0, label))


def judge_score(facts: PairFacts, model: NoiseModel) -> float:
    """Score of one identified pair under ``model``'s error model; ``independent`` is
    :func:`oracle_score` of the pair's key."""
    key = pair_key(model.seed, facts.sample_id, facts.question, "|".join(sorted(facts.dia_ids)))
    if model.errors == "independent":
        return oracle_score(facts.relevant, key, model)
    score = correlated_score(facts, key, model.seed, (model.miss, model.false, model.noise))
    return crossencoder_scale(score) if model.errors == "crossencoder" else score


@dataclass(frozen=True)
class JudgedPair:
    """A pair identified in a prompt, with its verdict."""

    sample_id: str
    question: str
    dia_ids: tuple[str, ...]  # turns with this text in that conversation (normally one)
    relevant: bool
    score: float


@dataclass(frozen=True)
class _Match:
    start: int
    end: int
    text: str

    @property
    def length(self) -> int:
        return self.end - self.start


class OracleJudge:
    """Answers scorer prompts from LoCoMo evidence labels with a controlled noise model.

    It knows every question and turn text of the given conversations. A prompt is resolved to
    the longest question text and the longest turn text found in it (matches nested inside a
    longer match are ignored) that belong to the same conversation; if both texts exist in
    several conversations, the ones marked active (:meth:`set_active`) are preferred and the
    evidence of the remaining ones is united.
    """

    def __init__(self, conversations: Iterable[Conversation], model: NoiseModel | None = None):
        self.model = model or NoiseModel()
        # question text -> sample_id -> evidence dia_ids (union over same-text questions)
        self._questions: dict[str, dict[str, frozenset[str]]] = {}
        # memory text -> sample_id -> dia_ids having that text
        self._memories: dict[str, dict[str, tuple[str, ...]]] = {}
        q_acc: dict[str, dict[str, set[str]]] = {}
        m_acc: dict[str, dict[str, list[str]]] = {}
        for conv in conversations:
            for q in conv.questions:
                q_acc.setdefault(q.question, {}).setdefault(conv.sample_id, set()).update(
                    q.evidence
                )
            for t in conv.turns:
                m_acc.setdefault(t.memory_text, {}).setdefault(conv.sample_id, []).append(
                    t.dia_id
                )
        self._questions = {
            text: {s: frozenset(ev) for s, ev in per.items()} for text, per in q_acc.items()
        }
        self._memories = {
            text: {s: tuple(ids) for s, ids in per.items()} for text, per in m_acc.items()
        }
        self._by_prefix: dict[str, list[str]] = {}
        self._short: list[str] = []
        for text in set(self._questions) | set(self._memories):
            if not text:
                continue
            if len(text) >= _PREFIX_LEN:
                self._by_prefix.setdefault(text[:_PREFIX_LEN], []).append(text)
            else:
                self._short.append(text)
        for texts in self._by_prefix.values():
            texts.sort(key=len, reverse=True)
        self._active: frozenset[str] = frozenset()
        self._cache: dict[bytes, PairFacts | None] = {}
        self.calls = 0
        self.unknown = 0
        self.relevant_answers = 0

    # --- configuration --------------------------------------------------------------------
    def set_active(self, sample_ids: Iterable[str] | None) -> None:
        """Prefer these conversations when a prompt's texts exist in several of them."""
        self._active = frozenset(sample_ids or ())

    def describe(self) -> dict[str, Any]:
        """A JSON-able description for RESULTS.json."""
        errors = self.model.errors
        return {
            "kind": "oracle",
            "description": (
                "label-based oracle on loopback chat-completions: evidence turn -> 1, missed "
                "with p=miss; non-evidence -> 0, false positive with p=false; plus N(0, noise), "
                "clipped to [0,1]; deterministic per blake2b(seed|sample|question|dia_id)"
            ) if errors == "independent" else (
                f"label-based oracle on loopback chat-completions, {errors} errors (see "
                "errors_description); deterministic per blake2b of (seed, conversation, "
                "question, turn)"
            ),
            **asdict(self.model),
            "errors_description": ERRORS_DESCRIPTIONS[errors],
        }

    def stats(self) -> dict[str, int]:
        """Counters: prompts answered, unknown pairs, answers for evidence pairs."""
        return {
            "calls": self.calls,
            "unknown": self.unknown,
            "evidence_pairs": self.relevant_answers,
        }

    # --- identification -------------------------------------------------------------------
    def _find(self, prompt: str) -> list[_Match]:
        found: list[_Match] = []
        get = self._by_prefix.get
        p = _PREFIX_LEN
        for i in range(len(prompt) - p + 1):
            candidates = get(prompt[i : i + p])
            if candidates:
                for text in candidates:
                    if prompt.startswith(text, i):
                        found.append(_Match(i, i + len(text), text))
        for text in self._short:
            start = prompt.find(text)
            while start != -1:
                found.append(_Match(start, start + len(text), text))
                start = prompt.find(text, start + 1)
        # Ignore matches nested strictly inside a longer match (e.g. a question quoted in a turn).
        return [
            a
            for a in found
            if not any(
                b.length > a.length and b.start <= a.start and a.end <= b.end for b in found
            )
        ]

    def _resolve(self, prompt: str) -> PairFacts | None:
        matches = self._find(prompt)
        questions = sorted(
            (m for m in matches if m.text in self._questions), key=lambda m: -m.length
        )
        memories = sorted(
            (m for m in matches if m.text in self._memories), key=lambda m: -m.length
        )
        for q in questions:
            q_samples = self._questions[q.text]
            for m in memories:
                if m.start < q.end and q.start < m.end:
                    continue  # the same span cannot be both the question and the memory
                m_samples = self._memories[m.text]
                common = sorted(set(q_samples) & set(m_samples))
                if not common:
                    continue
                active = [s for s in common if s in self._active]
                chosen = active or common
                relevant = any(
                    dia in q_samples[s] for s in chosen for dia in m_samples[s]
                )
                sample = chosen[0]
                return PairFacts(sample, q.text, m.text, m_samples[sample],
                                 q_samples[sample], relevant)
        return self._cross_conversation(questions, memories)

    def _cross_conversation(
        self, questions: list[_Match], memories: list[_Match]
    ) -> PairFacts | None:
        """A question of one conversation with a turn of another (``--shift`` puts several
        conversations in one namespace): a known pair that is not evidence; the turn's ids carry
        its conversation so the noise differs from a same-id turn of the question's own."""
        for q in questions:
            for m in memories:
                if m.start < q.end and q.start < m.end:
                    continue
                q_samples = sorted(self._questions[q.text])
                sample = next((s for s in q_samples if s in self._active), q_samples[0])
                ids = tuple(f"{s}/{dia}" for s, dias in sorted(self._memories[m.text].items())
                            for dia in dias)
                return PairFacts(sample, q.text, m.text, ids, frozenset(), False)
        return None

    def identify(self, prompt: str) -> JudgedPair | None:
        """The (question, turn) pair of a scorer prompt with its score, or None if unknown."""
        digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=16).digest()
        if digest in self._cache:
            resolved = self._cache[digest]
        else:
            resolved = self._resolve(prompt)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[digest] = resolved
        if resolved is None:
            return None
        score = judge_score(resolved, self.model)
        return JudgedPair(resolved.sample_id, resolved.question, resolved.dia_ids,
                          resolved.relevant, score)

    def score(self, prompt: str) -> float | None:
        """The score for a prompt, or None when the pair is unknown."""
        pair = self.identify(prompt)
        return None if pair is None else pair.score

    def reply(self, prompt: str) -> str:
        """The assistant text for a chat-completions prompt: the score, e.g. ``"0.870"``."""
        self.calls += 1
        pair = self.identify(prompt)
        if pair is None:
            self.unknown += 1
            if self.unknown <= 5:
                logger.warning(
                    "oracle judge: no known (question, turn) pair in prompt %.200r", prompt
                )
            return "0"
        if pair.relevant:
            self.relevant_answers += 1
        return f"{pair.score:.3f}"

    def rerank(self, query: str, documents: list[str]) -> list[float | None]:
        """Scores of a ``/rerank`` request: each document judged as the chat prompt of the
        (query, document) pair would be."""
        return [float(self.reply(fill(USER_PROMPT, query, document))) for document in documents]


@dataclass(frozen=True)
class YourScorer:
    """``--judge scorer``: a user's own scorer (an OpenAI-compatible chat endpoint, a
    ``/rerank`` or a TEI server), called by the service as in production; its key and other
    settings come from the environment the service reads (``EARM_SCORER_API_KEY``, …)."""

    kind: str  # the service's EARM_SCORER: openai, rerank or tei
    url: str
    model: str

    def service_settings(self) -> dict[str, Any]:
        return {"scorer": self.kind, "scorer_base_url": self.url, "scorer_model": self.model}


@dataclass
class RunningJudge:
    """A judge ready for the service: the scorer settings to use and, for oracle, its server."""

    kind: JudgeKind
    oracle: OracleJudge | None
    url: str | None  # base URL of the judge server ("http://127.0.0.1:PORT")
    app: Any = None
    protocol: JudgeProtocol = "chat"
    yours: YourScorer | None = None

    @property
    def base_url(self) -> str | None:
        """The OpenAI-style base URL (``…/v1``) to give the service's scorer."""
        return f"{self.url}/v1" if self.url else None

    def service_settings(self) -> dict[str, Any]:
        """``Settings`` keyword arguments that point the service's scorer at this judge."""
        if self.kind == "local":
            return {"scorer": "local"}
        if self.yours is not None:
            return self.yours.service_settings()
        return {
            "scorer": "rerank" if self.protocol == "rerank" else "openai",
            "scorer_base_url": self.base_url,
            "scorer_model": "locomo-oracle",
        }

    def describe(self) -> dict[str, Any]:
        """A JSON-able description for RESULTS.json."""
        if self.oracle is not None:
            return {**self.oracle.describe(), "url": self.base_url, "protocol": self.protocol}
        if self.yours is not None:
            return {"kind": "scorer", "scorer": self.yours.kind, "url": self.yours.url,
                    "model": self.yours.model}
        return {"kind": "local", "description": "the service's offline local scorer"}

    def http_calls(self) -> int | None:
        """Requests the judge server received (None for the local judge)."""
        return None if self.app is None else int(self.app.state.calls)


@contextmanager
def start_judge(
    kind: JudgeKind,
    conversations: Sequence[Conversation],
    model: NoiseModel | None = None,
    port: int = 0,
    protocol: JudgeProtocol = "chat",
    yours: YourScorer | None = None,
) -> Iterator[RunningJudge]:
    """Start the judge: an oracle chat-completions (or ``/rerank``) server on loopback, or
    nothing for ``local`` and for ``scorer`` (``yours``, already running)."""
    if kind == "local":
        yield RunningJudge(kind="local", oracle=None, url=None)
        return
    if kind == "scorer":
        if yours is None:
            raise ValueError("--judge scorer needs the scorer's kind, URL and model")
        yield RunningJudge(kind="scorer", oracle=None, url=None, yours=yours)
        return
    if kind != "oracle":
        raise ValueError(f"unknown judge {kind!r} (expected 'oracle', 'local' or 'scorer')")
    oracle = OracleJudge(conversations, model)
    if protocol == "rerank":
        app = rerank_app(oracle.rerank, protocol="rerank", model="locomo-oracle")
    elif protocol == "chat":
        app = chat_completions_app(oracle.reply, model="locomo-oracle")
    else:
        raise ValueError(f"unknown judge protocol {protocol!r} (expected 'chat' or 'rerank')")
    with LoopbackServer(app, port=port) as server:
        logger.info("oracle judge (%s) listening on %s/v1", protocol, server.url)
        yield RunningJudge(kind="oracle", oracle=oracle, url=server.url, app=app, protocol=protocol)
