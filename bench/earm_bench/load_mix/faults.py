"""The faults ``earm bench load-mix`` injects, on a fixed schedule over its ``--seconds``:

- **stalling scorer**: the in-process service is scored by a loopback chat-completions judge
  (in a child process) that answers at once, except from 20 % to 45 % of the run, when it
  answers after three times the service's scorer timeout; then it recovers;
- **deletes**: every fifth client (0, 5, 10, …) deletes one of the memories each of its
  retrieves just returned, while the other clients retrieve (and their retrieves refit);
- **kill Postgres**: at 60 % of the run the embedded postmaster (the first line of
  ``<data_dir>/postmaster.pid``) and its backends are SIGKILLed, once. The service's own
  supervisor (``service.db.engine.supervised``) must bring it back: a service that is not ready
  again ``recovery_grace_s`` after the load fails the run.

A 503 that ends after the kill and a 404 of a delete or of feedback on a deleted memory are
expected (reported by status, not failures); any other error, a 500 above all, fails the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from earm_bench.load_mix.config import Faults
from service.testing import wait_ready

#: Fractions of the run: the judge's stall, and the kill.
STALL_WINDOW = (0.20, 0.45)
KILL_AT = 0.60
#: A stalled judge answers after this many scorer timeouts.
STALL_FACTOR = 3.0
DELETER_EVERY = 5

Clock = Callable[[], float]


class StallingJudge:
    """A chat-completions judge's replies: a score derived from the prompt at once, or, while
    ``stalled``, after ``stall_s``. It is served by a child process of its own (so that the
    bench's clients and the in-process service do not slow it down), hence the flag and the
    counters in shared memory: the bench flips ``stalled``."""

    def __init__(self, stall_s: float) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self.stall_s = stall_s
        self._stalled = context.Value("b", 0)
        self._calls = context.Value("q", 0)
        self._stalled_calls = context.Value("q", 0)

    @property
    def stalled(self) -> bool:
        return bool(self._stalled.value)

    @stalled.setter
    def stalled(self, value: bool) -> None:
        self._stalled.value = int(value)

    @property
    def calls(self) -> int:
        return int(self._calls.value)

    @property
    def stalled_calls(self) -> int:
        return int(self._stalled_calls.value)

    async def reply(self, prompt: str) -> str:
        stalled = self.stalled
        with self._calls.get_lock():
            self._calls.value += 1
        if stalled:
            with self._stalled_calls.get_lock():
                self._stalled_calls.value += 1
            await asyncio.sleep(self.stall_s)
        digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
        return f"{int.from_bytes(digest, 'big') / 2**64:.3f}"


def kill_postmaster(data_dir: Path) -> tuple[int, int]:
    """SIGKILL the postmaster of ``data_dir`` and its backends, as an OOM kill or a crashed
    container would; its pid and how many processes were killed."""
    import psutil

    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    postmaster = psutil.Process(pid)
    victims = [postmaster, *postmaster.children(recursive=True)]
    for process in victims:
        with suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(victims, timeout=10)
    return pid, len(victims)


@dataclass
class Timeline:
    """When the faults happened, in seconds since the load started."""

    stall_window: tuple[float, float] | None = None
    killed_at: float | None = None
    postmaster_pid: int | None = None
    processes_killed: int = 0
    postgres_back: dict[str, Any] | None = None


class FaultInjector:
    def __init__(self, faults: Faults, seconds: float, judge: StallingJudge | None = None,
                 data_dir: Path | None = None) -> None:
        self.faults = faults
        self.seconds = seconds
        self.judge = judge
        self.data_dir = data_dir
        self.timeline = Timeline()

    def is_deleter(self, client: int) -> bool:
        return self.faults.deletes and client % DELETER_EVERY == 0

    def expected(self, op: str, status: int, ended: float) -> bool:
        """Whether an injected fault explains an error answer."""
        killed_at = self.timeline.killed_at
        if status == 503 and killed_at is not None and ended >= killed_at:
            return True
        return status == 404 and self.faults.deletes and op in ("delete", "feedback")

    async def inject(self, clock: Clock) -> None:
        """Inject the faults at their time; returns when the last one is done."""
        await asyncio.gather(self._stall(clock), self._kill(clock))

    async def _stall(self, clock: Clock) -> None:
        if self.judge is None:
            return
        start, end = (fraction * self.seconds for fraction in STALL_WINDOW)
        await asyncio.sleep(max(0.0, start - clock()))
        self.judge.stalled = True
        began = clock()
        await asyncio.sleep(max(0.0, end - clock()))
        self.judge.stalled = False
        self.timeline.stall_window = (round(began, 2), round(clock(), 2))

    async def _kill(self, clock: Clock) -> None:
        if self.data_dir is None:
            return
        await asyncio.sleep(max(0.0, KILL_AT * self.seconds - clock()))
        self.timeline.killed_at = clock()
        pid, killed = await asyncio.to_thread(kill_postmaster, self.data_dir)
        self.timeline.postmaster_pid, self.timeline.processes_killed = pid, killed

    def wait_for_postgres(self, service_url: str) -> None:
        """After the load: wait until the service's supervisor has restarted the killed
        Postgres and the service is ready again; not within ``recovery_grace_s`` fails the run
        (the bench never restarts it itself: that would hide a supervisor that does not)."""
        if self.timeline.killed_at is None or self.data_dir is None:
            return
        began = time.monotonic()
        if not wait_ready(service_url, self.faults.recovery_grace_s):
            raise RuntimeError(
                f"the service is not ready {self.faults.recovery_grace_s:g} s after the load: "
                "its embedded Postgres was not restarted"
            )
        self.timeline.postgres_back = {
            "by": "service", "after_load_s": round(time.monotonic() - began, 2)
        }
