"""When the standard OTEL_* variables turn tracing on, and what an app then traces with."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from service.errors import LimitExceeded
from service.settings import Settings
from service.tracing import NO_TRACING, current, open_tracing, traced_by, tracing_wanted
from service.tracing.otel import OtelTracing


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "earm-eu"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_traces_are_on_only_when_the_standard_variables_ask(
    environ: dict[str, str], wanted: bool
) -> None:
    assert tracing_wanted(environ) is wanted


def test_without_the_variables_tracing_is_the_shared_no_op() -> None:
    tracing = open_tracing(Settings(_env_file=None).observability, {})
    assert tracing is NO_TRACING and not tracing.enabled
    with tracing.span("search", {"earm.round": 1}) as span:
        assert not span.recording
        span.set({"earm.anchors": 3})
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}


def test_an_exporter_named_in_the_variables_gets_the_spans_and_the_trace_context() -> None:
    tracing = open_tracing(
        Settings(_env_file=None, trace_content=True).observability,
        {"OTEL_TRACES_EXPORTER": "console"},
    )
    try:
        assert tracing.enabled and tracing.content
        assert current() is NO_TRACING  # until a request makes it current
        with traced_by(tracing):
            assert current() is tracing
            with current().span("score", kind="client") as span:
                assert span.recording
                headers: dict[str, str] = {}
                current().inject(headers)
        assert headers["traceparent"].startswith("00-")
        assert current() is NO_TRACING
    finally:
        tracing.close()


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_PROTOCOL",
                                      "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"])
def test_otlp_over_grpc_is_refused_at_startup(variable: str) -> None:
    with pytest.raises(ValueError, match="http/protobuf only"):
        open_tracing(
            Settings(_env_file=None).observability,
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", variable: "grpc"},
        )


def test_an_unknown_exporter_is_refused_at_startup() -> None:
    with pytest.raises(ValueError, match="otlp or console"):
        open_tracing(Settings(_env_file=None).observability, {"OTEL_TRACES_EXPORTER": "zipkin"})


def test_without_the_otel_extra_the_variables_only_get_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "service.tracing.otel", None)  # import fails
    logs = Settings(_env_file=None).observability
    tracing = open_tracing(logs, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert tracing is NO_TRACING
    assert "install earm[otel]" in caplog.text


def recorded() -> tuple[OtelTracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OtelTracing(provider, content=False), exporter


def test_a_failed_operation_says_what_failed() -> None:
    tracing, exporter = recorded()
    with pytest.raises(LimitExceeded), tracing.span("search_memory", kind="client"):
        raise LimitExceeded("k=1000 is outside 1..100")
    [span] = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["error.type"] == "LimitExceeded"
    assert span.status.status_code is StatusCode.ERROR


def test_a_refit_is_a_trace_of_its_own_linked_to_the_requests_that_made_it_due() -> None:
    tracing, exporter = recorded()
    assert tracing.cause() is None
    with tracing.linked_trace("refit", {"gen_ai.memory.store.id": "agent-1"}, []):
        pass
    with tracing.span("record"):
        cause = tracing.cause()
        with tracing.linked_trace("refit", {}, [cause]):
            pass
    lone, linked, record = exporter.get_finished_spans()
    assert lone.links == () and lone.parent is None
    assert linked.parent is None and linked.context.trace_id != record.context.trace_id
    assert [link.context.span_id for link in linked.links] == [record.context.span_id]


OFF_PROBE = """
import sys
import service.http.app
from service.settings import Settings
from service.tracing import open_tracing
open_tracing(Settings(_env_file=None).observability, {})
prefixes = ("opentelemetry.sdk", "service.tracing.")
print(sorted(name for name in sys.modules if name.startswith(prefixes)))
"""


def test_tracing_off_loads_no_opentelemetry_sdk() -> None:
    result = subprocess.run(
        [sys.executable, "-c", OFF_PROBE], capture_output=True, text=True, timeout=120,
        env={name: value for name, value in os.environ.items() if not name.startswith("OTEL_")},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
