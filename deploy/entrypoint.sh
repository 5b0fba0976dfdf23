#!/usr/bin/env bash
# The container's entrypoint (Dockerfile): build the default federation's local indexes (scripts/prepare: a qmd
# collection "docs" over the wiki, rescanned on every start, and the graphify graph of it, all under /app/.cache,
# the volume), then exec
#   gateway serve --host ${GATEWAY_HOST:-0.0.0.0} ARGS...
# so the gateway is the process that receives SIGTERM (run the container with an init: compose's `init: true`,
# `docker run --init`). A failure to index is reported and the gateway starts anyway: the backends that need an
# index show up as failed with their reason, and files_search falls back to the wiki's own search.
# GATEWAY_SKIP_PREPARE=1 skips the indexing (a federation without qmd or graphify).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$root"

if [[ ${GATEWAY_SKIP_PREPARE:-0} != 1 ]]; then
    echo "entrypoint: building the qmd index and the graph of docs/ ..." >&2
    if ! bash "$root/scripts/prepare" "$root"; then
        echo "entrypoint: WARNING: building the indexes failed (see above); serving anyway:" \
            "qmd and graphify backends will report why they fail" >&2
    fi
fi

exec gateway serve --host "${GATEWAY_HOST:-0.0.0.0}" "$@"
