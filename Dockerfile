# syntax=docker/dockerfile:1
# The gateway with the default federation (wiki, qmd, graphify, memory), installed by scripts/install exactly as on a
# developer machine: the project venv in /app/.venv, Node 22 and the npm/PyPI servers and tools in /app/.tools.
#
#   docker build -t mcp-gateway .
#   docker run --init -p 127.0.0.1:8080:8080 -e GATEWAY_TOKENS=alice=$(openssl rand -hex 24) mcp-gateway
#
# compose.yaml runs it with its config, wiki and ledger on volumes; docs/deployment.md explains every choice, and
# what of this file was and was not exercised where it was written (no Docker engine there).

ARG PYTHON_IMAGE=python:3.11-slim

# ------------------------------------------------------------------------------------------------------ build
FROM ${PYTHON_IMAGE} AS build

# scripts/install bootstraps Node 22 from the npm registry with any system npm (Node >= 18): Debian's is enough.
# Only this stage has it; the runtime stage runs everything on the Node 22 that lands in /app/.tools. Not pinned
# (hadolint DL3008): it is a bootstrap only, the Node that runs is pinned by tools/node22's lock.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --gid 10001 gateway \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin gateway \
    && install -d -o gateway -g gateway /app
WORKDIR /app
USER 10001:10001
ENV GATEWAY_SKIP_CHROMIUM=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    npm_config_cache=/tmp/npm-cache \
    npm_config_update_notifier=false

# The install's inputs first, so that a code change does not redo the slow part (Node, npm packages, tool venvs).
# The editable install only needs the package folder to exist; the real code is copied over it below.
COPY --chown=gateway:gateway pyproject.toml README.md ./
COPY --chown=gateway:gateway scripts/ scripts/
COPY --chown=gateway:gateway tools/ tools/
RUN mkdir gateway \
    && touch gateway/__init__.py \
    && bash scripts/install \
    && rm -rf /tmp/npm-cache .tools/logs

COPY --chown=gateway:gateway . .
RUN mkdir -p .cache \
    && .venv/bin/gateway --version

# ---------------------------------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}

RUN groupadd --gid 10001 gateway \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin gateway
# The same path as in the build stage: the venv's scripts and the launchers point at /app.
COPY --from=build --chown=10001:10001 /app /app
WORKDIR /app
USER 10001:10001

# PATH: the launchers (qmd, graphify, mcp-server-memory, node, npx) and the gateway itself. qmd keeps its index and
# collections under .cache, as scripts/serve arranges, so one volume holds every piece of state.
ENV PATH=/app/.tools/bin:/app/.venv/bin:$PATH \
    XDG_CACHE_HOME=/app/.cache \
    XDG_CONFIG_HOME=/app/.cache/config \
    PYTHONUNBUFFERED=1

# The audit ledger (.cache/audit.db), qmd's index, the knowledge graph and the memory file.
VOLUME ["/app/.cache"]
EXPOSE 8080

# /healthz answers 200 while the gateway serves, "degraded" included (a failing backend is reported, not fatal).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]

# Builds the default federation's indexes (qmd, graphify) as scripts/serve does, then execs
# `gateway serve --host 0.0.0.0 ARGS...` (non-loopback: it refuses to start without GATEWAY_TOKENS).
ENTRYPOINT ["/app/deploy/entrypoint.sh"]
CMD []
