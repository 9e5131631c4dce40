"""The body of every error answer: ``{"error": {"code": ..., "message": ...}}``, the code stable
(docs/api.md "Errors"), the message for people."""

from __future__ import annotations

from pydantic import BaseModel


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody
