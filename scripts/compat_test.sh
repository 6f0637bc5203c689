#!/usr/bin/env bash
# The engine's lossless suite against the transformers a lent GPU machine has: transformers 5.17 with
# huggingface_hub < 2 (issue 30), on the CPU, over the project's .venv (scripts/setup.sh). The two
# packages are installed once, without dependencies, into .cache/compat-transformers-5.17 (git-ignored)
# and put ahead of .venv's own on PYTHONPATH; nothing in .venv changes. Takes a few minutes.
# Usage: bash scripts/compat_test.sh [extra pytest arguments]
# A failed download (no PyPI here) skips the run with one line and exit status 0; a failing test fails it.
set -euo pipefail
cd "$(dirname "$0")/.."

PINS=("transformers==5.17.0" "huggingface_hub==1.33.0")
SITE="$PWD/.cache/compat-transformers-5.17"   # absolute: tests launch scripts from other folders
STAMP="$SITE/.respec-pins"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "${PINS[*]}" ]; then
    rm -rf "$SITE"
    if ! nice -n 19 .venv/bin/python -m pip install --disable-pip-version-check -q --no-deps --target "$SITE" \
            "${PINS[@]}"; then
        echo "compat: could not install ${PINS[*]} (no package index?); the transformers 5.17 run is skipped" >&2
        rm -rf "$SITE"
        exit 0
    fi
    echo "${PINS[*]}" > "$STAMP"
fi

# the lossless suite, the step's transfers, tree attention and the GPU check's CPU run
PYTHONPATH="$SITE" nice -n 19 .venv/bin/python - <<'PY'
import huggingface_hub, transformers
assert transformers.__version__ == "5.17.0" and huggingface_hub.__version__.startswith("1."), \
    (transformers.__version__, huggingface_hub.__version__)
print(f"compat: transformers {transformers.__version__}, huggingface_hub {huggingface_hub.__version__}")
PY
PYTHONPATH="$SITE" exec nice -n 19 .venv/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_engine_lossless.py tests/test_transfers.py tests/test_kv_cache.py tests/test_gpu_check.py "$@"
