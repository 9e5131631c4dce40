"""How the browser tests start Debian's chromium (driven by Playwright): headless, sandbox-free
as root in a container, with nothing that reaches the network on its own."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
