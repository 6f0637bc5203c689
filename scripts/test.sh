#!/usr/bin/env bash
# Run the test suite: set up (idempotent, see scripts/setup.sh), then pytest over tests/.
# Usage: bash scripts/test.sh [extra pytest arguments, e.g. -k loading -x]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# ---- BROWSER TESTS SETUP (reserved) --------------------------------------------------------------
# The chromium install for the browser (UI) tests goes here, idempotent like setup.sh.
# tests/test_app_browser.py drives Debian's chromium through playwright-python (installed from
# requirements.txt); never `playwright install` (it downloads from a CDN). Without root or apt the
# browser tests skip themselves.
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test: installing chromium with apt-get (browser tests)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
    else
        echo "test: /usr/bin/chromium is missing and cannot be installed here; browser tests will be skipped" >&2
    fi
fi
# ---- END BROWSER TESTS SETUP ---------------------------------------------------------------------

exec .venv/bin/python -m pytest -q tests "$@"
