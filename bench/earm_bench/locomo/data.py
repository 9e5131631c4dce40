"""LoCoMo data loading for the replay benchmark.

The LoCoMo data (CC BY-NC 4.0) is never copied into this repository: everything here reads it
from a directory holding one ``<sample_id>.json`` file per conversation (see the data README).

One conversation becomes:

* **memories** — one per dialogue turn: ``external_id = dia_id``,
  ``text = f"{speaker}: {text}"`` plus ``f" [image: {blip_caption}]"`` when the turn carries a
  caption, ``occurred_at`` = the session's start time (ISO-8601, UTC) plus a small per-turn
  offset so that the turns of one session keep their order;
* **questions** — every ``qa`` item in file order, with its category and its evidence ids
  normalised leniently (:func:`normalize_evidence`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Category numbering of LoCoMo's ``qa[].category`` (see the data README, not the paper's §4.1).
CATEGORY_NAMES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}

#: Categories replayed by default (the paper's 1,540 questions are categories 1–4).
DEFAULT_CATEGORIES: tuple[int, ...] = (1, 2, 3, 4)

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")
_EVIDENCE_ID = re.compile(r"^D:?(\d+):(\d+)$")
_DATE_FORMAT = "%I:%M %p on %d %B, %Y"
#: Largest spacing between two consecutive turns of one session.
_MAX_TURN_STEP = timedelta(minutes=1)


@dataclass(frozen=True)
class Turn:
    """One dialogue turn, i.e. one memory of the benchmark."""

    dia_id: str
    session: int
    position: int  # 1-based position inside the session
    speaker: str
    text: str
    caption: str | None
    occurred_at: datetime

    @property
    def memory_text(self) -> str:
        """The memory's text: speaker, utterance and image caption when present."""
        return memory_text(self.speaker, self.text, self.caption)

    def to_memory(self) -> dict[str, Any]:
        """The item of a ``POST /memories`` request for this turn."""
        return {
            "text": self.memory_text,
            "external_id": self.dia_id,
            "occurred_at": self.occurred_at.isoformat(),
            "metadata": {"session": self.session, "speaker": self.speaker},
        }


@dataclass(frozen=True)
class Question:
    """One ``qa`` item with its normalised evidence."""

    sample_id: str
    qa_index: int  # 0-based index into the sample's ``qa`` list
    question: str
    category: int
    evidence: tuple[str, ...]  # normalised, resolvable dia_ids, duplicates removed
    raw_evidence: tuple[str, ...]
    answer: str = ""  # the gold answer ("" for category 5, which has an adversarial one)

    @property
    def has_evidence(self) -> bool:
        """Whether at least one evidence turn resolved (else skipped for recall)."""
        return bool(self.evidence)


@dataclass
class Conversation:
    """One LoCoMo sample: its turns (memories) and questions."""

    sample_id: str
    speaker_a: str
    speaker_b: str
    turns: list[Turn]
    questions: list[Question] = field(default_factory=list)

    @property
    def dia_ids(self) -> frozenset[str]:
        """All turn ids of the (possibly sliced) conversation."""
        return frozenset(t.dia_id for t in self.turns)

    def memories(self) -> list[dict[str, Any]]:
        """All turns as ``POST /memories`` items, in conversation order."""
        return [t.to_memory() for t in self.turns]

    def replay_questions(self, categories: Iterable[int] = DEFAULT_CATEGORIES) -> list[Question]:
        """The questions of the given categories, in file order."""
        wanted = set(categories)
        return [q for q in self.questions if q.category in wanted]


def memory_text(speaker: str, text: str, caption: str | None = None) -> str:
    """Build a memory text: ``"{speaker}: {text}"`` plus ``" [image: {caption}]"`` if any."""
    out = f"{speaker}: {text}"
    if caption:
        out += f" [image: {caption}]"
    return out


def scoped_id(sample_id: str, dia_id: str) -> str:
    """A turn id unique across conversations (the shift stream's): ``conv-26/D1:3``."""
    return f"{sample_id}/{dia_id}"


def parse_session_datetime(value: str) -> datetime:
    """Parse LoCoMo's ``"1:56 pm on 8 May, 2023"`` into an aware UTC datetime."""
    return datetime.strptime(value.strip(), _DATE_FORMAT).replace(tzinfo=UTC)


def normalize_evidence(
    raw: Iterable[Any], valid_ids: Iterable[str] | None = None
) -> tuple[str, ...]:
    """Normalise a ``qa[].evidence`` list leniently, as the data README describes.

    1. split every entry on ``[;,\\s]+`` (``"D8:6; D9:17"`` → two ids);
    2. accept ``^D:?(\\d+):(\\d+)$`` and rebuild ``D{int}:{int}`` (``"D:11:26"``, ``"D3:05"``);
    3. drop ids that are not in ``valid_ids`` (when given: ``"D10:19"`` past a session's end);
    4. remove duplicates, keeping first-seen order.

    Unparseable entries (a bare ``"D"``) are dropped; parentheses are stripped like upstream's
    ``evaluation_stats.py`` does.
    """
    valid = None if valid_ids is None else set(valid_ids)
    out: list[str] = []
    seen: set[str] = set()
    for entry in raw:
        if not isinstance(entry, str):
            continue
        for token in _EVIDENCE_SPLIT.split(entry.replace("(", " ").replace(")", " ")):
            match = _EVIDENCE_ID.match(token.strip())
            if match is None:
                continue
            dia_id = f"D{int(match.group(1))}:{int(match.group(2))}"
            if valid is not None and dia_id not in valid:
                continue
            if dia_id not in seen:
                seen.add(dia_id)
                out.append(dia_id)
    return tuple(out)


def _session_numbers(conversation: dict[str, Any]) -> list[int]:
    """Session numbers that have a turn list (not the stray ``session_N_date_time`` keys)."""
    numbers = []
    for key, value in conversation.items():
        match = _SESSION_KEY.match(key)
        if match and isinstance(value, list):
            numbers.append(int(match.group(1)))
    return sorted(numbers)


def _turns(conv: dict[str, Any], sessions: list[int]) -> list[Turn]:
    """The turns of the given sessions, each at its session's start plus a per-turn offset."""
    starts = [parse_session_datetime(conv[f"session_{n}_date_time"]) for n in sessions]
    turns: list[Turn] = []
    for i, n in enumerate(sessions):
        session_turns = conv[f"session_{n}"]
        start = starts[i]
        step = _MAX_TURN_STEP
        if i + 1 < len(starts) and session_turns:
            # Keep every turn of this session before the next session starts.
            gap = starts[i + 1] - start
            step = min(step, gap / (len(session_turns) + 1))
        for pos, turn in enumerate(session_turns, start=1):
            caption = turn.get("blip_caption") or None
            turns.append(
                Turn(
                    dia_id=str(turn["dia_id"]),
                    session=n,
                    position=pos,
                    speaker=str(turn["speaker"]),
                    text=str(turn.get("text", "")),
                    caption=str(caption) if caption else None,
                    occurred_at=start + step * (pos - 1),
                )
            )
    return turns


def _questions(
    sample: dict[str, Any], all_ids: set[str], kept_ids: set[str] | None
) -> list[Question]:
    """The ``qa`` items with normalised evidence; with ``kept_ids`` (a sliced conversation) only
    those whose evidence is non-empty and lies entirely inside the slice."""
    sample_id = str(sample["sample_id"])
    questions: list[Question] = []
    for idx, qa in enumerate(sample.get("qa", [])):
        raw = tuple(str(e) for e in qa.get("evidence", []) if isinstance(e, str))
        evidence = normalize_evidence(raw, all_ids)
        if kept_ids is not None and (not evidence or not set(evidence) <= kept_ids):
            continue
        questions.append(
            Question(
                sample_id=sample_id,
                qa_index=idx,
                question=str(qa["question"]),
                category=int(qa["category"]),
                evidence=evidence,
                raw_evidence=raw,
                answer="" if qa.get("answer") is None else str(qa["answer"]),
            )
        )
    return questions


def parse_conversation(sample: dict[str, Any], max_sessions: int | None = None) -> Conversation:
    """Turn one LoCoMo sample object into a :class:`Conversation`.

    ``max_sessions`` slices the conversation to its first sessions (for quick tests); questions
    are then kept only if their evidence is non-empty and lies entirely inside the slice.
    """
    conv = sample["conversation"]
    sessions = _session_numbers(conv)
    all_ids = {
        turn["dia_id"] for n in sessions for turn in conv[f"session_{n}"] if "dia_id" in turn
    }
    if max_sessions is not None:
        sessions = sessions[:max_sessions]
    turns = _turns(conv, sessions)
    kept_ids = {t.dia_id for t in turns} if max_sessions is not None else None
    return Conversation(
        sample_id=str(sample["sample_id"]),
        speaker_a=str(conv.get("speaker_a", "")),
        speaker_b=str(conv.get("speaker_b", "")),
        turns=turns,
        questions=_questions(sample, all_ids, kept_ids),
    )


def conversation_files(data_dir: str | Path, samples: Sequence[str] | None = None) -> list[Path]:
    """The conversation files of ``data_dir`` (``*.json``), sorted, optionally filtered by id."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"LoCoMo data directory not found: {root}")
    files = sorted(p for p in root.glob("*.json") if p.is_file())
    if samples:
        wanted = {s.removesuffix(".json") for s in samples}
        files = [p for p in files if p.stem in wanted]
        missing = wanted - {p.stem for p in files}
        if missing:
            raise FileNotFoundError(
                f"conversation(s) not found in {root}: {', '.join(sorted(missing))}"
            )
    if not files:
        raise FileNotFoundError(f"no conversation files (*.json) in {root}")
    return files


def load_conversations(
    data_dir: str | Path,
    samples: Sequence[str] | None = None,
    max_sessions: int | None = None,
) -> list[Conversation]:
    """Load every (or the selected) conversation of a LoCoMo directory, sorted by file name.

    A file may hold one sample object (the split layout) or a list of samples (upstream's
    ``locomo10.json``).
    """
    out: list[Conversation] = []
    for path in conversation_files(data_dir, samples):
        with path.open(encoding="utf-8") as fh:
            data = json.load(fh)
        items = data if isinstance(data, list) else [data]
        for sample in items:
            if not isinstance(sample, dict) or "conversation" not in sample:
                logger.warning("skipping %s: not a LoCoMo sample", path)
                continue
            conv = parse_conversation(sample, max_sessions=max_sessions)
            logger.info(
                "loaded %s: %d turns, %d questions", conv.sample_id, len(conv.turns),
                len(conv.questions),
            )
            out.append(conv)
    return out
