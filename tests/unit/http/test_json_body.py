"""service.http.middleware: request bodies parsed by pydantic-core, with json.loads's semantics."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from service.http.middleware import FastJSONRequest


def parse(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    request = FastJSONRequest({"type": "http", "method": "POST", "headers": []}, receive)
    return asyncio.run(request.json())


def test_a_typical_body_parses_to_what_json_loads_gives() -> None:
    body = json.dumps(
        {"namespace": "a", "memories": [{"text": "é ✓", "embedding": [0.1, -2.5e-7, 3], "n": None}]}
    ).encode()
    assert parse(body) == json.loads(body)


def test_non_finite_literals_parse_as_json_loads_does_so_the_checks_can_reject_them() -> None:
    parsed = parse(b'{"v": [NaN, Infinity, -Infinity]}')
    assert math.isnan(parsed["v"][0]) and parsed["v"][1:] == [math.inf, -math.inf]


def test_json_only_the_standard_library_accepts_falls_back_to_it() -> None:
    assert parse(b'{"text": "\\ud800"}') == {"text": "\ud800"}


def test_malformed_json_raises_json_decode_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        parse(b'{"namespace": "a", "memories": [')


@pytest.mark.parametrize(
    "body",
    [b'{"text": "\xc3\x28"}', b"[" * 100_000 + b"]" * 100_000, b'{"n": 1' + b"0" * 5000 + b"}"],
    ids=["invalid-utf8", "100k-deep-arrays", "5000-digit-number"],
)
def test_json_neither_parser_can_read_raises_json_decode_error(body: bytes) -> None:
    # json.loads refuses these with UnicodeDecodeError, RecursionError or ValueError, which
    # FastAPI would answer as a generic 400 `http_error` instead of `malformed_json`.
    with pytest.raises(json.JSONDecodeError):
        parse(body)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_a_body_in_another_unicode_encoding_raises_json_decode_error(encoding: str) -> None:
    # json.loads reads bytes in any of these (it guesses the encoding from the first bytes).
    # ASCII in UTF-16-LE without a byte order mark is valid UTF-8 (NULs), just not JSON.
    with pytest.raises(json.JSONDecodeError):
        parse('{"namespace": "a"}'.encode(encoding))


def test_a_utf8_byte_order_mark_is_ignored() -> None:
    assert parse('{"text": "é"}'.encode("utf-8-sig")) == {"text": "é"}
