#!/usr/bin/env bash
# Strict type check of the typed contract (CI runs it): the stage messages and their kinds, the stage
# contract, the orchestrator's events and the conversation core (app/core). The repository root is the
# `omniduplex` package, so mypy is pointed at a folder holding a link of that name to the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
ln -s "$PWD" "$root/omniduplex"
MYPYPATH="$root" python3 -m mypy \
  -m omniduplex.pipeline.messages -m omniduplex.pipeline.events \
  -m omniduplex.pipeline.stages.kinds -m omniduplex.pipeline.stages.contract \
  -p omniduplex.app.core "$@"
