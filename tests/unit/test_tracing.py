"""When the standard OTEL_* variables turn tracing on, and what an app then traces with."""

from __future__ import annotations

import pytest

from service.settings import Settings
from service.tracing import NO_TRACING, current, open_tracing, traced_by, tracing_wanted


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
    tracing = open_tracing(Settings(_env_file=None), {})
    assert tracing is NO_TRACING and not tracing.enabled
    with tracing.span("search", {"earm.round": 1}) as span:
        assert not span.recording
        span.set({"earm.anchors": 3})
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}


def test_an_exporter_named_in_the_variables_gets_the_spans_and_the_trace_context() -> None:
    tracing = open_tracing(
        Settings(_env_file=None, trace_content=True), {"OTEL_TRACES_EXPORTER": "console"}
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
            Settings(_env_file=None),
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", variable: "grpc"},
        )


def test_an_unknown_exporter_is_refused_at_startup() -> None:
    with pytest.raises(ValueError, match="otlp or console"):
        open_tracing(Settings(_env_file=None), {"OTEL_TRACES_EXPORTER": "zipkin"})
