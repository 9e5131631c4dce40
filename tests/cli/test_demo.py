"""`earm demo` as a user runs it: the service and the simulated scorer start, the replay prints a
line per phase and a summary that says the scores are simulated, and `--exit` stops it all."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from service.cli.main import build_parser
from service.testing import free_port


@pytest.mark.processes
def test_demo_replays_prints_its_summary_and_exits(clean_database: str) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EARM_")} | {
        "EARM_DATABASE_URL": clean_database,
    }
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "service", "demo", "--questions", "8", "--exit",
         "--port", str(port)],
        env=environment, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "scorer: SIMULATED, no model is called" in out
    assert "asking 8 questions, then each again" in out
    assert re.search(r"new +stage 0 · questions 1–5", out), out
    assert re.search(r"asked again stage \d · questions 9–", out), out
    assert "Summary of 16 retrieves" in out and "saved" in out
    assert f"dashboard: http://127.0.0.1:{port}/dashboard/namespaces/demo-simulated-scorer" in out
    assert '"HTTP Request' not in done.stderr  # the replay's own requests are not logged


@pytest.mark.processes
def test_demo_help_says_the_scorer_is_simulated_and_how_long_it_takes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service", "demo", "--help"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "SIMULATED scorer" in text and "not a model" in text
    assert "About a minute" in text and "--exit" in text


@pytest.mark.parametrize("count", ["0", "-3", "many"])
def test_demo_refuses_a_question_count_that_is_not_a_positive_number(
    count: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser(["demo"]).parse_args(["demo", "--questions", count])
    assert "is not a positive whole number" in capsys.readouterr().err
