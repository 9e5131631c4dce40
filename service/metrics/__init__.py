"""Prometheus metrics: the :class:`Metrics` of one app and the database gauges of ``/metrics``.

:class:`Metrics` is built by ``create_app`` (no module-level registry). With
``PROMETHEUS_MULTIPROC_DIR`` set in the environment before the process starts, values go to
prometheus-client's per-process files in that directory and ``/metrics`` merges every worker's;
otherwise they live in the app's own ``CollectorRegistry``. The HTTP request metrics are
recorded by ``service.http.middleware.RequestObservabilityMiddleware``.

What is recorded while the app serves is in :mod:`service.metrics.recorders`; what is read at
scrape time (the namespace counters, the scorer's health) in :mod:`service.metrics.gauges`; the
sharing of values between worker processes in :mod:`service.metrics.multiprocess`.
"""

from prometheus_client import CONTENT_TYPE_LATEST

from service.metrics.gauges import database_gauges, scorer_health_gauges
from service.metrics.multiprocess import multiprocess_directory, multiprocess_enabled
from service.metrics.recorders import Metrics

__all__ = [
    "CONTENT_TYPE_LATEST",
    "Metrics",
    "database_gauges",
    "multiprocess_directory",
    "multiprocess_enabled",
    "scorer_health_gauges",
]
