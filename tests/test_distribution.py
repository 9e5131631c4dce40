"""The product's distribution holds no benchmark: importing the service, its app or its command
line loads nothing of earm_bench (the earm-bench distribution in bench/), and the wheel built
from the root pyproject.toml contains none of its modules."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
import service, service.cli, service.http.app, service.testing
from service.cli.main import build_parser
build_parser(["serve"])  # what `earm serve` builds
before = sorted(name for name in sys.modules if name.partition(".")[0] == "earm_bench")
build_parser(["bench"])  # the probe's control: `earm bench` does load it
print(json.dumps({"before": before, "after": "earm_bench.cli" in sys.modules}))
"""


def test_the_service_its_app_and_earm_serve_import_no_benchmark() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"before": [], "after": True}


def test_the_root_wheel_has_its_package_data_and_no_benchmark(tmp_path: Path) -> None:
    # Built from a copy: an in-tree build would leave build/ behind, whose stale files a later
    # wheel may pick up. bench/ comes along so a too-wide package search would find it.
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("service", "bench"):
        shutil.copytree(REPO / folder, source / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "wheel"), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = (tmp_path / "wheel").glob("earm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "service/testing/__init__.py" in names
    assert "service/demo/workload.json" in names  # package data: `earm demo` runs from a wheel
    dist_info = f"earm-{importlib.metadata.version('earm')}.dist-info"
    assert {name.partition("/")[0] for name in names} == {"service", dist_info}
    assert not [name for name in names if "bench" in name]
