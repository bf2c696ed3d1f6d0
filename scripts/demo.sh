#!/usr/bin/env bash
# make demo: start a local Prefect server (background, reused if up), run specs/adult.yaml, print the folder and UI.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PRAM_UI_PORT:-4200}"
BIN=.venv/bin
# exported first: the server and the run share the Prefect home and API
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
export PREFECT_HOME="$PWD/.prefect-home"
# the demo's population (adult-1994) is registered in this checkout, not machine-wide: a second clone or a
# moved checkout has its own demo ledger (the rule "one population, one ledger" stays for real populations)
export PRAM_RELEASE_HOME="$PWD/.pram-release-home"
$BIN/pram-release ui --port "$PORT"
# the run summary's folder link: release folders served read-only on 127.0.0.1 by `ui` (a browser opens http, not file://)
export PRAM_RELEASES_URL="http://127.0.0.1:$((PORT + 1))/" PRAM_RELEASES_ROOT="$PWD/releases"
$BIN/pram-release run specs/adult.yaml
echo "Prefect UI: http://127.0.0.1:${PORT}  (flow runs, report/table/link artifacts)"
echo "stop the server with: $BIN/pram-release ui --stop"
