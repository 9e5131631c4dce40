"""The README's five-minute tour runs as written, step by step in one shell, against a live
service on a new database, and each step prints what the README shows after it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
STEP = re.compile(r"<!-- tour: (?P<name>[\w-]+) -->\s*```bash\n(?P<code>.*?)```", re.S)
STEPS = ["ingest", "retrieve", "feedback", "trace", "learn", "erase"]
#: The README's address of the service; the test points each step at its own.
README_ADDRESS = "localhost:8000"
#: Printed between steps, so the output can be split by step.
MARK = "=== tour step: "
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
#: Scores may differ in their last digits between platforms; ids and counts may not.
SCORE_TOLERANCE = 0.02


def tour() -> list[tuple[str, str]]:
    return [(m["name"], m["code"]) for m in STEP.finditer(README.read_text())]


def shown(code: str) -> list[str]:
    """The output the README shows in a step: `# → ` lines and their `#   ` continuations."""
    lines = []
    for line in code.splitlines():
        comment = line.strip()
        if comment.startswith("# → "):
            lines.append(comment.removeprefix("# → "))
        elif comment.startswith("#   ") and lines:
            lines.append(comment.removeprefix("#   "))
    return lines


def same_line(printed: str, expected: str) -> bool:
    """Equal text and integers; floats within SCORE_TOLERANCE."""
    if NUMBER.split(printed) != NUMBER.split(expected):
        return False
    numbers = zip(NUMBER.findall(printed), NUMBER.findall(expected), strict=True)
    return all(
        abs(float(got) - float(want)) <= SCORE_TOLERANCE if "." in want else got == want
        for got, want in numbers
    )


def run_tour(url: str) -> dict[str, list[str]]:
    """Every step in one bash (its variables carry over), curl failing on any HTTP error."""
    address = urlsplit(url).netloc
    script = ["set -euo pipefail", 'curl() { command curl --fail-with-body "$@"; }']
    for name, code in tour():
        assert README_ADDRESS in code, f"step {name} does not talk to {README_ADDRESS}"
        script += [code.replace(README_ADDRESS, address), f"printf '\\n{MARK}{name}\\n'"]
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outputs: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in result.stdout.splitlines():
        if line.startswith(MARK):
            outputs[line.removeprefix(MARK)], lines = lines, []
        elif line.strip():
            lines.append(line.strip())
    return outputs


def test_the_tour_has_its_steps_in_order() -> None:
    assert [name for name, _ in tour()] == STEPS
    assert all(shown(code) for _, code in tour()), "every step shows what it answers"


@pytest.mark.skipif(shutil.which("curl") is None, reason="the tour uses curl")
def test_the_tour_runs_and_answers_what_the_readme_shows(keyless_service: str) -> None:
    outputs = run_tour(keyless_service)
    for name, code in tour():
        printed, expected = outputs[name], shown(code)
        assert len(printed) == len(expected), (name, printed, expected)
        for got, want in zip(printed, expected, strict=True):
            assert same_line(got, want), f"step {name} printed {got!r}, the README shows {want!r}"
