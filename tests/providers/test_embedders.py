"""Embedders: the offline model for real, the OpenAI client against a real loopback HTTP server."""

from __future__ import annotations

import asyncio
import socket
import time
import zlib
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from service.providers.embedders import EmbedderError
from service.providers.factory import build_embedder
from service.providers.local_embedder import (
    LOCAL_DIM,
    LOCAL_MODEL_ID,
    MAX_RUN_TOKENS,
    LocalEmbedder,
    plan_batches,
)
from service.providers.openai_embedder import OpenAIEmbedder
from service.settings import Settings
from service.testing import HTTPFault, LoopbackServer, embeddings_app

Serve = Callable[[object], LoopbackServer]  # the `serve` fixture (conftest.py)

DIM = 8


# --- local embedder -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    embedder = LocalEmbedder()
    embedder.load()
    return embedder


def test_local_embedder_returns_unit_norm_384_float32_rows(local: LocalEmbedder) -> None:
    vectors = asyncio.run(local.embed(["The cat sat on the mat", "hello", ""]))
    assert vectors.shape == (3, LOCAL_DIM)
    assert vectors.dtype == np.float32
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert local.model_id == LOCAL_MODEL_ID and local.dim == LOCAL_DIM


def test_local_embedder_puts_related_texts_closer_than_unrelated(local: LocalEmbedder) -> None:
    cat, kitten, tax = local.embed_sync(
        ["The cat sat on the mat", "A kitten is sitting on a rug", "Quarterly tax filing deadlines"]
    )
    assert cat @ kitten > cat @ tax + 0.3
    assert cat @ kitten > kitten @ tax + 0.3


def test_local_embedder_batch_equals_one_by_one(local: LocalEmbedder) -> None:
    texts = [f"memory {i}: " + " ".join(["cats", "and", "dogs"] * (i % 12)) for i in range(100)]
    texts[37] = "a text far beyond the 256-token limit " * 60  # padded batch + truncation
    batched = local.embed_sync(texts)
    single = np.vstack([local.embed_sync([t]) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_local_embedder_truncates_long_texts_instead_of_failing(local: LocalEmbedder) -> None:
    vectors = local.embed_sync(["word " * 5000])
    assert vectors.shape == (1, LOCAL_DIM) and np.isfinite(vectors).all()


def test_local_embedder_empty_input_gives_empty_matrix(local: LocalEmbedder) -> None:
    vectors = asyncio.run(local.embed([]))
    assert vectors.shape == (0, LOCAL_DIM)
    assert vectors.dtype == np.float32


def test_local_embedder_embeds_a_query_while_a_bulk_call_is_running(local: LocalEmbedder) -> None:
    """Retrieves' queries do not wait for an ingest's texts: they have a lane of their own
    (the first waited for the whole batch of long memories ahead of it, seconds)."""
    # A model run of 16 x 256 tokens and one of 8: seconds, where the ten queries take
    # a tenth of one.
    memories = [f"memory {n}: " + "the quick brown fox jumps over a lazy dog " * 40
                for n in range(24)]

    async def scenario() -> None:
        bulk = asyncio.create_task(local.embed(memories, bulk=True))
        await asyncio.sleep(0.1)  # the bulk call is on its lane by then
        # One after another: a query that waited for the bulk call leaves the rest after it.
        queries = [await local.embed([f"what does the fox do {n} times?"]) for n in range(10)]
        assert not bulk.done(), "a query waited for the bulk call"
        assert all(query.shape == (1, LOCAL_DIM) for query in queries)
        assert (await bulk).shape == (24, LOCAL_DIM)

    asyncio.run(scenario())


def test_local_embedder_bulk_calls_take_turns_batch_by_batch() -> None:
    """Two bulk calls share the model batch by batch (the smaller is not held up behind the
    whole of the larger), and give the vectors a call alone gives."""
    embedder = LocalEmbedder(batch_size=4)
    large = [f"large memory {n} " + "words of a long memory " * 30 for n in range(16)]
    small = [f"small memory {n}" for n in range(4)]

    async def scenario() -> None:
        first = asyncio.create_task(embedder.embed(large, bulk=True))
        await asyncio.sleep(0.1)  # the large call is on the bulk lane by then
        second = await embedder.embed(small, bulk=True)
        assert not first.done(), "the small call waited for the whole large one"
        np.testing.assert_allclose(second, embedder.embed_sync(small), atol=1e-5)
        np.testing.assert_allclose(await first, embedder.embed_sync(large), atol=1e-5)
        await embedder.aclose()

    asyncio.run(scenario())


def test_local_embedder_runs_at_most_max_run_tokens_positions_at_once() -> None:
    lengths = [5] * 10 + [256] * 40  # ascending, as plan_batches takes them
    batches = plan_batches(lengths, max_batch=64)
    assert [end - begin for begin, end in batches] == [10, 16, 16, 8]
    assert all((end - begin) * lengths[end - 1] <= MAX_RUN_TOKENS for begin, end in batches)


def test_local_embedder_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the local embedder opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    embedder = LocalEmbedder()  # a fresh instance, so loading happens under the guard too
    vectors = asyncio.run(embedder.embed(["offline please"]))
    assert vectors.shape == (1, LOCAL_DIM)


# --- OpenAI-compatible embedder over loopback HTTP ------------------------------------------


def fake_vector(text: str) -> list[float]:
    """Deterministic, deliberately unnormalised vector per text."""
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    return (rng.standard_normal(DIM) * 5.0).tolist()


def expected(texts: list[str]) -> np.ndarray:
    rows = np.array([fake_vector(t) for t in texts])
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def make_embedder(server: LoopbackServer, **kwargs: object) -> OpenAIEmbedder:
    options: dict[str, object] = {"timeout_s": 2.0, "backoff_base_s": 0.01}
    options.update(kwargs)
    return OpenAIEmbedder(base_url=server.url + "/v1", model="test-embed", dim=DIM, **options)  # type: ignore[arg-type]


async def embed_once(embedder: OpenAIEmbedder, texts: list[str]) -> np.ndarray:
    try:
        return await embedder.embed(texts)
    finally:
        await embedder.aclose()


def test_openai_embedder_returns_normalised_vectors_in_request_order_when_server_shuffles(
    serve: Serve,
) -> None:
    app = embeddings_app(lambda texts: [fake_vector(t) for t in texts], out_of_order=True)
    server = serve(app)
    texts = [f"text number {i}" for i in range(5)]
    vectors = asyncio.run(embed_once(make_embedder(server), texts))
    assert vectors.dtype == np.float32 and vectors.shape == (5, DIM)
    np.testing.assert_allclose(vectors, expected(texts), atol=1e-6)
    assert app.state.last_request["json"]["model"] == "test-embed"


def test_openai_embedder_splits_150_texts_into_batches_of_64_64_22(
    serve: Serve,
) -> None:
    sizes: list[int] = []

    def embed(texts: list[str]) -> list[list[float]]:
        sizes.append(len(texts))
        return [fake_vector(t) for t in texts]

    app = embeddings_app(embed)
    server = serve(app)
    texts = [f"t{i}" for i in range(150)]
    vectors = asyncio.run(embed_once(make_embedder(server, batch_size=64), texts))
    assert sizes == [64, 64, 22]
    assert app.state.calls == 3
    np.testing.assert_allclose(vectors, expected(texts), atol=1e-6)


def test_openai_embedder_retries_after_503_then_succeeds(serve: Serve) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        if app.state.calls == 1:
            raise HTTPFault(503, "overloaded")
        return [fake_vector(t) for t in texts]

    app = embeddings_app(embed)
    server = serve(app)
    vectors = asyncio.run(embed_once(make_embedder(server), ["a", "b"]))
    assert app.state.calls == 2
    np.testing.assert_allclose(vectors, expected(["a", "b"]), atol=1e-6)


def test_openai_embedder_honours_retry_after_on_429(serve: Serve) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        if app.state.calls == 1:
            raise HTTPFault(429, "slow down", headers={"Retry-After": "0.4"})
        return [fake_vector(t) for t in texts]

    app = embeddings_app(embed)
    server = serve(app)
    started = time.perf_counter()
    asyncio.run(embed_once(make_embedder(server, backoff_base_s=0.001), ["a"]))
    assert time.perf_counter() - started >= 0.4
    assert app.state.calls == 2


def test_openai_embedder_fails_fast_when_retry_after_is_too_long(
    serve: Serve,
) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        raise HTTPFault(429, "quota", headers={"Retry-After": "3600"})

    app = embeddings_app(embed)
    server = serve(app)
    started = time.perf_counter()
    with pytest.raises(EmbedderError, match="429"):
        asyncio.run(embed_once(make_embedder(server), ["a"]))
    assert time.perf_counter() - started < 1.0
    assert app.state.calls == 1


def test_openai_embedder_raises_after_persistent_500(serve: Serve) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        raise HTTPFault(500, "boom")

    app = embeddings_app(embed)
    server = serve(app)
    with pytest.raises(EmbedderError, match="500"):
        asyncio.run(embed_once(make_embedder(server, max_retries=2), ["a"]))
    assert app.state.calls == 3


def test_openai_embedder_does_not_retry_a_400(serve: Serve) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        raise HTTPFault(400, "input too long")

    app = embeddings_app(embed)
    server = serve(app)
    with pytest.raises(EmbedderError, match="input too long"):
        asyncio.run(embed_once(make_embedder(server), ["a"]))
    assert app.state.calls == 1


def test_openai_embedder_rejects_wrong_dimension(serve: Serve) -> None:
    app = embeddings_app(lambda texts: [[1.0] * (DIM + 1) for _ in texts])
    server = serve(app)
    with pytest.raises(EmbedderError, match="dimension"):
        asyncio.run(embed_once(make_embedder(server), ["a", "b"]))


def test_openai_embedder_rejects_missing_vectors(serve: Serve) -> None:
    app = embeddings_app(lambda texts: [fake_vector(t) for t in texts[:-1]])
    server = serve(app)
    with pytest.raises(EmbedderError, match="2 embeddings for 3 inputs"):
        asyncio.run(embed_once(make_embedder(server), ["a", "b", "c"]))


def test_openai_embedder_raises_on_timeout(serve: Serve) -> None:
    async def embed(texts: list[str]) -> list[list[float]]:
        await asyncio.sleep(1.0)
        return [fake_vector(t) for t in texts]

    app = embeddings_app(embed)
    server = serve(app)
    started = time.perf_counter()
    with pytest.raises(EmbedderError, match="timed out"):
        asyncio.run(embed_once(make_embedder(server, timeout_s=0.2, max_retries=1), ["a"]))
    assert time.perf_counter() - started < 0.9
    assert app.state.calls == 2


def test_openai_embedder_raises_when_nothing_listens() -> None:
    with socket.socket() as sock:  # bound but not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        embedder = OpenAIEmbedder(
            base_url=f"http://127.0.0.1:{port}/v1",
            model="m",
            dim=DIM,
            max_retries=1,
            backoff_base_s=0.01,
        )
        with pytest.raises(EmbedderError, match="transport error"):
            asyncio.run(embed_once(embedder, ["a"]))


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_openai_embedder_fails_an_endless_answer_after_reading_at_most_its_cap(
    endless_backend, framing: str,
) -> None:
    backend = endless_backend(framing)
    embedder = OpenAIEmbedder(base_url=backend.url + "/v1", model="m", dim=DIM, max_retries=2,
                              backoff_base_s=0.01)
    with pytest.raises(EmbedderError) as failed:
        asyncio.run(embed_once(embedder, ["a", "b"]))
    # 64 vectors of 8 numbers leave the answer about 1 MiB; 4 MiB: the loopback's buffers.
    for sent in backend.sent():
        assert sent.cut_off and sent.body <= 2 * 2**20 + 4 * 2**20, sent
    assert "answer is over" in str(failed.value)
    assert backend.requests == 1  # not asked again


def test_openai_embedder_sends_bearer_api_key(serve: Serve) -> None:
    app = embeddings_app(lambda texts: [fake_vector(t) for t in texts])
    server = serve(app)
    embedder = make_embedder(server, api_key="sk-test-123")
    asyncio.run(embed_once(embedder, ["a"]))
    assert app.state.last_request["headers"]["authorization"] == "Bearer sk-test-123"
    assert "sk-test-123" not in repr(embedder)


def test_openai_embedder_uses_a_caller_supplied_client_and_leaves_it_open(
    serve: Serve,
) -> None:
    app = embeddings_app(lambda texts: [fake_vector(t) for t in texts])
    server = serve(app)

    async def run() -> bool:
        async with httpx.AsyncClient() as client:
            embedder = make_embedder(server, client=client)
            await embedder.embed(["a"])
            await embedder.aclose()
            return client.is_closed

    assert asyncio.run(run()) is False
    assert app.state.calls == 1


def test_openai_embedder_empty_input_makes_no_call(serve: Serve) -> None:
    app = embeddings_app(lambda texts: [fake_vector(t) for t in texts])
    server = serve(app)
    vectors = asyncio.run(embed_once(make_embedder(server), []))
    assert vectors.shape == (0, DIM)
    assert app.state.calls == 0


# --- factory ----------------------------------------------------------------------------------


def test_build_embedder_none_means_clients_send_vectors() -> None:
    assert build_embedder(Settings(embedder="none").embedding) is None


def test_build_embedder_local_is_the_offline_model() -> None:
    embedder = build_embedder(Settings(embedder="local").embedding)
    assert isinstance(embedder, LocalEmbedder)
    assert embedder.dim == 384


def test_build_embedder_local_rejects_a_different_dimension() -> None:
    with pytest.raises(ValueError, match="EARM_EMBEDDING_DIM"):
        build_embedder(Settings(embedder="local", embedding_dim=768).embedding)


def test_settings_refuse_the_openai_embedder_without_a_base_url() -> None:
    with pytest.raises(
        ValidationError, match="EARM_EMBEDDER=openai requires EARM_EMBEDDER_BASE_URL"
    ):
        Settings(embedder="openai", embedder_base_url=None, _env_file=None)


def test_build_embedder_openai_uses_settings() -> None:
    settings = Settings(
        embedder="openai",
        embedder_base_url="http://127.0.0.1:9/v1/",
        embedder_model="m1",
        embedding_dim=16,
        embedder_api_key="sk-x",
    )
    embedder = build_embedder(settings.embedding)
    assert isinstance(embedder, OpenAIEmbedder)
    assert embedder.url == "http://127.0.0.1:9/v1/embeddings"
    assert embedder.model_id == "openai:m1" and embedder.dim == 16
    asyncio.run(embedder.aclose())
