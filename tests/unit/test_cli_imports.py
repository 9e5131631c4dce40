"""The `earm` command line is parsed before anything heavy loads: `earm --help` and a settings
error answered after a second of imports (the database layer, the web framework, the scorers'
HTTP client), which every command's parser pulled in."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("sqlalchemy", "alembic", "fastapi", "starlette", "aiohttp", "uvicorn")


def test_parsing_a_builtin_command_line_loads_no_database_web_or_http_client_library() -> None:
    probe = (
        "import sys\n"
        "from service.cli.main import build_parser\n"
        "for argv in (['keys', 'list'], ['namespace', 'export', 'a'], ['mcp'], ['demo'],"
        " ['migrate'], ['serve']):\n"
        "    build_parser(argv).parse_args(argv)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
    assert loaded == "[]"
