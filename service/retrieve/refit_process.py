"""Where full refits run (``EARM_REFIT_PROCESS``): in a child process by default, or in this
process. A refit at a million observations is 15–20 s of work, much of it Python holding the
GIL (decoding the read, the fit's loops, encoding the write); in the serving process that
stalls every request behind it. In a child process, the serving process only waits on a
future: the child reads, fits and writes with a connection of its own, under the same
transaction-level refit lock (``service.retrieve.refit``), so every guarantee of the refit is
the same wherever it runs."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db.engine import create_engine
from service.retrieve.refit import refit_namespace
from service.retrieve.refit_health import RefitHealth
from service.settings_groups import CompletionSettings, LearningSettings

log = logging.getLogger(__name__)


class Refits(Protocol):
    """Runs a namespace's full refit; False when another process holds its refit lock. Its
    ``health`` hears how each refit ended (:meth:`service.retrieve.learning.Learner.refit_logged`
    tells it)."""

    health: RefitHealth

    async def refit(self, namespace: str) -> bool: ...

    def close(self) -> None:
        """Stop what runs the refits (after the refits in flight have ended)."""


class RefitChildDied(RuntimeError):
    """The child process died during a refit (killed, out of memory): nothing was written, the
    namespace stays due, and the next refit starts a new child."""


class InProcessRefits:
    """Refits in this process: the fit in a thread, the read and the write on its event loop."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: CompletionSettings,
        health: RefitHealth | None = None,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.health = health or RefitHealth()

    async def refit(self, namespace: str) -> bool:
        return await refit_namespace(self.sessions, self.settings, namespace)

    def close(self) -> None:
        """Nothing of its own to stop."""


class ChildRefits:
    """Refits in one child process, started at the first refit and kept for the next ones; one
    refit at a time, so a burst of due namespaces queues instead of taking every core from the
    requests.

    The child is forked by multiprocessing's fork server, never by this process (a fork of a
    process with threads and an event loop is unsafe). The server is started once per process,
    with this module and what it imports (numpy, SQLAlchemy, psycopg, the completion model)
    already loaded, so a new child (the first refit, or a child after one died) costs a fork,
    not a new interpreter's seconds of imports. When this process dies, the kernel kills the
    server (``service.retrieve.refit_server``) and the server's children with it
    (:func:`die_with_parent`). Servers and children are started on :data:`_STARTER`'s thread,
    so the event loop never waits for them."""

    def __init__(
        self, database_url: str, settings: LearningSettings, health: RefitHealth | None = None
    ) -> None:
        self.database_url = database_url
        self.settings = settings
        self.health = health or RefitHealth()
        self._pool: ProcessPoolExecutor | None = None

    async def refit(self, namespace: str) -> bool:
        pool, future = await self._submit(namespace)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool as error:
            self._discard(pool)
            raise RefitChildDied(
                f"the refit process died while refitting namespace {namespace!r}"
            ) from error

    async def _submit(
        self, namespace: str
    ) -> tuple[ProcessPoolExecutor, Future[bool]]:
        """The refit handed to a live child. A pool whose child died between refits (killed,
        out of memory) refuses new work for good: it is replaced here, so no refit is lost to
        a death that happened while nothing ran."""
        for _ in range(2):
            pool = self._pool
            if pool is None:
                pool = await asyncio.wrap_future(_STARTER.submit(self._start))
            try:
                return pool, pool.submit(
                    refit_in_child, self.database_url, self.settings, namespace
                )
            except BrokenProcessPool:
                log.warning("the idle refit process had died; starting a new one")
                self._discard(pool)
        raise RefitChildDied(f"no refit process could be started for namespace {namespace!r}")

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        if self._pool is pool:
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def _start(self) -> ProcessPoolExecutor:
        """The pool, with its child running (on :data:`_STARTER`'s one thread: two refits
        that both found no pool get the same one)."""
        if self._pool is not None:
            return self._pool
        pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=_fork_server(),
            initializer=_configure_child,
            initargs=(self.settings.log_level,),
        )
        try:
            pool.submit(int).result()  # the server's imports and the child's start, waited here
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # a child that died starting
            raise
        self._pool = pool
        return pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def refits_for(
    settings: LearningSettings,
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    health: RefitHealth | None = None,
) -> Refits:
    if settings.process == "child":
        return ChildRefits(database_url, settings, health)
    return InProcessRefits(sessions, settings.completion, health)


# The thread that starts the fork server and its children. The server's death signal follows
# the thread that started it, not the process: this one lasts as long as the process, where
# an event loop's thread (a test client's, an embedding application's) may end long before.
_STARTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="earm-refit-starter")


def _fork_server() -> multiprocessing.context.BaseContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["service.retrieve.refit_server"])
    return context


def _configure_child(log_level: str) -> None:
    from service.cpu import one_blas_thread
    from service.logs import configure_logging

    configure_logging(log_level)  # the same JSON lines on the same stderr as the parent
    one_blas_thread()
    # A terminal's Ctrl-C signals its whole process group, this child too: the service decides
    # when to stop (and the child dies with it), not a KeyboardInterrupt in the child's wait.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


def die_with_parent() -> None:
    """On Linux, the kernel kills this process when the one that started it dies: a refit of
    a killed service is abandoned (its transaction rolls back), as it would be in the service
    itself, instead of running on in an orphan. Elsewhere a child ends after its refit."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the call: nothing would kill the child
        os._exit(1)


def refit_in_child(database_url: str, settings: LearningSettings, namespace: str) -> bool:
    """The child's side: one refit on a connection of its own (an engine per refit: its
    cost is milliseconds beside the refit's seconds, and no connection idles between)."""

    async def refit() -> bool:
        engine = create_engine(database_url, 1, settings.db_prepared_statements)
        try:
            return await refit_namespace(
                async_sessionmaker(engine, expire_on_commit=False), settings.completion, namespace
            )
        finally:
            await engine.dispose()

    return asyncio.run(refit())
