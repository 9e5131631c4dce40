"""The full refit of a namespace's model from all its observations, under the namespace's
refit lock (docs/design.md "Full refits"). ``service.retrieve.learning`` decides when it runs."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.completion import fit_model
from service.db import experience, model_state
from service.db.experience import NamespaceObservations
from service.db.model_state import RefittedModel
from service.db.namespaces import try_lock_namespace_refit, unlock_namespace_refit
from service.db.search import memory_embeddings
from service.retrieve.online import RefitCells, refit_statistics
from service.settings import Settings

log = logging.getLogger(__name__)


async def refit_namespace(
    sessions: async_sessionmaker[AsyncSession], settings: Settings, namespace: str
) -> bool:
    """Refit the namespace's model; False when another process holds the refit lock (it will
    do the work).

    The lock is a session-level advisory lock, so every statement of the refit must run on
    the connection that took it: a session commits by handing its connection back to the
    pool, and the unlock would then run on another connection, leaking the lock (and
    silently disabling later refits of the namespace). Hence one pinned connection.
    """
    engine = sessions.kw["bind"]
    async with engine.connect() as connection, sessions(bind=connection) as session:
        if not await try_lock_namespace_refit(session, namespace):
            return False
        try:
            await _refit_locked(session, settings, namespace)
        finally:
            await session.rollback()  # a failed write must not hide its error in the unlock
            await unlock_namespace_refit(session, namespace)
            await session.commit()
    return True


async def _refit_locked(session: AsyncSession, settings: Settings, namespace: str) -> None:
    read_from = await model_state.refit_horizon(session, namespace)
    await session.commit()  # the lock only orders the read after edits under way
    observations = await experience.namespace_observations(session, namespace)
    # Sorting up to millions of ids: off the event loop, and once for the fetch and the fit.
    memory_ids, memory_idx = await asyncio.to_thread(
        np.unique, observations.memory_ids, return_inverse=True
    )
    # The fetch commits: no transaction stays open during the fit.
    embeddings = await memory_embeddings(session, memory_ids, settings.embedding_dim)
    fitted = await asyncio.to_thread(
        _fit, settings, observations, memory_ids, memory_idx, embeddings
    )
    await model_state.replace_model(
        session, namespace, fitted, refitted_at=datetime.now(UTC), read_from=read_from
    )
    await session.commit()
    log.info(
        "refitted namespace %r", namespace,
        extra={"namespace": namespace, "observations": len(observations.scores)},
    )


def _fit(
    settings: Settings,
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
    query_ids, query_idx = np.unique(observations.query_ids, return_inverse=True)
    model = fit_model(
        memory_idx,
        query_idx,
        observations.similarities,
        observations.scores,
        len(memory_ids),
        len(query_ids),
        rank=settings.rank,
        reg=settings.reg,
        n_iterations=settings.als_iterations,
        memory_embeddings=unit_embeddings,
        content_reg=settings.content_reg,
        memory_reg=settings.memory_reg,
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
    )
