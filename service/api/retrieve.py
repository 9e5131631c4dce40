"""/retrieve and /feedback: translate JSON to the pipeline and back."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from service.api.deps import PipelineDep, SettingsDep
from service.api.schemas import ErrorResponse, FeedbackIn, FeedbackOut, RetrieveIn, RetrieveOut
from service.errors import LimitExceeded
from service.retrieval.pipeline import RetrieveRequest

router = APIRouter(
    tags=["retrieval"],
    responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
)


@router.post("/retrieve", response_model=RetrieveOut)
async def retrieve(body: RetrieveIn, pipeline: PipelineDep) -> RetrieveOut:
    """Semantic candidates, a budget of them scored, the rest completed, top-k returned."""
    result = await pipeline.retrieve(RetrieveRequest(**body.model_dump()))
    return RetrieveOut.model_validate(asdict(result))


@router.post("/feedback", response_model=FeedbackOut)
async def feedback(body: FeedbackIn, pipeline: PipelineDep, settings: SettingsDep) -> FeedbackOut:
    """Client observations for a past query; later queries learn from them."""
    if len(body.scores) > settings.max_batch:
        raise LimitExceeded(f"{len(body.scores)} scores; the limit is {settings.max_batch}")
    recorded, already = await pipeline.feedback(
        body.namespace,
        body.query_id,
        [item.memory_id for item in body.scores],
        [item.score for item in body.scores],
    )
    return FeedbackOut(recorded=recorded, already_observed=already)
