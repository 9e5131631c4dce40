"""Tracing end to end: earm configured by the standard OTEL_* variables exports its spans over
OTLP/HTTP to a real receiver on loopback, which decodes the protobuf bodies; the chat judge
stand-in records the trace context each scorer request carried."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app, rerank_app

CALLER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"
MEMORIES = [f"memory number {i} about topic {i % 3}" for i in range(8)]


class OtlpReceiver:
    """``POST /v1/traces`` of OTLP/HTTP with protobuf bodies, as a collector takes them: the
    spans received and the resources they came with."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.resources: list[dict[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    receiver.resources.append(attributes(resource_spans.resource.attributes))
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans.extend(scope_spans.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                status = 200 if self.path == "/v1/traces" else 404
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # The exporter's keep-alive connection may outlive the test: not waited for.
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def named(self, name: str) -> list[Span]:
        return [span for span in self.spans if span.name == name]

    def one(self, name: str) -> Span:
        spans = self.named(name)
        assert len(spans) == 1, (name, sorted(span.name for span in self.spans))
        return spans[0]

    def children(self, parent: Span) -> list[Span]:
        return [
            span for span in self.spans
            if span.trace_id == parent.trace_id and span.parent_span_id == parent.span_id
        ]


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind)


def attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in key_values}


class Judge:
    """The chat judge stand-in; ``traceparents``: the header of every request it answered."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.app = chat_completions_app(lambda prompt: "0.9")

        @self.app.middleware("http")
        async def record(request: Any, call_next: Callable[[Any], Any]) -> Any:
            self.traceparents.append(request.headers.get("traceparent"))
            return await call_next(request)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_TRACES_SAMPLER",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
                 "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SERVICE_NAME",
                 "OTEL_RESOURCE_ATTRIBUTES", "OTEL_PROPAGATORS"):
        monkeypatch.delenv(name, raising=False)
    with OtlpReceiver() as otlp:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        yield otlp


@pytest.fixture
def judge() -> Iterator[tuple[Judge, str]]:
    stand_in = Judge()
    with LoopbackServer(stand_in.app) as server:
        yield stand_in, server.url


def traced_settings(judge_settings: Callable[..., Settings], url: str, **more: Any) -> Settings:
    # Refits in this process, so a due refit runs (and is traced) before the app stops.
    return judge_settings(url, refit_process="thread", **more)


def ingest(client: TestClient) -> list[int]:
    response = client.post(
        "/memories",
        json={"namespace": "agent-1", "memories": [{"text": text} for text in MEMORIES]},
    )
    assert response.status_code == 201, response.text
    ids: list[int] = response.json()["ids"]
    return ids


def retrieve(client: TestClient) -> dict[str, Any]:
    response = client.post(
        "/retrieve",
        json={"namespace": "agent-1", "query": "topic 1", "k": 3, "candidates": len(MEMORIES)},
        headers={"traceparent": TRACEPARENT},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def rerank(client: TestClient) -> None:
    response = client.post(
        "/v2/rerank",
        json={"model": "earm/agent-1", "query": "which topic?",
              "documents": ["topic 0 notes", "topic 1 notes", "topic 2 notes"], "top_n": 2},
    )
    assert response.status_code == 200, response.text


def test_every_operation_is_traced_under_its_server_span_and_the_trace_reaches_the_scorer(
    judge_settings: Callable[..., Settings],
    receiver: OtlpReceiver,
    judge: tuple[Judge, str],
) -> None:
    stand_in, judge_url = judge
    with TestClient(create_app(traced_settings(judge_settings, judge_url))) as client:
        ids = ingest(client)
        answer = retrieve(client)
        retrieve_requests = list(stand_in.traceparents)
        assert client.patch(f"/memories/{ids[0]}", json={"text": "changed"}).status_code == 200
        assert client.delete(f"/memories/{ids[1]}").status_code == 204
        rerank(client)
        assert client.delete("/namespaces/agent-1").status_code == 200
    # The app's shutdown exported every span left.

    assert {"service.name": "earm"}.items() <= receiver.resources[0].items()
    by_id = {span.span_id: span for span in receiver.spans}

    # The retrieve: its server span continues the caller's trace.
    server = receiver.one("POST /retrieve")
    assert server.kind == Span.SPAN_KIND_SERVER
    assert (server.trace_id.hex(), server.parent_span_id.hex()) == (CALLER_TRACE_ID,
                                                                    CALLER_SPAN_ID)
    assert attributes(server.attributes)["http.response.status_code"] == 200
    search = receiver.one("search_memory")
    assert (search.kind, search.parent_span_id) == (Span.SPAN_KIND_CLIENT, server.span_id)
    searched = attributes(search.attributes)
    assert searched | {
        "gen_ai.operation.name": "search_memory",
        "gen_ai.provider.name": "earm",
        "gen_ai.memory.store.id": "agent-1",
        "gen_ai.memory.record.count": 3,
        "earm.stage": answer["stage"],
        "earm.budget": answer["budget"],
        "earm.anchors": answer["scorer_calls"],
        "earm.rounds": answer["scorer_rounds"],
        "earm.reused": 0,
        "earm.degraded": False,
    } == searched
    assert "earm.estimated" in searched
    assert answer["scorer_calls"] > 0
    # Content only when asked for (EARM_TRACE_CONTENT).
    assert "gen_ai.memory.query.text" not in searched
    assert "gen_ai.memory.records" not in searched

    steps = receiver.children(search)
    assert {"search", "plan", "score", "rank", "record"} <= {span.name for span in steps}
    chats = [span for span in receiver.spans if span.name == "chat gpt-4o-mini"
             and span.trace_id == server.trace_id]
    assert len(chats) == answer["scorer_requests"]
    for chat in chats:
        assert chat.kind == Span.SPAN_KIND_CLIENT
        assert by_id[chat.parent_span_id].name == "score"
        assert by_id[by_id[chat.parent_span_id].parent_span_id] == search
        called = attributes(chat.attributes)
        assert called["gen_ai.request.model"] == "gpt-4o-mini"
        assert called["http.response.status_code"] == 200
        assert called["gen_ai.usage.input_tokens"] > 0
        assert called["gen_ai.usage.output_tokens"] == 1
    # Each scorer request carried the trace, its own span as the parent.
    assert sorted(retrieve_requests) == sorted(
        f"00-{CALLER_TRACE_ID}-{chat.span_id.hex()}-01" for chat in chats
    )

    # The refit the retrieve made due (the rerank's query makes one due too): a trace of its
    # own, linked to the retrieve's.
    refits = receiver.named("refit")
    assert all(len(refit.links) == 1 and not refit.parent_span_id for refit in refits)
    [refit] = [refit for refit in refits if refit.links[0].trace_id == server.trace_id]
    assert refit.trace_id != server.trace_id
    assert by_id[refit.links[0].span_id] in steps
    assert by_id[refit.links[0].span_id].name == "record"
    refitted = attributes(refit.attributes)
    assert refitted["gen_ai.memory.store.id"] == "agent-1"
    # (Erased if the erase at the end overtook it on a slow box.)
    assert refitted["earm.refit.outcome"] in ("refitted", "erased")

    # The other memory operations, each under its request's server span.
    for server_name, operation, record_id in [
        ("POST /memories", "create_memory", None),
        ("PATCH /memories/{memory_id}", "update_memory", str(ids[0])),
        ("DELETE /memories/{memory_id}", "delete_memory", str(ids[1])),
        ("DELETE /namespaces/{namespace}", "delete_memory_store", None),
    ]:
        span = receiver.one(operation)
        assert by_id[span.parent_span_id].name == server_name
        assert by_id[span.parent_span_id].kind == Span.SPAN_KIND_SERVER
        assert span.kind == Span.SPAN_KIND_CLIENT
        described = attributes(span.attributes)
        assert described["gen_ai.operation.name"] == operation
        assert described["gen_ai.memory.store.id"] == "agent-1"
        assert described.get("gen_ai.memory.record.id") == record_id
    created = attributes(receiver.one("create_memory").attributes)
    assert created["gen_ai.memory.record.count"] == len(MEMORIES)

    # The rerank protocol: the proposed rerank span, the pipeline's steps under it.
    reranked = receiver.one("rerank earm/agent-1")
    assert by_id[reranked.parent_span_id].name == "POST /v2/rerank"
    assert attributes(reranked.attributes) | {
        "gen_ai.operation.name": "rerank",
        "gen_ai.request.model": "earm/agent-1",
        "gen_ai.rerank.candidate.count": 3,
        "gen_ai.rerank.top_n": 2,
    } == attributes(reranked.attributes)
    assert "gen_ai.rerank.scores" not in attributes(reranked.attributes)
    assert {"search", "plan", "rank", "record"} <= {s.name for s in receiver.children(reranked)}


def test_content_goes_into_spans_only_when_asked_for(
    judge_settings: Callable[..., Settings],
    receiver: OtlpReceiver,
    judge: tuple[Judge, str],
) -> None:
    _, judge_url = judge
    settings = traced_settings(judge_settings, judge_url, trace_content=True)
    with TestClient(create_app(settings)) as client:
        ingest(client)
        answer = retrieve(client)
        rerank(client)

    searched = attributes(receiver.one("search_memory").attributes)
    assert searched["gen_ai.memory.query.text"] == "topic 1"
    records = json.loads(searched["gen_ai.memory.records"])
    assert [(r["id"], r["content"], r["score"]) for r in records] == [
        (str(m["id"]), m["text"], m["score"]) for m in answer["memories"]
    ]
    created = json.loads(attributes(receiver.one("create_memory").attributes)[
        "gen_ai.memory.records"])
    assert [record["content"] for record in created] == MEMORIES
    scores = attributes(receiver.one("rerank earm/agent-1").attributes)["gen_ai.rerank.scores"]
    assert len(scores) == 3 and all(0 <= score <= 1 for score in scores)


def test_a_reranker_scorer_request_is_a_rerank_span_whose_trace_the_reranker_receives(
    judge_settings: Callable[..., Settings], receiver: OtlpReceiver
) -> None:
    reranker_app = rerank_app(lambda query, documents: [0.5] * len(documents))
    with LoopbackServer(reranker_app) as reranker:
        settings = traced_settings(
            judge_settings, reranker.url, scorer="rerank", scorer_base_url=f"{reranker.url}/v1"
        )
        with TestClient(create_app(settings)) as client:
            ingest(client)
            answer = retrieve(client)
    sent = reranker_app.state.last_request
    model = sent["json"]["model"]

    [request] = receiver.named(f"rerank {model}")
    assert answer["scorer_requests"] == 1 and request.kind == Span.SPAN_KIND_CLIENT
    assert attributes(request.attributes) | {
        "gen_ai.operation.name": "rerank",
        "gen_ai.request.model": model,
        "server.address": "127.0.0.1",
        "server.port": int(reranker.url.rsplit(":", 1)[1]),
        "earm.pairs": answer["scorer_calls"],
        "http.response.status_code": 200,
    } == attributes(request.attributes)
    assert sent["headers"]["traceparent"] == f"00-{CALLER_TRACE_ID}-{request.span_id.hex()}-01"
