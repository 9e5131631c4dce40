"""Helpers for an ``earm`` process that a test or a benchmark starts: a port for it, whether it
is ready, and stopping it as an operator would."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import httpx


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (for a process that binds it itself)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> bool:
    """Whether the service at ``url`` answers ``/readyz`` with 200 within ``timeout_s`` (its
    database reachable, its schema current); False at once when ``process`` exits."""
    deadline = time.monotonic() + timeout_s
    while process is None or process.poll() is None:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return False


def interrupt(process: subprocess.Popen[bytes]) -> None:
    """Stop a service process as Ctrl-C would (its shutdown runs), killing it after 30 s."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
