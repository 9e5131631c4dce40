"""Tracing on: :class:`OtelTracing` opens OpenTelemetry spans, with a tracer provider of its
own per app (not the process's global one, so an embedding application's provider and a second
app in the same process are left alone). Imported only when the ``OTEL_*`` variables ask for
traces, and only installed with the ``otel`` extra.

What the SDK reads from the standard variables, it reads itself: the endpoint, headers,
timeout and compression of the OTLP exporter, the sampler (``OTEL_TRACES_SAMPLER``), the batch
processor's limits (``OTEL_BSP_*``), the resource (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``) and the propagators (``OTEL_PROPAGATORS``, W3C trace context and
baggage by default). Chosen here: the exporters (``OTEL_TRACES_EXPORTER``: ``otlp``, the
default, over HTTP/protobuf only, and ``console``) and the service name ``earm`` when none is
given."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Status, StatusCode

from service.settings_groups import ObservabilitySettings
from service.tracing import Attributes, Cause, Span, SpanKind, Tracing

_KINDS = {"internal": trace.SpanKind.INTERNAL, "client": trace.SpanKind.CLIENT}
_VERSION = importlib.metadata.version("earm")


class _OtelSpan:
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    @property
    def recording(self) -> bool:
        return self._span.is_recording()

    def set(self, attributes: Attributes) -> None:
        self._span.set_attributes(attributes)

    def rename(self, name: str) -> None:
        self._span.update_name(name)

    def fail(self, error_type: str) -> None:
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR))


class OtelTracing:
    """:class:`service.tracing.Tracing` as OpenTelemetry spans of ``provider``."""

    enabled = True

    def __init__(self, provider: TracerProvider, content: bool) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("earm", _VERSION)
        self.content = content

    @contextmanager
    def span(
        self, name: str, attributes: Attributes | None = None, kind: SpanKind = "internal"
    ) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name, kind=_KINDS[kind], attributes=attributes
        ) as span:
            try:
                yield _OtelSpan(span)
            except Exception as error:
                # The conventions' failure attribute (the SDK records the exception and the
                # status itself): an operation refused with a 4xx is told from a 5xx by it.
                span.set_attribute("error.type", type(error).__qualname__)
                raise

    @contextmanager
    def server_span(
        self, name: str, headers: Mapping[str, str], attributes: Attributes
    ) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name, context=propagate.extract(headers), kind=trace.SpanKind.SERVER,
            attributes=attributes,
        ) as span:
            yield _OtelSpan(span)

    def cause(self) -> Cause | None:
        context = trace.get_current_span().get_span_context()
        return context if context.is_valid else None

    @contextmanager
    def linked_trace(
        self, name: str, attributes: Attributes, causes: Iterable[Cause]
    ) -> Iterator[Span]:
        links = [trace.Link(cause) for cause in causes if isinstance(cause, trace.SpanContext)]
        # An empty context: no parent, so the span starts a trace of its own.
        with self._tracer.start_as_current_span(
            name, context=Context(), attributes=attributes, links=links
        ) as span:
            yield _OtelSpan(span)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        propagate.inject(headers)

    def close(self) -> None:
        self._provider.shutdown()


def _exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    names = [
        name.strip().lower()
        for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
        if name.strip() and name.strip().lower() != "none"
    ]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            _check_protocol(environ)
            exporters.append(OTLPSpanExporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: earm exports to otlp or console")
    return exporters


def _check_protocol(environ: Mapping[str, str]) -> None:
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    ).strip()
    if protocol not in ("", "http/protobuf"):
        # gRPC would be a second exporter package and its dependencies for the same data.
        raise ValueError(
            f"OTLP protocol {protocol!r}: earm exports traces over http/protobuf only "
            "(port 4318 of a collector, Jaeger or Tempo)"
        )


def _resource() -> Resource:
    """The resource the standard variables give, named ``earm`` if they name no service."""
    detected = Resource.create({SERVICE_VERSION: _VERSION})
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        return detected.merge(Resource({SERVICE_NAME: "earm"}))
    return detected


def open_otel_tracing(settings: ObservabilitySettings, environ: Mapping[str, str]) -> Tracing:
    provider = TracerProvider(resource=_resource())
    for exporter in _exporters(environ):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return OtelTracing(provider, settings.trace_content)
