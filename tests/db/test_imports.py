"""The database package imports in any order: ``earm serve``'s first import of it is the
engine's (through the HTTP server), while the tests' is usually the migrations'."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["service.db.engine", "service.http.server"])
def test_a_fresh_interpreter_imports_the_engine_first_without_a_cycle(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
