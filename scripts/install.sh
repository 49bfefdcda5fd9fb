#!/usr/bin/env bash
# Install omniduplex on a fresh Debian machine: system packages, CPU PyTorch first (pinned), then the project.
# Usage: bash scripts/install.sh          # runtime
#        bash scripts/install.sh test     # runtime + test tools (transformers oracle, chromium, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=${1:-}
APT_PKGS="espeak-ng sox libsndfile1"
[ "$want_test" = test ] && APT_PKGS="$APT_PKGS chromium"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq $missing >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check "torch==2.13.0"
extra=""; [ "$want_test" = test ] && extra="[test]"
python3 -m pip install -q --disable-pip-version-check -c constraints.txt -e ".${extra}"
