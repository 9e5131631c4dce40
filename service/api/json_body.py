"""Request bodies parsed by pydantic-core's JSON parser instead of the standard library's.

FastAPI reads a JSON body with ``Request.json()`` (``json.loads``) and then validates the
Python objects. For an ingest batch of 1,000 memories of 384-d embeddings (about 4 MB of
floats), ``json.loads`` took 45–60 ms, most of the service's CPU per batch; ``from_json`` (Rust)
takes 22–30 ms for the same objects (NaN and Infinity literals included, which the checks
then reject with a clear 422). A document it refuses goes to ``json.loads``, which has the last
word: JSON that only the standard library takes (escaped lone surrogates, which the text checks
turn into a 422) keeps working, and a body neither reads raises :class:`json.JSONDecodeError`,
FastAPI's 400 ``malformed_json``, with pydantic-core's reason. (``json.loads`` refuses invalid
UTF-8, nesting past the recursion limit and integers of more than 4300 digits with other
errors, which FastAPI answers with a bare 400 ``http_error``.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute


class FastJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body)
            except ValueError as fast_error:
                try:
                    self._json = json.loads(body)
                except (ValueError, RecursionError) as exc:
                    # pydantic-core's reason, which has the line and column
                    raise json.JSONDecodeError(str(fast_error), "", 0) from exc
        return self._json


class FastJSONRoute(APIRoute):
    """Route class of the routers that take JSON bodies (FastAPI's documented way to use a
    custom ``Request``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def fast_json_handler(request: Request) -> Response:
            return await handler(FastJSONRequest(request.scope, request.receive))

        return fast_json_handler
