"""POST /retrieve and /feedback through HTTP, against the real database and a loopback judge
that speaks the chat-completions protocol and scores from known labels."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.http.app import create_app
from service.settings import Settings
from service.testing import HTTPFault, LoopbackServer, chat_completions_app

DIM = 384
N_MEMORIES = 60


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


class LabelJudge:
    """Scores a (query, memory) pair from labels by finding both texts in the prompt."""

    def __init__(self) -> None:
        self.labels: dict[tuple[str, str], float] = {}
        self.memory_texts: list[str] = []
        self.queries: list[str] = []
        self.fault: Callable[[str], None] | None = None

    def reply(self, prompt: str) -> str:
        if self.fault is not None:
            self.fault(prompt)
        query = max((q for q in self.queries if q in prompt), key=len, default=None)
        memory = max((m for m in self.memory_texts if m in prompt), key=len, default=None)
        return str(self.labels.get((query, memory), 0.0))


@pytest.fixture
def judge() -> Iterator[tuple[LabelJudge, str]]:
    label_judge = LabelJudge()
    with LoopbackServer(chat_completions_app(label_judge.reply)) as server:
        yield label_judge, server.url


@pytest.fixture
def judged_settings(
    judge_settings: Callable[..., Settings], judge: tuple[LabelJudge, str]
) -> Settings:
    return judge_settings(
        judge[1],
        embedder="local",
        scorer_timeout_s=10.0,  # a loaded CI machine, not a latency bound
        budget_schedule="0:1.0,4:0.2",
        refit_every=5,
        rank=4,
        # The label judge is consistent, so a memory's own history may count after a few
        # observations (the default suits a noisy judge); the content prior is tested with the
        # default in test_content_prior_lifts_new_memories_that_look_like_judged_relevant_ones.
        memory_reg=1.0,
    )


@pytest.fixture
def judged_client(judged_settings: Settings) -> Iterator[TestClient]:
    # Refits inside the request (as every app of judged_settings here), so each test sees the
    # model its queries made due.
    with TestClient(create_app(judged_settings, refit_in_request=True)) as client:
        yield client


class Topic:
    """Synthetic memories with client vectors: a topic of queries near `center`, a memory
    `hidden` that is relevant to that topic but semantically far from it, and a few memories
    near the center that are relevant too."""

    def __init__(self, seed: int = 7) -> None:
        rng = np.random.default_rng(seed)
        self.center = unit(rng.normal(size=DIM))
        self.memory_vectors = [unit(rng.normal(size=DIM)) for _ in range(N_MEMORIES)]
        for i in range(3):  # near-center memories, relevant
            self.memory_vectors[i] = unit(self.center + 0.3 * unit(rng.normal(size=DIM)))
        self.memory_texts = [f"memory number {i} about things" for i in range(N_MEMORIES)]
        self.hidden = N_MEMORIES - 1
        self.rng = rng

    def query_vector(self) -> list[float]:
        return unit(self.center + 0.4 * unit(self.rng.normal(size=DIM))).tolist()

    def relevant(self) -> set[int]:
        return {0, 1, 2, self.hidden}

    def ingest(self, client: TestClient, namespace: str) -> list[int]:
        response = client.post(
            "/memories",
            json={
                "namespace": namespace,
                "memories": [
                    {"text": t, "embedding": v.tolist(), "external_id": f"m{i}"}
                    for i, (t, v) in enumerate(
                        zip(self.memory_texts, self.memory_vectors, strict=True)
                    )
                ],
            },
        )
        assert response.status_code == 201, response.text
        return response.json()["ids"]

    def label(self, judge: LabelJudge, query: str) -> None:
        judge.queries.append(query)
        judge.memory_texts = self.memory_texts
        for i, memory in enumerate(self.memory_texts):
            judge.labels[(query, memory)] = 1.0 if i in self.relevant() else 0.0


def retrieve(client: TestClient, **body) -> dict:
    body.setdefault("namespace", "agent-1")
    response = client.post("/retrieve", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def position_of(result: dict, memory_id: int) -> int | None:
    return next((m["rank"] for m in result["memories"] if m["id"] == memory_id), None)


@pytest.mark.parametrize(
    ("policy", "budget", "expected_calls"),
    [
        ("semantic", None, 0),
        ("full", None, 40),
        ("observed", 7, 7),
        ("earm", 7, 7),
        ("earm", None, 40),
    ],
)
def test_each_policy_makes_the_documented_number_of_scorer_calls(
    judged_client: TestClient, judge, policy: str, budget: int | None, expected_calls: int
) -> None:
    topic = Topic()
    topic.ingest(judged_client, "agent-1")
    body = {
        "query": "q-calls",
        "query_embedding": topic.query_vector(),
        "candidates": 40,
        "policy": policy,
    }
    if budget is not None:
        body["budget"] = budget
    result = retrieve(judged_client, **body)
    assert result["scorer_calls"] == expected_calls
    assert result["budget"] == expected_calls
    observed = sum(m["source"] == "observed" for m in result["memories"])
    assert observed <= expected_calls


def test_schedule_lowers_the_budget_as_the_namespace_gains_experience(
    judged_client: TestClient,
) -> None:
    topic = Topic()
    topic.ingest(judged_client, "agent-1")
    budgets = [
        retrieve(judged_client, query=f"q{i}", query_embedding=topic.query_vector(), candidates=40)
        for i in range(6)
    ]
    assert [r["budget"] for r in budgets] == [40, 40, 40, 40, 8, 8]
    assert [r["stage"] for r in budgets] == [0, 0, 0, 0, 1, 1]
    assert [r["query_index"] for r in budgets] == list(range(6))


def learn_topic(client: TestClient, judge: LabelJudge, topic: Topic, n_queries: int) -> None:
    """Full-budget queries of the topic: the judge reveals that `hidden` is relevant."""
    for i in range(n_queries):
        query = f"topic question {i}"
        topic.label(judge, query)
        retrieve(
            client,
            query=query,
            query_embedding=topic.query_vector(),
            candidates=N_MEMORIES,
            policy="full",
        )


def test_earm_ranks_memory_relevant_to_earlier_similar_queries_above_semantic(
    judged_client: TestClient, judge
) -> None:
    topic = Topic()
    ids = topic.ingest(judged_client, "agent-1")
    learn_topic(judged_client, judge[0], topic, 6)
    query_vector = topic.query_vector()
    topic.label(judge[0], "new topic question")
    common = {
        "query": "new topic question",
        "query_embedding": query_vector,
        "candidates": N_MEMORIES,
        "k": 20,
        "order": "relevance",
    }
    semantic = retrieve(judged_client, policy="semantic", **common)
    earm = retrieve(judged_client, policy="earm", budget=2, **common)
    hidden = ids[topic.hidden]
    hidden_in_earm = next(m for m in earm["memories"] if m["id"] == hidden)
    assert hidden_in_earm["source"] == "estimated"
    semantic_rank = position_of(semantic, hidden) or 21
    assert hidden_in_earm["rank"] < semantic_rank
    assert hidden_in_earm["rank"] <= 5


def test_content_prior_lifts_new_memories_that_look_like_judged_relevant_ones(
    judged_settings: Settings, judge
) -> None:
    """Default memory_reg: memories never scored (ingested after the learning) are ranked by
    what the judge taught about memories that look like them, above more similar ones."""
    label_judge = judge[0]
    rng = np.random.default_rng(3)
    facts, chat = unit(rng.normal(size=DIM)), unit(rng.normal(size=DIM))

    def near(direction: np.ndarray, n: int) -> list[np.ndarray]:
        return [unit(direction + 0.25 * unit(rng.normal(size=DIM))) for _ in range(n)]

    def query_vector() -> list[float]:
        # Closer to the small-talk memories than to the factual ones.
        return unit(0.55 * facts + 0.8 * chat + 0.3 * unit(rng.normal(size=DIM))).tolist()

    def ingest(prefix: str, vectors: list[np.ndarray]) -> list[int]:
        response = client.post(
            "/memories",
            json={
                "namespace": "agent-1",
                "memories": [
                    {"text": f"{prefix} {i}", "embedding": v.tolist()}
                    for i, v in enumerate(vectors)
                ],
            },
        )
        assert response.status_code == 201, response.text
        return response.json()["ids"]

    settings = judged_settings.model_copy(update={"memory_reg": Settings().memory_reg})
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        ingest("fact", near(facts, 15))
        ingest("chat", near(chat, 25))
        label_judge.memory_texts = (
            [f"fact {i}" for i in range(20)] + [f"chat {i}" for i in range(30)]
        )
        for i in range(10):
            query = f"question {i}"
            label_judge.queries.append(query)
            for text_ in label_judge.memory_texts:
                label_judge.labels[(query, text_)] = 1.0 if text_.startswith("fact") else 0.0
            retrieve(
                client, query=query, query_embedding=query_vector(), candidates=40, policy="full"
            )
        new_facts = ingest("fact", near(facts, 5))  # texts "fact 0".."fact 4" again: same labels
        new_chat = ingest("chat", near(chat, 5))
        common = {
            "query": "question 0",
            "query_embedding": query_vector(),
            "candidates": 50,
            "k": 50,
            "order": "relevance",
        }
        semantic = retrieve(client, policy="semantic", **common)
        earm = retrieve(client, policy="earm", budget=2, **common)

    def mean_rank(result: dict, ids: list[int]) -> float:
        return float(np.mean([position_of(result, i) for i in ids]))

    assert mean_rank(semantic, new_facts) > mean_rank(semantic, new_chat)
    assert mean_rank(earm, new_facts) < mean_rank(earm, new_chat)
    unobserved_new = [
        m for m in earm["memories"] if m["id"] in new_facts and m["source"] != "observed"
    ]
    assert unobserved_new and all(m["source"] == "estimated" for m in unobserved_new)


def test_refit_sets_the_running_score_sum_to_the_double_precision_sum_of_stored_scores(
    judged_client: TestClient, judge, judged_settings: Settings
) -> None:
    """A refit recomputes the namespace's score sum (its mean centres the model) from the
    stored `real` scores. Summed as `real`, it carried float32 rounding that also depended on
    the physical order of the rows, so a replay of the same requests could differ."""
    topic = Topic()
    topic.ingest(judged_client, "agent-1")
    label_judge = judge[0]
    label_judge.memory_texts = topic.memory_texts
    for i in range(5):  # a young namespace refits often; the fifth query makes one due
        query = f"fractional question {i}"
        label_judge.queries.append(query)
        # Scores float32 cannot hold exactly, so float32 sums round.
        label_judge.labels |= {
            (query, m): 0.1 + 0.01 * (j % 7) for j, m in enumerate(topic.memory_texts)
        }
        retrieve(
            judged_client,
            query=query,
            query_embedding=topic.query_vector(),
            candidates=N_MEMORIES,
            policy="full",
        )
    engine = create_engine(judged_settings.database_url)
    with engine.connect() as conn:
        score_sum, since_refit = conn.execute(
            text("SELECT score_sum, queries_since_refit FROM namespaces")
        ).one()
        exact_sum = conn.execute(text("SELECT sum(score::text::float8) FROM scores")).scalar_one()
    engine.dispose()
    assert since_refit == 0, "the last query should have refitted"
    assert score_sum == pytest.approx(exact_sum, rel=1e-12, abs=0)


def test_restart_keeps_the_learned_state(judged_settings: Settings, judge) -> None:
    topic = Topic()
    with TestClient(create_app(judged_settings, refit_in_request=True)) as client:
        ids = topic.ingest(client, "agent-1")
        learn_topic(client, judge[0], topic, 6)
    with TestClient(create_app(judged_settings, refit_in_request=True)) as restarted:
        topic.label(judge[0], "after restart")
        result = retrieve(
            restarted,
            query="after restart",
            query_embedding=topic.query_vector(),
            candidates=N_MEMORIES,
            budget=2,
            k=10,
            order="relevance",
        )
    assert result["query_index"] == 6
    hidden = next(m for m in result["memories"] if m["id"] == ids[topic.hidden])
    assert hidden["source"] == "estimated" and hidden["rank"] <= 5


def test_concurrent_retrieves_get_gap_free_indexes_and_store_every_observation(
    judged_settings: Settings,
) -> None:
    topic = Topic()
    # A generous scorer deadline: this test is about indexes and storage, not timeouts.
    settings = judged_settings.model_copy(update={"scorer_timeout_s": 60.0})
    with LoopbackServer(create_app(settings, refit_in_request=True)) as service:
        with httpx.Client(base_url=service.url) as sync_client:
            response = sync_client.post(
                "/memories",
                json={
                    "namespace": "agent-1",
                    "memories": [
                        {"text": t, "embedding": v.tolist()}
                        for t, v in zip(topic.memory_texts, topic.memory_vectors, strict=True)
                    ],
                },
            )
            assert response.status_code == 201

        async def burst() -> list[dict]:
            async with httpx.AsyncClient(base_url=service.url, timeout=30) as client:
                responses = await asyncio.gather(
                    *(
                        client.post(
                            "/retrieve",
                            json={
                                "namespace": "agent-1",
                                "query": f"concurrent {i}",
                                "query_embedding": topic.query_vector(),
                                "candidates": 20,
                                "budget": 5,
                            },
                        )
                        for i in range(20)
                    )
                )
            assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
            return [r.json() for r in responses]

        results = asyncio.run(burst())
    assert sorted(r["query_index"] for r in results) == list(range(20))
    engine = create_engine(judged_settings.database_url)
    with engine.connect() as conn:
        stored = dict(
            conn.execute(text("SELECT query_id, count(*) FROM scores GROUP BY query_id")).all()
        )
        indexes = conn.execute(text("SELECT query_index FROM queries ORDER BY 1")).scalars().all()
    engine.dispose()
    assert indexes == list(range(20))
    assert {r["query_id"]: 5 for r in results} == stored


@pytest.mark.parametrize(
    "fault",
    ["http_500", "garbage", "out_of_range", "timeout"],
)
def test_scorer_failures_degrade_and_store_nothing_for_failed_pairs(
    judged_client: TestClient, judge, judged_settings: Settings, fault: str
) -> None:
    topic = Topic()
    ids = topic.ingest(judged_client, "agent-1")
    failing = set(topic.memory_texts[::2])

    async def reply(prompt: str) -> str:
        memory = next(m for m in topic.memory_texts if m in prompt)
        if memory not in failing:
            return "0.5"
        if fault == "http_500":
            raise HTTPFault(500, "boom")
        if fault == "timeout":
            await asyncio.sleep(10)
        return "I cannot answer that" if fault == "garbage" else "7"

    with LoopbackServer(chat_completions_app(reply)) as failing_judge:
        # Deadline short enough to keep the test quick, long enough that answering pairs
        # never miss it on a loaded machine; every pair in flight at once, so the hung ones
        # do not hold the answering ones back until the request's deadline.
        settings = judged_settings.model_copy(
            update={
                "scorer_base_url": f"{failing_judge.url}/v1",
                "scorer_timeout_s": 2.0 if fault == "timeout" else 10.0,
                "scorer_concurrency": N_MEMORIES,
            }
        )
        with TestClient(create_app(settings, refit_in_request=True)) as client:
            result = retrieve(
                client,
                query="q",
                query_embedding=topic.query_vector(),
                candidates=N_MEMORIES,
                policy="full",
            )
    assert result["degraded"] is True
    assert result["scorer_calls"] == N_MEMORIES
    assert len(result["memories"]) == 10
    engine = create_engine(judged_settings.database_url)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT memory_id, score FROM scores")).all()
    engine.dispose()
    failing_ids = {ids[i] for i, t in enumerate(topic.memory_texts) if t in failing}
    assert len(stored) == N_MEMORIES - len(failing_ids)
    assert not {memory_id for memory_id, _ in stored} & failing_ids
    assert all(score == pytest.approx(0.5) for _, score in stored)


def replay(client: TestClient, judge: LabelJudge) -> list[list[tuple]]:
    topic = Topic(seed=11)
    topic.ingest(client, "agent-1")
    outputs = []
    for i in range(8):
        query = f"replayed {i}"
        topic.label(judge, query)
        result = retrieve(
            client, query=query, query_embedding=topic.query_vector(), candidates=30, k=8, seed=3
        )
        outputs.append(
            [(m["id"], round(m["score"], 9), m["source"], m["rank"]) for m in result["memories"]]
            + [(result["budget"], result["scorer_calls"], result["query_index"])]
        )
    return outputs


def test_sequential_replay_is_deterministic(judged_settings: Settings, judge) -> None:
    with TestClient(create_app(judged_settings, refit_in_request=True)) as client:
        first = replay(client, judge[0])
    engine = create_engine(judged_settings.database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE namespaces, memories, queries, scores, memory_factors"
                " RESTART IDENTITY CASCADE"
            )
        )
    engine.dispose()
    with TestClient(create_app(judged_settings, refit_in_request=True)) as client:
        second = replay(client, judge[0])
    assert first == second


def test_feedback_changes_later_estimates(judged_client: TestClient, judge) -> None:
    topic = Topic()
    hidden_scores = {}
    for namespace, give_feedback in (("with-feedback", True), ("without-feedback", False)):
        topic.rng = np.random.default_rng(5)  # identical queries in both namespaces
        ids = topic.ingest(judged_client, namespace)
        learn_topic_queries = []
        for i in range(5):
            result = retrieve(
                judged_client,
                namespace=namespace,
                query=f"unlabelled {i}",
                query_embedding=topic.query_vector(),
                candidates=N_MEMORIES,
                budget=3,
            )
            learn_topic_queries.append(result["query_id"])
        if give_feedback:
            for query_id in learn_topic_queries:
                response = judged_client.post(
                    "/feedback",
                    json={
                        "namespace": namespace,
                        "query_id": query_id,
                        "scores": [{"memory_id": ids[topic.hidden], "score": 1.0}],
                    },
                )
                assert response.status_code == 200
                assert response.json() == {"recorded": 1, "replaced": 0}
        result = retrieve(
            judged_client,
            namespace=namespace,
            query="later",
            query_embedding=topic.query_vector(),
            candidates=N_MEMORIES,
            budget=2,
            k=N_MEMORIES,
            order="relevance",
        )
        hidden_scores[namespace] = next(
            m for m in result["memories"] if m["id"] == ids[topic.hidden]
        )
    assert hidden_scores["with-feedback"]["source"] == "estimated"
    assert (
        hidden_scores["with-feedback"]["score"] > hidden_scores["without-feedback"]["score"] + 0.1
    )
    assert hidden_scores["with-feedback"]["rank"] < hidden_scores["without-feedback"]["rank"]


def test_feedback_for_unknown_query_or_foreign_memory_is_a_404(judged_client: TestClient) -> None:
    topic = Topic()
    ids = topic.ingest(judged_client, "agent-1")
    other = topic.ingest(judged_client, "agent-2")
    query_id = retrieve(
        judged_client, query="q", query_embedding=topic.query_vector(), policy="semantic"
    )["query_id"]
    unknown_query = judged_client.post(
        "/feedback",
        json={
            "namespace": "agent-1",
            "query_id": 999999,
            "scores": [{"memory_id": ids[0], "score": 1}],
        },
    )
    foreign_memory = judged_client.post(
        "/feedback",
        json={
            "namespace": "agent-1",
            "query_id": query_id,
            "scores": [{"memory_id": other[0], "score": 1}],
        },
    )
    out_of_range = judged_client.post(
        "/feedback",
        json={
            "namespace": "agent-1",
            "query_id": query_id,
            "scores": [{"memory_id": ids[0], "score": 1.5}],
        },
    )
    assert unknown_query.status_code == 404 and foreign_memory.status_code == 404
    assert out_of_range.status_code == 422


def test_feedback_naming_a_memory_twice_is_refused(client: TestClient, settings: Settings) -> None:
    memories = [{"text": f"m{i}", "embedding": unit(np.arange(DIM) + i).tolist()} for i in range(3)]
    ids = client.post(
        "/memories", json={"namespace": "agent-1", "memories": memories}
    ).json()["ids"]
    query_id = retrieve(
        client, query="q", query_embedding=unit(np.ones(DIM)).tolist(), policy="semantic"
    )["query_id"]
    scores = [
        {"memory_id": ids[0], "score": 1.0},
        {"memory_id": ids[1], "score": 0.5},
        {"memory_id": ids[0], "score": 0.0},
    ]
    response = client.post(
        "/feedback", json={"namespace": "agent-1", "query_id": query_id, "scores": scores}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert "scores[0]" in error["message"] and "scores[2]" in error["message"]
    engine = create_engine(settings.database_url)
    with engine.connect() as conn:
        recorded = conn.execute(
            text("SELECT count(*) FROM scores WHERE source = 'feedback'")
        ).scalar_one()
    engine.dispose()
    assert recorded == 0


def test_a_zero_length_vector_already_stored_cannot_break_retrieval(clean_database: str) -> None:
    """Rows stored before vectors were checked as float32 (or written by hand) may have no
    length: the search and the content prior must treat them as orthogonal, never divide by
    their zero norm."""
    settings = Settings(
        database_url=clean_database, embedder="local", scorer="local", refit_every=2,
        _env_file=None,
    )
    rng = np.random.default_rng(3)
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        memories = [
            {"text": f"m{i}", "embedding": unit(rng.normal(size=DIM)).tolist()} for i in range(12)
        ]
        created = client.post("/memories", json={"namespace": "agent-1", "memories": memories})
        assert created.status_code == 201

        def query() -> list[float]:
            return unit(rng.normal(size=DIM)).tolist()

        for _ in range(2):  # the second query's refit fits the content prior
            retrieve(client, query="q", query_embedding=query(), policy="full")
        engine = create_engine(clean_database)
        with engine.begin() as conn:
            assert conn.execute(
                text("SELECT content_weights IS NOT NULL FROM namespaces WHERE name = 'agent-1'")
            ).scalar_one()
            zero_id = conn.execute(
                text(
                    "INSERT INTO memories (namespace, text, embedding, embedding_model) "
                    "VALUES ('agent-1', 'zero', :zero, 'client') RETURNING id"
                ),
                {"zero": str([0.0] * DIM)},
            ).scalar_one()
        engine.dispose()
        query_ids = {}
        for policy in ("semantic", "earm", "full", "observed", "earm", "full"):
            result = retrieve(client, query="q", query_embedding=query(), policy=policy, k=13)
            query_ids[policy] = result["query_id"]
            zero = next(m for m in result["memories"] if m["id"] == zero_id)
            assert zero["similarity"] == 0.0
            assert all(np.isfinite(m["score"]) for m in result["memories"])
        feedback = client.post(
            "/feedback",
            json={"namespace": "agent-1", "query_id": query_ids["semantic"],
                  "scores": [{"memory_id": zero_id, "score": 1.0}]},
        )
        assert feedback.status_code == 200, feedback.text
        assert feedback.json()["recorded"] == 1
        for _ in range(2):  # another refit, now with the zero row's observations
            result = retrieve(client, query="q", query_embedding=query(), k=13)
            assert all(np.isfinite(m["score"]) for m in result["memories"])


def test_candidates_are_filled_when_namespace_is_a_small_share_of_the_table(
    client: TestClient,
) -> None:
    rng = np.random.default_rng(0)
    for start in range(0, 5000, 1000):
        vectors = rng.normal(size=(1000, DIM))
        response = client.post(
            "/memories",
            json={
                "namespace": "big",
                "memories": [
                    {"text": f"b{start + i}", "embedding": v.tolist()}
                    for i, v in enumerate(vectors)
                ],
            },
        )
        assert response.status_code == 201
    small = rng.normal(size=(300, DIM))
    response = client.post(
        "/memories",
        json={
            "namespace": "small",
            "memories": [{"text": f"s{i}", "embedding": v.tolist()} for i, v in enumerate(small)],
        },
    )
    assert response.status_code == 201
    result = retrieve(
        client,
        namespace="small",
        query="q",
        query_embedding=rng.normal(size=DIM).tolist(),
        policy="full",
        candidates=200,
    )
    assert result["scorer_calls"] == 200


def test_chronological_order_sorts_by_occurred_at_and_keeps_relevance_rank(
    client: TestClient,
) -> None:
    rng = np.random.default_rng(1)
    center = unit(rng.normal(size=DIM))
    dates = ["2023-05-01T00:00:00Z", "2021-01-01T00:00:00Z", "2022-03-01T00:00:00Z", None]
    memories = [
        {
            "text": f"m{i}",
            "embedding": (center + 0.1 * i * unit(rng.normal(size=DIM))).tolist(),
            **({"occurred_at": d} if d else {}),
        }
        for i, d in enumerate(dates)
    ]
    client.post("/memories", json={"namespace": "agent-1", "memories": memories})
    result = retrieve(client, query="q", query_embedding=center.tolist(), policy="semantic", k=4)
    assert [m["text"] for m in result["memories"]] == ["m1", "m2", "m0", "m3"]
    assert [m["rank"] for m in result["memories"]] == [2, 3, 1, 4]
    by_relevance = retrieve(
        client,
        query="q",
        query_embedding=center.tolist(),
        policy="semantic",
        k=4,
        order="relevance",
    )
    assert [m["rank"] for m in by_relevance["memories"]] == [1, 2, 3, 4]
    assert all(m["source"] == "semantic" for m in by_relevance["memories"])


def test_local_scorer_and_embedder_answer_without_any_network(client: TestClient) -> None:
    client.post(
        "/memories",
        json={
            "namespace": "agent-1",
            "memories": [{"text": "My dog is called Rex"}, {"text": "I work as a nurse"}],
        },
    )
    result = retrieve(client, query="What is my dog's name?", k=1, policy="full")
    assert result["memories"][0]["text"] == "My dog is called Rex"
    assert result["memories"][0]["source"] == "observed"
    assert set(result["timings"]) >= {
        "embed_ms",
        "search_ms",
        "score_ms",
        "complete_ms",
        "total_ms",
    }


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"policy": "magic"}, 422, "validation_error"),
        ({"budget": 500, "candidates": 200}, 422, "invalid_input"),
        ({"k": 101}, 413, "limit_exceeded"),
        ({"candidates": 1001}, 413, "limit_exceeded"),
        ({"k": 0}, 422, "validation_error"),
        ({"query": ""}, 422, "validation_error"),
        ({"query": " \t\n"}, 422, "validation_error"),
        ({"query_embedding": [0.1, 0.2]}, 422, "dimension_mismatch"),
    ],
)
def test_invalid_retrieve_is_a_precise_4xx(
    client: TestClient, body: dict, status: int, code: str
) -> None:
    client.post(
        "/memories",
        json={
            "namespace": "agent-1",
            "memories": [{"text": "x", "embedding": [1.0] + [0.0] * (DIM - 1)}],
        },
    )
    request = {
        "namespace": "agent-1",
        "query": "q",
        "query_embedding": [1.0] + [0.0] * (DIM - 1),
    } | body
    response = client.post("/retrieve", json=request)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def test_retrieve_without_embedder_needs_a_query_vector(clean_database: str) -> None:
    settings = Settings(database_url=clean_database, embedder="none", _env_file=None)
    with TestClient(create_app(settings)) as client:
        client.post(
            "/memories",
            json={
                "namespace": "agent-1",
                "memories": [{"text": "x", "embedding": [1.0] + [0.0] * (DIM - 1)}],
            },
        )
        response = client.post("/retrieve", json={"namespace": "agent-1", "query": "q"})
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "embedding_required"
        with_vector = client.post(
            "/retrieve",
            json={
                "namespace": "agent-1",
                "query": "q",
                "query_embedding": [1.0] + [0.0] * (DIM - 1),
            },
        )
        assert with_vector.status_code == 200

