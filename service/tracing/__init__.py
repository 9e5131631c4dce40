"""Tracing's interface: what the request handlers, the pipeline and the scorer call to open
spans and pass the trace on, whether tracing is on or not (docs/operations.md "Tracing").

Off (the default, and whenever the ``otel`` extra is not installed), every call is a no-op on
shared objects: no OpenTelemetry import, no allocation per span. On, the same calls are
OpenTelemetry spans (``service.tracing.otel``). The app's lifespan opens the tracing
(:func:`open_tracing`) and the server span middleware makes it current for each request
(:func:`traced_by`), so the layers below ask :func:`current` instead of being handed it: the
pipeline, the learner and the scorers stay free of HTTP and of OpenTelemetry alike."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Literal, Protocol

from service.settings_groups import ObservabilitySettings

log = logging.getLogger(__name__)

#: A span attribute's value, as OpenTelemetry takes it.
Attribute = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]
Attributes = Mapping[str, Attribute]
#: A span that later work links to (:meth:`Tracing.cause`): opaque outside the tracing.
Cause = object
#: ``client``: a call to another service (the GenAI memory and rerank operations, a scorer
#: request); ``internal``: a step of earm's own work.
SpanKind = Literal["internal", "client"]


class Span(Protocol):
    """One open span."""

    @property
    def recording(self) -> bool:
        """Whether attributes set are kept: work done only to compute them is skipped when not."""

    def set(self, attributes: Attributes) -> None: ...

    def rename(self, name: str) -> None: ...

    def fail(self, error_type: str) -> None:
        """Mark the span failed (``error.type``), for a failure that raised nothing."""


class Tracing(Protocol):
    """Opens spans in the current trace."""

    #: Whether opt-in content (query text, memory texts, scores) goes into spans
    #: (``EARM_TRACE_CONTENT``).
    content: bool

    @property
    def enabled(self) -> bool: ...

    def span(
        self, name: str, attributes: Attributes | None = None, kind: SpanKind = "internal"
    ) -> AbstractContextManager[Span]:
        """A span, current while the block runs, under the current one."""

    def server_span(
        self, name: str, headers: Mapping[str, str], attributes: Attributes
    ) -> AbstractContextManager[Span]:
        """A request's server span, under the caller's span if ``headers`` carry its trace
        context (W3C ``traceparent``)."""

    def cause(self) -> Cause | None:
        """The current span, for a later trace to link to (None: nothing to link to)."""

    def linked_trace(
        self, name: str, attributes: Attributes, causes: Iterable[Cause]
    ) -> AbstractContextManager[Span]:
        """The root span of a new trace, linked to ``causes``: work that requests made due
        but that is no part of their answers (a refit)."""

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add the current trace context to an outgoing request's ``headers``."""

    def close(self) -> None:
        """Export what is left and stop (the spans after this are dropped)."""


class _NoSpan:
    recording = False

    def set(self, attributes: Attributes) -> None:
        pass

    def rename(self, name: str) -> None:
        pass

    def fail(self, error_type: str) -> None:
        pass


class NoTracing:
    """Tracing off: every span is the same inert object in the same reusable context."""

    content = False
    enabled = False

    def __init__(self) -> None:
        self._no_span: AbstractContextManager[Span] = nullcontext(_NoSpan())

    def span(
        self, name: str, attributes: Attributes | None = None, kind: SpanKind = "internal"
    ) -> AbstractContextManager[Span]:
        return self._no_span

    def server_span(
        self, name: str, headers: Mapping[str, str], attributes: Attributes
    ) -> AbstractContextManager[Span]:
        return self._no_span

    def cause(self) -> Cause | None:
        return None

    def linked_trace(
        self, name: str, attributes: Attributes, causes: Iterable[Cause]
    ) -> AbstractContextManager[Span]:
        return self._no_span

    def inject(self, headers: MutableMapping[str, str]) -> None:
        pass

    def close(self) -> None:
        pass


NO_TRACING: Tracing = NoTracing()

_current: ContextVar[Tracing] = ContextVar("earm_tracing", default=NO_TRACING)


def current() -> Tracing:
    """The tracing of the request being served (tasks it starts inherit it); off outside one."""
    return _current.get()


@contextmanager
def traced_by(tracing: Tracing) -> Iterator[None]:
    """Make ``tracing`` current for the block (a request, and the tasks it starts)."""
    token = _current.set(tracing)
    try:
        yield
    finally:
        _current.reset(token)


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for traces: an exporter named other than ``none``
    (``OTEL_TRACES_EXPORTER``), or an OTLP endpoint; never with ``OTEL_SDK_DISABLED=true``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return exporters.strip().lower() not in ("", "none")
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def open_tracing(
    settings: ObservabilitySettings, environ: Mapping[str, str] = os.environ
) -> Tracing:
    """The app's tracing, from the standard ``OTEL_*`` variables: :data:`NO_TRACING` unless
    they ask for traces and the ``otel`` extra is installed (a warning says so when it is not)."""
    if not tracing_wanted(environ):
        return NO_TRACING
    try:
        from service.tracing.otel import open_otel_tracing
    except ImportError as missing:
        log.warning(
            "OTEL_* variables ask for traces but OpenTelemetry is not installed (%s): "
            "tracing is off; install earm[otel]", missing,
        )
        return NO_TRACING
    return open_otel_tracing(settings, environ)
