"""The service and the judges the benchmarks drive: in this process on a loopback port, or in
child processes (when their CPU or memory must be measured apart from the bench's own)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from earm_bench.common.rerank_server import RerankServer, ScoreFn
from earm_bench.common.serve import refit_in_request
from service.testing import free_port, interrupt, wait_ready

#: Starting a service may include initdb and the migrations of a new embedded Postgres.
STARTUP_TIMEOUT_S = 120.0


# ------------------------------------------------------------------------------ in-process


@dataclass
class InProcessService:
    url: str
    database_url: str
    settings: Any  # service.settings.Settings


@contextmanager
def in_process_service(
    settings: Any | None = None, *, refit_in_request: bool = False, **options: Any
) -> Iterator[InProcessService]:
    """The service on a loopback port of this process. Without ``settings``, they are
    ``Settings(**options)`` (and the environment) over an embedded Postgres in a temporary
    directory unless ``options`` name a ``database_url``. ``refit_in_request``: a refit a
    retrieve makes due runs inside that request (``create_app``'s option)."""
    from service.http.app import create_app
    from service.settings import Settings
    from service.testing import LoopbackServer

    with tempfile.TemporaryDirectory(prefix="earm-bench-") as tmp:
        if settings is None:
            settings = Settings(**({"data_dir": Path(tmp) / "pgdata"} | options))
        app = create_app(settings, refit_in_request=refit_in_request)
        server = LoopbackServer(app).start(STARTUP_TIMEOUT_S)
        try:
            yield InProcessService(server.url, app.state.components.database.url, settings)
        finally:
            server.stop()


# ------------------------------------------------------------------------- child processes


def _serve(server: Callable[[], AbstractContextManager[Any]], connection: Any) -> None:
    """The child: serve until the parent says stop (or goes away)."""
    with server() as serving:
        connection.send(serving.url)
        connection.recv()


@contextmanager
def child_server(server: Callable[[], AbstractContextManager[Any]]) -> Iterator[str]:
    """URL of the server ``server()`` makes (a context manager with a ``url``), served by a
    forked child process."""
    import gc
    import multiprocessing

    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_serve, args=(server, child), daemon=True)
    # Garbage the child would inherit is finalized here, where its native threads exist: an
    # app left behind in reference cycles (say by an earlier test) holds an ONNX Runtime
    # session, and the child's garbage collector hung for good finalizing it.
    gc.collect()
    process.start()
    try:
        if not parent.poll(60):
            raise RuntimeError("the judge process did not start")
        yield parent.recv()
    finally:
        with suppress(OSError):
            parent.send("stop")
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(5)


def _chat_judge(reply: Callable[..., Awaitable[Any]], backlog: int) -> AbstractContextManager[Any]:
    from earm_bench.common.chat_server import ChatServer

    # The lean server: the judge should cost the machine as little as a remote provider would.
    return ChatServer(reply, backlog=backlog)


@contextmanager
def judge_process(reply: Callable[..., Awaitable[Any]], backlog: int = 100) -> Iterator[str]:
    """URL of a chat-completions judge (:class:`~earm_bench.common.chat_server.ChatServer`)
    answering with ``reply``, served by a forked child process, so serving it does not compete
    with the bench's clients for the GIL. Fork it before this process has threads or connections;
    ``reply``'s state is the child's copy (share what must change during the run, e.g. through
    ``multiprocessing.Value``). ``backlog``: its listen backlog (the asyncio default; 5 is a
    small server's, as Python's http.server)."""
    with child_server(functools.partial(_chat_judge, reply, backlog)) as url:
        yield url


@contextmanager
def rerank_judge_process(scores: ScoreFn, latency_s: Callable[[], float]) -> Iterator[str]:
    """URL of a ``/rerank`` backend answering with ``scores`` ``latency_s()`` after each
    request arrives (:class:`~earm_bench.common.rerank_server.RerankServer`), served by a
    forked child process as :func:`judge_process` is."""
    with child_server(functools.partial(RerankServer, scores, latency_s)) as url:
        yield url


@dataclass
class ChildProcess:
    """An ``earm`` command in a child process of the bench, logging to a file of its own."""

    process: subprocess.Popen[bytes]
    log_path: Path
    settings: dict[str, str]  # its EARM_* environment, without the database URL

    def rss_mb(self) -> dict[str, float | None]:
        """Resident memory of the process now, and its peak (Linux VmHWM: since it started,
        or since :meth:`reset_peak_rss`)."""
        import psutil

        now = psutil.Process(self.process.pid).memory_info().rss / 2**20
        peak = None
        status = Path(f"/proc/{self.process.pid}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        return {"rss_mb": round(now, 1), "peak_rss_mb": None if peak is None else round(peak, 1)}

    def reset_peak_rss(self) -> None:
        """Start the peak of :meth:`rss_mb` over from the resident memory now (Linux: writing
        5 to ``clear_refs``), so the next peak is that of the work in between; elsewhere the
        peak stays the one since the start."""
        with suppress(OSError):
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def log_count(self, message: str) -> int:
        """Lines of the process's log that contain ``message`` (what it did, as it logs it at
        ``EARM_LOG_LEVEL=INFO``)."""
        with open(self.log_path, errors="replace") as log:
            return sum(message in line for line in log)


@dataclass
class ServiceProcess(ChildProcess):
    """``earm serve`` in a child process, and where it answers."""

    url: str


@contextmanager
def child_process(
    arguments: Sequence[str], settings: Mapping[str, str], workdir: Path, name: str,
    module: str = "service",
) -> Iterator[ChildProcess]:
    """``earm <arguments>`` (``python -m <module> <arguments>``) in a child process whose
    EARM_* environment is exactly ``settings``; it runs in ``workdir`` (so no stray .env is
    read), logs to ``workdir/<name>.log`` and is interrupted on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | dict(settings)
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *arguments],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        shown = {k: v for k, v in settings.items() if k != "EARM_DATABASE_URL"}
        yield ChildProcess(process, log_path, shown)
    finally:
        interrupt(process)


@contextmanager
def service_process(
    settings: Mapping[str, str], workdir: Path, name: str = "service", *, ready: bool = True
) -> Iterator[ServiceProcess]:
    """``earm serve`` as :func:`child_process` starts it, once it is ready (``ready=False``: at
    once, so that it starts while the caller works; :func:`until_ready` before its first
    request). With the bench's ``EARM_BENCH_REFIT_IN_REQUEST=true`` in ``settings``, the
    bench's own entry point (:mod:`earm_bench.common.serve`) instead: the same service, its due
    refits inside the request."""
    port = free_port()
    module, arguments = entry_point(settings, port)
    with child_process(arguments, settings, workdir, name, module) as child:
        service = ServiceProcess(child.process, child.log_path, child.settings,
                                 f"http://127.0.0.1:{port}")
        if ready:
            until_ready(service)
        yield service


def entry_point(settings: Mapping[str, str], port: int) -> tuple[str, tuple[str, ...]]:
    """The module a service process runs (``python -m``) and its arguments: ``earm serve``,
    or the bench's own entry point where ``settings`` ask for refits inside the request."""
    if refit_in_request(settings):
        return "earm_bench.common.serve", ("--port", str(port))
    return "service", ("serve", "--port", str(port))


def until_ready(service: ServiceProcess) -> None:
    """Wait until ``service`` answers; RuntimeError, with its log's end, if it cannot."""
    if not wait_ready(service.url, STARTUP_TIMEOUT_S, service.process):
        state = "exited" if service.process.poll() is not None else "did not become ready"
        raise RuntimeError(f"the service {state}: {service.log_path.read_text()[-2000:]}")
