#!/usr/bin/env bash
# Run the test suite: set up (idempotent, see scripts/setup.sh), then pytest over tests/.
# Usage: bash scripts/test.sh [extra pytest arguments, e.g. -k loading -x]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# ---- BROWSER TESTS SETUP (reserved) --------------------------------------------------------------
# The chromium install for the browser (UI) tests goes here, idempotent like setup.sh.
# ---- END BROWSER TESTS SETUP ---------------------------------------------------------------------

exec .venv/bin/python -m pytest -q tests "$@"
