"""What ``earm demo`` prints: a line per phase as it ends, then a summary of the whole replay."""

from __future__ import annotations

from collections.abc import Sequence

from service.demo.replay import Phase, Request, mean_prequential_error


def _error(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def phase_line(phase: Phase, request: Request) -> str:
    """One phase: what it cost against a full rerank and what the model did."""
    asked = "asked again" if phase.again else "new"
    return (
        f"  {asked:11s} stage {phase.stage} · questions {phase.first}–{phase.last} · scorer "
        f"calls {phase.scorer_calls} of {phase.full_rerank_calls} · estimated "
        f"{phase.estimated_share:.0%} of the top {request.k} · answer in the top {request.k} "
        f"{phase.answered_share:.0%} · prequential error {_error(phase.prequential_error)}"
    )


def summary(phases: Sequence[Phase], request: Request) -> list[str]:
    """The replay's totals, and its prequential error at three points: the first stage (every
    candidate scored), new questions at the last stage's budget, and questions asked again."""
    outcomes = [outcome for phase in phases for outcome in phase.outcomes]
    calls = sum(phase.scorer_calls for phase in phases)
    full = sum(phase.full_rerank_calls for phase in phases)
    returned = sum(outcome.returned for outcome in outcomes)
    estimated = sum(outcome.estimated for outcome in outcomes)
    answered = sum(outcome.answered for outcome in outcomes)
    again = [outcome for outcome in outcomes if outcome.again]
    last_new = [phase for phase in phases if not phase.again][-1]
    lines = [
        f"Summary of {len(outcomes)} retrieves, {len(again)} of them a question asked again "
        f"(top {request.k} of {request.candidates} candidates; scores from the SIMULATED "
        "scorer):",
        f"  scorer calls       {calls:,} made where a full rerank of every candidate makes "
        f"{full:,}: {1 - calls / max(full, 1):.0%} saved",
        f"  estimated share    {estimated / max(returned, 1):.0%} of the memories returned were "
        f"ranked by the completion model's estimate ({last_new.estimated_share:.0%} for the new "
        f"questions at stage {last_new.stage})",
        f"  answer found       {answered / max(len(outcomes), 1):.0%} of the retrieves had the "
        f"memory that answers the question in their top {request.k}",
    ]
    new = [phase for phase in phases if not phase.again]
    if len(new) >= 2 and again:
        first, last = new[0], new[-1]
        anchors = last.scorer_calls / len(last.outcomes)
        indent = " " * 21
        lines += [
            f"  prequential error  {_error(first.prequential_error)} at stage {first.stage}, "
            "where every candidate is scored (most of them plainly irrelevant, easy to predict);",
            f"{indent}{_error(last.prequential_error)} on new questions at stage {last.stage}, "
            f"where {anchors:.0f} of {request.candidates} are scored, the most similar first (the "
            "hardest to predict);",
            f"{indent}{_error(mean_prequential_error(again))} on the questions asked again: "
            "what their first asking observed is reused, and predicts the rest",
        ]
    return lines
