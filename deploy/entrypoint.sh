#!/usr/bin/env bash
# The container's entrypoint (Dockerfile): build the default federation's local indexes, then exec
#   gateway serve --host ${GATEWAY_HOST:-0.0.0.0} ARGS...
# so the gateway is the process that receives SIGTERM (run the container with an init: compose's `init: true`,
# `docker run --init`). The indexes are what scripts/serve's prepare_default_federation builds, under
# XDG_CACHE_HOME (the /app/.cache volume): a qmd collection "docs" over the wiki, rescanned on every start, and
# the graphify graph of it. Keep the two in step. A failure here is reported and the gateway starts anyway: the
# backends that need an index show up as failed with their reason, and files_search falls back to the wiki's own
# search. GATEWAY_SKIP_PREPARE=1 skips this step (a federation without qmd or graphify); GATEWAY_DOCS names
# another wiki folder (default: the docs/ beside this script's folder).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$root"

export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$root/.cache}"
export XDG_CONFIG_HOME="${XDG_CONFIG_HOME:-$XDG_CACHE_HOME/config}"
mkdir -p "$XDG_CACHE_HOME" "$XDG_CONFIG_HOME"

prepare() {
    local docs="${GATEWAY_DOCS:-$root/docs}" current
    [[ -d $docs ]] || return 0
    current=$(qmd collection show docs 2>/dev/null | sed -n 's/^ *Path: *//p' || true)
    if [[ -n $current && $current != "$docs" ]]; then
        qmd collection remove docs >&2
        current=''
    fi
    if [[ -z $current ]]; then
        qmd collection add "$docs" --name docs >&2
    fi
    qmd update >&2
    mkdir -p "$XDG_CACHE_HOME/graphify/docs"
    GRAPHIFY_OUT="$XDG_CACHE_HOME/graphify/docs" graphify update "$docs" >&2
}

if [[ ${GATEWAY_SKIP_PREPARE:-0} != 1 ]]; then
    echo "entrypoint: building the qmd index and the graph of ${GATEWAY_DOCS:-docs/} ..." >&2
    if ! (prepare); then
        echo "entrypoint: WARNING: building the indexes failed (see above); serving anyway:" \
            "qmd and graphify backends will report why they fail" >&2
    fi
fi

exec gateway serve --host "${GATEWAY_HOST:-0.0.0.0}" "$@"
