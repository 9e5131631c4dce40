"""`earm namespace export` and `earm namespace import`: a namespace populated through the real
service (memories, retrieves scored by a loopback reranker, feedback, an edit, a deletion, a
refit) moves to another database and answers the next retrieves exactly as the original does;
files the target cannot take are refused with one line and leave nothing behind."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.cli import main as earm
from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, rerank_app
from tests.cli.transfer import comparable

NAMESPACE = "agent-7"
MEMORIES = 40


def relevance(query: str, documents: list[str]) -> list[float | None]:
    """A deterministic judge: a memory of the topic the query names is relevant, the rest get
    a small score that varies with the memory."""
    return [
        0.9 if document.split()[-1] in query.split() else 0.05 * (len(document) % 5)
        for document in documents
    ]


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def run_earm(argv: list[str], database_url: str, stdin: str = "", **env: str) -> Ran:
    """`earm ARGV` in this process (a subprocess costs seconds of start-up), with the database,
    ``stdin`` and extra EARM_* settings."""
    out, err = io.StringIO(), io.StringIO()
    settings = {"EARM_DATABASE_URL": database_url, "EARM_EMBEDDER": "local"} | {
        f"EARM_{name.upper()}": value for name, value in env.items()
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in settings.items():
            patch.setenv(name, value)
        patch.setattr(sys, "stdin", io.StringIO(stdin))
        with redirect_stdout(out), redirect_stderr(err):
            returncode = earm(argv)
    return Ran(returncode, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def reranker() -> Iterator[LoopbackServer]:
    with LoopbackServer(rerank_app(relevance)) as server:
        yield server


def service_app(database_url: str, reranker: LoopbackServer) -> FastAPI:
    """The service on ``database_url``: its refits run inside the requests that make them due."""
    settings = Settings(
        database_url=database_url, embedder="local", scorer="rerank",
        scorer_base_url=f"{reranker.url}/v1", scorer_max_retries=0, scorer_timeout_s=10.0,
        budget_schedule="0:1.0,3:0.4", refit_every=3, rank=2, _env_file=None,
    )
    return create_app(settings, refit_in_request=True)


def populate(client: TestClient) -> None:
    """Memories, retrieves (a repeat among them), feedback, an edit and a deletion."""
    memories = [
        {"text": f"memory number {i} is about topic{i % 6}", "external_id": f"m{i}",
         "metadata": {"i": i, "weight": i / 7},
         "occurred_at": f"2024-01-{i % 28 + 1:02d}T10:00:00Z"}
        for i in range(MEMORIES)
    ]
    stored = client.post("/memories", json={"namespace": NAMESPACE, "memories": memories})
    assert stored.status_code == 201, stored.text
    ids = stored.json()["ids"]
    query_ids = [
        retrieve(client, query)["query_id"]
        for query in ("what about topic1", "anything on topic2", "what about topic1",
                      "topic3 please", "and topic4 then", "tell me about topic5 and topic1")
    ]
    scores = [{"external_id": "m1", "score": 0.0}, {"external_id": "m8", "score": 1.0}]
    feedback = {"namespace": NAMESPACE, "query_id": query_ids[1], "scores": scores}
    assert client.post("/feedback", json=feedback).is_success
    edit = {"text": "memory five, rewritten, topic1"}
    assert client.patch(f"/memories/{ids[5]}", json=edit).is_success
    assert client.delete(f"/memories/{ids[12]}").status_code == 204


def retrieve(client: TestClient, query: str, **options: Any) -> dict[str, Any]:
    # Every candidate returned: the comparison covers the whole ranking, estimates included.
    body = {"namespace": NAMESPACE, "query": query, "candidates": MEMORIES, "k": MEMORIES,
            "order": "relevance"} | options
    response = client.post("/retrieve", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.fixture(scope="module")
def exported(
    migrated_database: Callable[[str], str], reranker: LoopbackServer
) -> Iterator[tuple[str, str]]:
    """The source database, with the namespace populated and refitted, and its exported file."""
    source = migrated_database("earm_transfer_source")
    with TestClient(service_app(source, reranker)) as client:
        populate(client)
        assert client.get("/stats", params={"namespace": NAMESPACE}).json()["last_refit_at"]
    ran = run_earm(["namespace", "export", NAMESPACE], source)
    assert ran.returncode == 0, ran.stderr
    yield source, ran.stdout


@pytest.fixture(scope="module")
def target(migrated_database: Callable[[str], str]) -> str:
    return migrated_database("earm_transfer_target")


def test_an_imported_namespace_answers_the_next_retrieves_as_the_original_does(
    exported: tuple[str, str], target: str, reranker: LoopbackServer
) -> None:
    """The same requests, on the original and on the import, answer with the same memories,
    scores, sources and order, through new queries, a repeat (reuse), feedback and a refit."""
    source, file = exported
    imported = run_earm(["namespace", "import"], target, stdin=file)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == ""
    answers: dict[str, list[dict[str, Any]]] = {}
    for database in (source, target):
        with TestClient(service_app(database, reranker)) as client:
            answers[database] = [
                comparable(retrieve(client, query, **options))
                for query, options in (
                    ("what about topic1", {}), ("topic2 and topic3", {}),
                    ("any news on topic2", {"policy": "observed"}), ("topic4 at last", {}),
                    ("what is topic5", {"policy": "semantic"}),
                )
            ]
            stats = client.get("/stats", params={"namespace": NAMESPACE}).json()
            # Imported memories wait for the indexer; the refit these retrieves made is dated
            # by each deployment's clock; the scorer's health is the process's.
            del stats["memories_unindexed"], stats["last_refit_at"], stats["scorer"]
            answers[database].append(stats)
    assert answers[target] == answers[source]
    first = answers[source][0]
    assert first["reused"] > 0 and {m["source"] for m in first["memories"]} == {"observed"}
    # The comparison covers what the model and the reuse of observations answer, not only
    # what the judge scored again.
    assert {"observed", "estimated"} <= {m["source"] for a in answers[source][:5]
                                         for m in a["memories"]}


def canonical(file: str) -> list[dict[str, Any]]:
    """The file's records with every memory and query id replaced by its order of first
    appearance, and the namespace's name and export time left out: what two exports of the
    same namespace state under different ids share."""
    records = [json.loads(line) for line in file.splitlines()]
    memory_ids: dict[int, int] = {}
    query_ids: dict[int, int] = {}

    def rename(ids: dict[int, int], value: int) -> int:
        return ids.setdefault(value, len(ids))

    for record in records[1:]:
        if record.get("kind") == "memory":
            record["id"] = rename(memory_ids, record["id"])
        elif record.get("kind") == "query":
            record["id"] = rename(query_ids, record["id"])
            for column in ("reused_memory_ids", "trace_memory_ids"):
                record[column] = [rename(memory_ids, m) for m in record[column] or ()]
        elif "memory_id" in record:
            record["memory_id"] = memory_ids[record["memory_id"]]
            if "query_id" in record:
                record["query_id"] = query_ids[record["query_id"]]
    header = {k: v for k, v in records[0].items() if k not in ("namespace", "exported_at")}
    return [header, *records[1:]]


def test_import_as_another_name_keeps_every_row_under_new_ids(
    exported: tuple[str, str], target: str
) -> None:
    """Exporting the import gives back the original file, but for the name and the ids: every
    reference (observations, replaced ones, model rows, reused and traced memories, a deleted
    memory's place in the traces) follows its row."""
    _, file = exported
    imported = run_earm(["namespace", "import", "--as", "agent-7-copy"], target, stdin=file)
    assert imported.returncode == 0, imported.stderr
    counts = json.loads(file.splitlines()[-1])["records"]
    assert imported.stderr.strip().splitlines() == [
        "imported namespace 'agent-7-copy': "
        + ", ".join(f"{kind} {count}" for kind, count in counts.items())
    ]
    assert (counts["memory"], counts["query"], counts["replaced_observation"]) == (39, 6, 2)
    assert counts["observation"] > 0 and counts["model_row"] > 0
    again = run_earm(["namespace", "export", "agent-7-copy"], target)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.splitlines()[0])["namespace"] == "agent-7-copy"
    assert canonical(again.stdout) == canonical(file)


def namespace_rows(database_url: str, namespace: str) -> int:
    """The rows ``namespace`` has in the database, over every table that holds them."""
    engine = create_engine(database_url)
    with engine.connect() as conn:
        count = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM namespaces WHERE name = :n)"
                " + (SELECT count(*) FROM memories WHERE namespace = :n)"
                " + (SELECT count(*) FROM queries WHERE namespace = :n)"
                " + (SELECT count(*) FROM scores WHERE namespace = :n)"
                " + (SELECT count(*) FROM score_history WHERE namespace = :n)"
                " + (SELECT count(*) FROM memory_factors WHERE namespace = :n)"
            ),
            {"n": namespace},
        ).scalar_one()
    engine.dispose()
    return int(count)


def with_header(file: str, **changes: Any) -> str:
    lines = file.splitlines(keepends=True)
    return json.dumps(json.loads(lines[0]) | changes) + "\n" + "".join(lines[1:])


def with_bad_last_memory(file: str) -> str:
    """The file with its last memory's embedding of the wrong dimension: the namespace record
    and the memories before it are valid."""
    lines = file.splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if json.loads(line).get("kind") == "memory")
    lines[last] = json.dumps(json.loads(lines[last]) | {"embedding": "[1,2,3]"}) + "\n"
    return "".join(lines)


def memory_before_namespace(file: str) -> str:
    header, namespace, memory, *rest = file.splitlines(keepends=True)
    return "".join([header, memory, namespace, *rest])


@pytest.mark.parametrize(
    ("change", "env", "hints"),
    [
        pytest.param(lambda f: f, {"embedder": "none"}, ("model 'local:", "'client'"),
                     id="another-embedding-model"),
        pytest.param(lambda f: with_header(f, embedding_dim=768), {}, ("768-dimensional",),
                     id="another-dimension"),
        pytest.param(lambda f: with_header(f, version=2), {}, ("format version 2",),
                     id="a-newer-format"),
        pytest.param(lambda f: "".join(f.splitlines(keepends=True)[:-5]), {}, ("truncated",),
                     id="truncated"),
        pytest.param(lambda f: f[: len(f) // 2], {}, ("not JSON",), id="cut-mid-line"),
        pytest.param(with_bad_last_memory, {}, ("malformed file", "dimensions"),
                     id="a-bad-record-after-valid-ones"),
        pytest.param(lambda f: f + f.splitlines(keepends=True)[2], {}, ("follows the trailer",),
                     id="a-record-after-the-trailer"),
        pytest.param(memory_before_namespace, {}, ("memory record out of order",),
                     id="records-out-of-order"),
        pytest.param(lambda f: "{}\n", {}, ("not an earm namespace file",), id="not-a-file"),
    ],
)
def test_a_file_the_deployment_cannot_take_is_refused_and_leaves_nothing(
    exported: tuple[str, str], target: str, change: Any, env: dict[str, str],
    hints: tuple[str, ...], request: pytest.FixtureRequest,
) -> None:
    name = "refused-" + request.node.callspec.id
    ran = run_earm(["namespace", "import", "--as", name], target, stdin=change(exported[1]), **env)
    assert ran.returncode != 0
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("earm: "), ran.stderr
    assert all(hint in lines[0] for hint in hints), lines[0]
    assert namespace_rows(target, name) == 0


def test_an_existing_namespace_is_not_overwritten(exported: tuple[str, str]) -> None:
    source, file = exported
    before = namespace_rows(source, NAMESPACE)
    ran = run_earm(["namespace", "import"], source, stdin=file)
    assert ran.returncode != 0
    assert ran.stderr.strip().splitlines() == [
        f"earm: namespace {NAMESPACE!r} already exists here: erase it first "
        f"(DELETE /namespaces/{NAMESPACE}) or import with --as NEWNAME"
    ]
    assert namespace_rows(source, NAMESPACE) == before


def test_exporting_an_unknown_namespace_writes_nothing_and_says_so(
    exported: tuple[str, str],
) -> None:
    ran = run_earm(["namespace", "export", "nobody"], exported[0])
    assert (ran.returncode, ran.stdout) == (1, "")
    assert ran.stderr.strip().splitlines() == ["earm: namespace 'nobody' does not exist"]


def test_the_commands_pipe_through_files_as_an_operator_runs_them(
    exported: tuple[str, str], target: str, tmp_path: Path
) -> None:
    """The real command line: stdout to a file, the file on stdin; only the one-line summaries
    on stderr (no start-up logs)."""
    source, _ = exported
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")}
    file = tmp_path / "agent.jsonl"
    with file.open("w") as out:
        exporting = subprocess.run(
            [sys.executable, "-m", "service", "namespace", "export", NAMESPACE], stdout=out,
            stderr=subprocess.PIPE, text=True, timeout=60,
            env=environment | {"EARM_DATABASE_URL": source},
        )
    assert exporting.returncode == 0, exporting.stderr
    assert exporting.stderr.startswith(f"exported namespace {NAMESPACE!r}: namespace 1, memory 39")
    with file.open() as given:
        importing = subprocess.run(
            [sys.executable, "-m", "service", "namespace", "import", "--as", "piped"],
            stdin=given, capture_output=True, text=True, timeout=60,
            env=environment | {"EARM_DATABASE_URL": target},
        )
    assert importing.returncode == 0, importing.stderr
    assert importing.stdout == ""
    assert importing.stderr.startswith("imported namespace 'piped': namespace 1, memory 39")
    trailer = json.loads(file.read_text().splitlines()[-1])
    assert namespace_rows(target, "piped") == sum(trailer["records"].values())


def test_a_file_from_before_the_factor_weight_and_the_score_scales_imports_without_them(
    exported: tuple[str, str], target: str
) -> None:
    older = []
    for line in exported[1].splitlines(keepends=True):
        record = json.loads(line)
        for field in ("factor_reg", "score_scales", "scored_by", "raw_score"):
            record.pop(field, None)
        older.append(json.dumps(record) + "\n")
    ran = run_earm(["namespace", "import", "--as", "older"], target, stdin="".join(older))
    assert ran.returncode == 0, ran.stderr
    engine = create_engine(target)
    try:
        with engine.connect() as conn:
            weight, scales = conn.execute(text(
                "SELECT factor_reg, score_scales FROM namespaces WHERE name = 'older'")).one()
            sources = conn.scalar(text(
                "SELECT count(*) FROM scores WHERE namespace = 'older' AND scored_by IS NOT NULL"))
    finally:
        engine.dispose()
    assert (weight, scales, sources) == (None, {}, 0)


def with_field(file: str, kind: str, field: str, raw: str) -> tuple[str, int]:
    """The file with the first ``kind`` record's ``field`` set to ``raw`` (JSON text, written as
    it is: it may be deeper than json.dumps writes, or hold a bare NaN), and that record's line
    number."""
    lines = file.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if json.loads(line).get("kind") == kind)
    record = json.loads(lines[index]) | {field: "\x00placeholder"}
    lines[index] = json.dumps(record).replace('"\\u0000placeholder"', raw) + "\n"
    return "".join(lines), index + 1


DEEP = '{"a":' * 5000 + "1" + "}" * 5000


@pytest.mark.parametrize(
    ("kind", "field", "raw", "named", "hint"),
    [
        pytest.param("namespace", "content_weights", '"[1,2,3]"', None, "3 dimensions",
                     id="content-weights-of-another-length"),
        pytest.param("query", "slope", '"NaN"', None, "number", id="nan-slope"),
        pytest.param("namespace", "score_sum", '"NaN"', None, "number", id="nan-score-sum"),
        pytest.param("namespace", "content_slope", "Infinity", None, "infinite",
                     id="infinite-content-slope"),
        pytest.param("model_row", "factors", "[1e39, 0.5]", None, "32-bit",
                     id="factor-beyond-float32"),
        pytest.param("namespace", "factor_reg", "-1", None, "above 0",
                     id="negative-factor-weight"),
        pytest.param("namespace", "score_scales", '{"judge": [0.9, 0.1, 40]}', None,
                     "0 <= irrelevant < relevant <= 1", id="score-scale-upside-down"),
        pytest.param("namespace", "next_query_index", "0", ("query", "query_index"),
                     "next_query_index", id="next-query-index-below-the-stored-queries"),
        pytest.param("memory", "occurred_at", '"infinity"', None, "date", id="infinite-time"),
        pytest.param("memory", "created_at", '"0001-01-01T00:00:00+05:00"', None, "UTC",
                     id="year-0"),
        pytest.param("query", "created_at", '"10000-01-01T00:00:00+00:00"', None, "date",
                     id="far-future"),
        pytest.param("query", "trace_scores", "[0.5]", None, "trace_memory_ids",
                     id="trace-arrays-of-unequal-lengths"),
        pytest.param("memory", "metadata", '{"blob": "' + "x" * 2_000_000 + '"}', None,
                     "the limit is 65536", id="oversize-metadata"),
        pytest.param("memory", "text", '"' + "x" * 200_000 + '"', None, "the limit is 8000",
                     id="oversize-text"),
        pytest.param("memory", "text", '" \\u200b\\t "', None, "no visible character",
                     id="blank-text"),
        pytest.param("memory", "metadata", '{"a":' * 17 + "1" + "}" * 17, None,
                     "17 levels deep; the limit is 16", id="metadata-beyond-the-depth-limit"),
        pytest.param("memory", "metadata", DEEP, None, "5000 levels deep; the limit is 16",
                     id="metadata-5000-levels-deep"),
    ],
)
def test_import_refuses_a_field_the_live_api_or_the_model_would_not_hold(
    exported: tuple[str, str], target: str, kind: str, field: str, raw: str,
    named: tuple[str, str] | None, hint: str, request: pytest.FixtureRequest,
) -> None:
    """A file that parses but holds a value the service could not serve from (or that the live
    API refuses) is refused before it is written: exit 2, one line naming the record (its line
    and kind) and the field, and no row of the namespace."""
    file, line = with_field(exported[1], kind, field, raw)
    if named is not None:  # the refusal names a later record the value contradicts
        kind, field = named
        line = next(i for i, text in enumerate(file.splitlines(), 1)
                    if json.loads(text).get("kind") == kind)
    name = "refused-" + request.node.callspec.id
    ran = run_earm(["namespace", "import", "--as", name], target, stdin=file)
    lines = ran.stderr.strip().splitlines()
    assert (ran.returncode, len(lines)) == (2, 1), ran.stderr[-2000:]
    assert lines[0].startswith(f"earm: malformed file at line {line}, a {kind} record: {field} "), (
        lines[0]
    )
    assert hint in lines[0], lines[0]
    assert namespace_rows(target, name) == 0
