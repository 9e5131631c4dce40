"""Talking to the service over HTTP: its policies and its error answers."""

from __future__ import annotations

from typing import Any

import httpx

#: The service's retrieval policies (``service.retrieve.rerank.POLICIES``) in the order the
#: reports compare them: from no scorer call to a scorer call for every candidate.
POLICIES: tuple[str, ...] = ("semantic", "observed", "earm", "full")


class ServiceError(RuntimeError):
    """The service answered with an error."""


def check(response: httpx.Response) -> dict[str, Any]:
    """The JSON body of a successful response; :class:`ServiceError` with the API's error
    code and message (or the start of the body) otherwise."""
    if response.is_success:
        body: dict[str, Any] = response.json()  # the API answers with JSON objects
        return body
    try:
        error = response.json().get("error", {})
        detail = f"{error.get('code')}: {error.get('message')}"
    except (ValueError, AttributeError):
        detail = response.text[:500]
    raise ServiceError(
        f"{response.request.method} {response.request.url.path} -> "
        f"{response.status_code} {detail}"
    )


def error_code(response: httpx.Response) -> str:
    """The API's stable error ``code`` of an error response, ``"?"`` when it has none."""
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "?"
