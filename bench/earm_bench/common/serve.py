"""``python -m earm_bench.common.serve --port N``: the service as ``earm serve`` runs it in one
process (its ``EARM_*`` settings from the environment), with the bench's own switch
``EARM_BENCH_REFIT_IN_REQUEST=true``: a full refit a retrieve makes due runs inside that
request (``create_app(settings, refit_in_request=True)``), so the request times it and a
sequential replay is exactly reproducible. The service itself never reads the variable: a
served earm refits after the response. :func:`earm_bench.common.processes.service_process`
starts this module instead of ``earm serve`` when its environment sets the variable."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

#: The bench's variable: "true" runs due refits inside the request.
REFIT_IN_REQUEST = "EARM_BENCH_REFIT_IN_REQUEST"


def refit_in_request(environ: Mapping[str, str]) -> bool:
    """What ``environ`` asks for; a value other than true or false is refused."""
    value = environ.get(REFIT_IN_REQUEST, "false").strip().lower()
    if value not in ("true", "false"):
        raise SystemExit(f"{REFIT_IN_REQUEST} must be true or false, not {value!r}")
    return value == "true"


def main(argv: Sequence[str] | None = None) -> int:
    from service.http import server
    from service.http.app import create_app
    from service.logs import configure_logging
    from service.settings import Settings

    parser = argparse.ArgumentParser(prog="python -m earm_bench.common.serve")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    inline = refit_in_request(os.environ)
    settings = Settings()
    configure_logging(settings.log_level, settings.access_log)
    settings = settings.model_copy(update={"port": args.port})
    server.run(create_app(settings, refit_in_request=inline), settings.serving,
               settings.observability)
    return 0


# Guarded: the refit child process imports this module as __mp_main__ (Python's
# multiprocessing), which must not serve again.
if __name__ == "__main__":
    raise SystemExit(main())
