"""/docs and /redoc load every asset from earm itself (an offline machine gets working docs)."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

#: src/href attributes, and the url of a Swagger UI / ReDoc bundle in inline script.
ASSET_RE = re.compile(r"""(?:src|href)=["']([^"']+)["']|url:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_reference_only_assets_earm_serves(client: TestClient, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    html = response.text
    assert "cdn." not in html and "fonts.googleapis" not in html
    assets = [a or b for a, b in ASSET_RE.findall(html)]
    assert len(assets) >= 2, html
    for asset in assets:
        assert asset.startswith("/") and not asset.startswith("//"), asset
        assert client.get(asset).status_code == 200, asset


def test_swagger_ui_does_not_ask_the_online_validator(client: TestClient) -> None:
    assert '"validatorUrl": null' in client.get("/docs").text
