"""The full refit of a namespace's model from all its observations, under the namespace's
refit lock (docs/design.md "Full refits"). ``service.retrieve.learning`` decides when it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.completion import fit_model
from service.completion.scale import refit_scales
from service.completion.strength import FitOptions, StrengthChoice, choose_factor_reg
from service.db import experience, model_state
from service.db.experience import NamespaceObservations
from service.db.model_state import RefittedModel
from service.db.namespaces import try_lock_namespace_refit
from service.db.scales import ScaleUpdate, scale_inputs
from service.db.search import memory_embeddings
from service.retrieve.online import RefitCells, refit_statistics
from service.settings_groups import CompletionSettings

log = logging.getLogger(__name__)


async def refit_namespace(
    sessions: async_sessionmaker[AsyncSession], settings: CompletionSettings, namespace: str
) -> bool:
    """Refit the namespace's model; False when another process holds the refit lock (it will
    do the work).

    The lock is transaction-level, so it holds behind a transaction-pooling pooler too (a
    session-level one stays behind on whichever server connection took it): the read of the
    observations, the fit and the write run in the one transaction that took it, on one
    connection. Until the write that transaction holds no snapshot between its statements
    (READ COMMITTED) and no transaction id, so the fit holds back neither vacuum nor a writer.
    """
    async with sessions() as session:
        read_from = await model_state.refit_horizon(session, namespace)
        await session.commit()  # the horizon's row lock only orders the read after edits
        if not await try_lock_namespace_refit(session, namespace):
            return False  # leaving the session rolls the lock's transaction back
        await _refit_locked(session, settings, namespace, read_from)
    return True


async def _refit_locked(
    session: AsyncSession, settings: CompletionSettings, namespace: str, read_from: datetime
) -> None:
    started = time.perf_counter()
    current, histograms = await scale_inputs(session, namespace)
    rescaled = ScaleUpdate.of(current, refit_scales(current, histograms))
    observations = await experience.namespace_observations(session, namespace, rescaled)
    # Sorting up to millions of ids: off the event loop, and once for the fetch and the fit.
    memory_ids, memory_idx = await asyncio.to_thread(
        np.unique, observations.memory_ids, return_inverse=True
    )
    embeddings = await memory_embeddings(
        session, namespace, memory_ids, settings.embedding_dim, commit=False
    )
    read = time.perf_counter()
    fitted = await asyncio.to_thread(
        _fit, settings, observations, memory_ids, memory_idx, embeddings
    )
    fit = time.perf_counter()
    read_cells = model_state.RefitRead(
        read_from, observations.query_ids, observations.memory_ids, observations.scores
    )
    await model_state.replace_model(
        session, namespace, fitted, refitted_at=datetime.now(UTC), read=read_cells,
        rescaled=rescaled,
    )
    await session.commit()  # the model, and the end of the lock
    # The write holds the namespace's lock, so the namespace's records wait for it: its
    # duration is what a refit adds to their latency.
    log.info(
        "refitted namespace %r", namespace,
        extra={"namespace": namespace, "observations": len(observations.scores),
               "factor_reg": fitted.factor_reg, "rescaled_sources": list(rescaled.moved),
               "read_s": round(read - started, 3), "fit_s": round(fit - read, 3),
               "write_s": round(time.perf_counter() - fit, 3)},
    )


def _fit(
    settings: CompletionSettings,
    observations: NamespaceObservations,
    memory_ids: np.ndarray,
    memory_idx: np.ndarray,
    embeddings: np.ndarray,
) -> RefittedModel:
    """The refit. ``memory_ids`` are the observed memories in id order, ``memory_idx`` each
    observation's row among them, ``embeddings`` theirs (zero rows for memories deleted
    since)."""
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
    # Unit rows, as the search computes e_m·w: client vectors need not be normalised.
    unit_embeddings = np.divide(
        embeddings, norms, out=np.zeros(embeddings.shape), where=norms > 0
    )
    # Query ids ascend in the order the queries were asked: the choice below holds out the
    # latest ones.
    query_ids, query_idx = np.unique(observations.query_ids, return_inverse=True)
    # The plain model learns nothing from similarity or content: it is fitted as if every
    # similarity were 0 (no slope) and without the embeddings (no content prior).
    plain = settings.model == "plain"
    similarities = np.zeros_like(observations.similarities) if plain else observations.similarities
    content_embeddings = None if plain else unit_embeddings
    options = FitOptions(
        rank=settings.rank, reg=settings.reg, memory_reg=settings.memory_reg,
        content_reg=settings.content_reg, n_iterations=settings.als_iterations,
    )
    strength = (
        choose_factor_reg(
            memory_idx, query_idx, similarities, observations.scores,
            content_embeddings, options=options,
        )
        if settings.factor_reg == "auto"
        else StrengthChoice(None if settings.factor_reg == "off" else settings.factor_reg)
    )
    model = fit_model(
        memory_idx,
        query_idx,
        similarities,
        observations.scores,
        len(memory_ids),
        len(query_ids),
        rank=settings.rank,
        reg=settings.reg,
        n_iterations=settings.als_iterations,
        memory_embeddings=content_embeddings,
        content_reg=settings.content_reg,
        memory_reg=settings.memory_reg,
        factor_reg=strength.factor_reg,
    )
    cells = RefitCells(observations, memory_idx, query_idx, len(memory_ids))
    statistics = refit_statistics(cells, unit_embeddings, model)
    return RefittedModel(
        memory_ids=memory_ids,
        memory_bias=model.memory_bias,
        memory_factors=model.memory_factors,
        observation_count=statistics.counts,
        statistics=statistics.packed(),
        query_ids=query_ids,
        query_bias=model.query_bias,
        query_slope=model.query_slope,
        query_factors=model.query_factors,
        prior=model.prior,
        factor_reg=strength.factor_reg,
    )
