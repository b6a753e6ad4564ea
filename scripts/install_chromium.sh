#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for the report browser test
# (tests/integration/test_report_browser.py). Idempotent: does nothing when
# /usr/bin/chromium already exists. Needs root (or sudo) for apt-get.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "error: installing chromium needs root; re-run this script as root" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium
/usr/bin/chromium --version
