#!/usr/bin/env bash
# Run the test suite: set up (idempotent, see scripts/setup.sh), install the test tools (requirements-dev.txt,
# idempotent the same way), then pytest over tests/, then the engine's lossless suite under transformers 5.17
# (scripts/compat_test.sh).
# Usage: bash scripts/test.sh [extra pytest arguments, e.g. -k loading -x]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# the test tools (requirements-dev.txt: pytest, hypothesis, playwright, httpx), skipped while the stamp matches
DEV_STAMP=".venv/.respec-requirements-dev.sha256"
want="$( { cat requirements.txt requirements-dev.txt; .venv/bin/python -V 2>&1; } | sha256sum | cut -d' ' -f1)"
installed='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))'
if [ "$want" = "$(cat "$DEV_STAMP" 2>/dev/null || true)" ] && .venv/bin/python -c "$installed" pytest hypothesis playwright httpx xdist; then
    echo "test: dev requirements up to date"
else
    echo "test: installing requirements-dev.txt into .venv"
    .venv/bin/python -m pip install --disable-pip-version-check -q -r requirements-dev.txt
    echo "$want" > "$DEV_STAMP"
fi

# ---- BROWSER TESTS SETUP (reserved) --------------------------------------------------------------
# The chromium install for the browser (UI) tests goes here, idempotent like setup.sh.
# tests/test_app_browser.py drives Debian's chromium through playwright-python (installed from
# requirements-dev.txt); never `playwright install` (it downloads from a CDN). Without root or apt the
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

# One pytest-xdist worker per core (`nproc`: the cores this process may use), each worker's torch on
# its share of them (tests/conftest.py); the tests that share the session's compiled tiny Llama are one
# xdist group, run by one worker (`--dist loadgroup`). --durations=20: the 20 slowest tests at the end,
# so the next person sees where the time goes.
.venv/bin/python -m pytest -q --durations=20 -n "$(nproc)" --dist loadgroup tests "$@"

# The lossless suite again against the transformers a lent GPU machine has (5.17, huggingface_hub < 2),
# a few minutes; only for the whole suite (extra pytest arguments run what they name, nothing more).
if [ $# -eq 0 ]; then
    bash scripts/compat_test.sh
fi
