"""``earm demo``: see earm learn in about a minute, offline. The real service (as ``earm serve``
runs it) and a simulated scorer on loopback; the bundled workload replayed through the HTTP API;
then the service stays up for its dashboard."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from service.demo.replay import NAMESPACE, Phase, Request, ingest, replay, stream
from service.demo.report import phase_line, summary
from service.demo.workload import Workload, load
from service.settings import Settings

#: How long the replay waits for the service to be ready (a first run initialises the
#: embedded Postgres and applies the migrations).
READY_TIMEOUT_S = 120.0

DESCRIPTION = """\
See earm learn in about a minute, offline. Starts the service as `earm serve` does (the
embedded Postgres unless EARM_DATABASE_URL is set) with a SIMULATED scorer: a loopback /rerank
server that answers from the bundled workload's labels plus noise, not a model. Ingests a
made-up persona's memories into the namespace demo-simulated-scorer (erasing an earlier
demo's), asks its questions one after the other and then each again, prints per stage
the scorer calls against a full rerank, the share of returned memories the completion model
estimated and its prequential error, then keeps serving the dashboard until Ctrl-C. About a
minute on 2 cores.
"""


def add_demo_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="replay a bundled workload with a simulated scorer and show the dashboard (~1 min)",
        description=DESCRIPTION,
    )
    demo.add_argument("--host", default=None, help="bind address (default EARM_HOST, 127.0.0.1)")
    demo.add_argument("--port", type=int, default=None, help="port (default EARM_PORT, 8000)")
    demo.add_argument(
        "--questions", type=_positive, default=None,
        help="ask only the first this many of the workload's 80 questions (default all)",
    )
    demo.add_argument(
        "--exit", action="store_true", help="stop the service after the summary (no dashboard)"
    )
    demo.set_defaults(func=_demo)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from service.demo.scorer import SIMULATED_MODEL, scored_by_stand_in, simulated_scorer_app
    from service.http import server
    from service.http.app import create_app
    from service.logs import configure_logging
    from service.testing import LoopbackServer

    workload = load()
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    # A line per request (the service's, and the replay's own client's) would bury the demo's
    # output.
    configure_logging(settings.log_level, access_log=False)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with LoopbackServer(simulated_scorer_app(workload)) as scorer:
        settings = scored_by_stand_in(settings, scorer.url).model_copy(
            update={"host": host, "port": port, "access_log": False}
        )
        url = f"http://{_client_host(host)}:{port}"
        _say(
            f"scorer: SIMULATED, no model is called: {SIMULATED_MODEL} at {scorer.url}/rerank "
            "answers from the workload's labels plus noise"
        )
        _say(f"starting earm on {url} (its database: {_database(settings)})")
        api_key = settings.api_key.get_secret_value() if settings.api_key else None
        run = _Replay(workload, url, api_key, args)
        threading.Thread(target=run, name="demo-replay", daemon=True).start()
        server.run(create_app(settings), settings.serving, settings.observability)
    return run.status


def _database(settings: Settings) -> str:
    if settings.database_url:
        return "EARM_DATABASE_URL"
    return f"the embedded Postgres in {settings.data_dir}"


def _client_host(host: str) -> str:
    """Where this process reaches its own service bound to ``host`` (in a URL)."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


class _Replay:
    """The replay, on a thread of its own while the main thread serves."""

    def __init__(
        self, workload: Workload, url: str, api_key: str | None, args: argparse.Namespace
    ) -> None:
        self.workload = workload
        self.url = url
        self.api_key = api_key
        questions = workload.questions[: args.questions]
        self.questions = len(questions)
        self.asks = stream(questions)
        self.exit = args.exit
        self.status = 1  # until the replay has finished

    def __call__(self) -> None:
        import httpx

        try:
            self._run()
            self.status = 0
        except httpx.TransportError:
            # The service went away (Ctrl-C during the replay, or it failed): it is stopping
            # already, and what stopped it has been said.
            print("earm demo: the service stopped before the replay finished", file=sys.stderr)
            return
        except Exception as error:  # reported here: the serving thread cannot see it
            print(f"earm demo: the replay failed: {error!r}", file=sys.stderr, flush=True)
        if self.exit or self.status:
            # Stops the service as Ctrl-C would: its shutdown runs on the main thread.
            os.kill(os.getpid(), signal.SIGINT)

    def _run(self) -> None:
        from service.client import EarmClient
        from service.testing import wait_ready

        if not wait_ready(self.url, READY_TIMEOUT_S):
            raise TimeoutError(f"the service at {self.url} was not ready in {READY_TIMEOUT_S} s")
        request = Request()
        with EarmClient(self.url, api_key=self.api_key) as client:
            stored = ingest(client, self.workload)
            _say(
                f"ingested {stored} memories of {self.workload.persona} (made up) into "
                f"{NAMESPACE}; asking {self.questions} questions, then each again: top "
                f"{request.k} of {request.candidates} candidates each"
            )

            def report(phase: Phase) -> None:
                _say(phase_line(phase, request))

            phases = replay(client, self.asks, request, report)
        _say("\n".join(["", *summary(phases, request), ""]))
        dashboard = f"{self.url}/dashboard/namespaces/{NAMESPACE}"
        _say(f"dashboard: {dashboard}" + ("" if self.exit else "  (Ctrl-C stops the service)"))


def _say(text: str) -> None:
    print(text, flush=True)
