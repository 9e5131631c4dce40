"""The store's operations as plans: generators of earm client calls, driven by the sync or the
async client, so each operation is written once for ``batch`` and ``abatch``."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import Result

from service.client import EarmAPIError


@dataclass(frozen=True)
class Call:
    """One call of the earm client, made by the sync or the async driver."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


#: An operation as the client calls it needs: it yields calls, receives their results (or
#: their EarmAPIError, thrown in) and returns the operation's result.
Plan = Generator[Call, Any, Result]


def drive(plan: Plan, perform: Callable[[Call], Any]) -> Result:
    """Run ``plan``, each of its calls made by ``perform`` (a sync client's method)."""
    try:
        call = next(plan)
        while True:
            try:
                outcome = perform(call)
            except EarmAPIError as error:
                call = plan.throw(error)
            else:
                call = plan.send(outcome)
    except StopIteration as done:
        result: Result = done.value  # what the plan returned (typeshed types it Any)
        return result


async def adrive(plan: Plan, perform: Callable[[Call], Any]) -> Result:
    """Run ``plan``, each of its calls awaited from ``perform`` (an async client's method)."""
    try:
        call = next(plan)
        while True:
            try:
                outcome = await perform(call)
            except EarmAPIError as error:
                call = plan.throw(error)
            else:
                call = plan.send(outcome)
    except StopIteration as done:
        result: Result = done.value
        return result
