#!/usr/bin/env bash
# Idempotent setup of a local virtual environment in .venv.
#
#   bash scripts/setup.sh [EXTRAS]      EXTRAS defaults to "knapformer,splatpainter,web,dev"
#
# torch is installed first: torch==2.13.0 (the CPU build) unless .venv already
# holds a torch (e.g. a CUDA build you installed yourself), which is then kept.
# Every later install runs under a constraints file pinning that torch, so no
# dependency can swap it for a multi-GB CUDA download.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-knapformer,splatpainter,web,dev}"
PY="${PYTHON:-python3}"
VENV=.venv
TORCH_DEFAULT="2.13.0"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

torch_version() { "$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true; }
TV="$(torch_version)"
if [ -z "$TV" ]; then
    echo "[setup] installing torch==$TORCH_DEFAULT (CPU build) and numpy"
    "$VPY" -m pip install --quiet "torch==$TORCH_DEFAULT" "numpy>=1.26"
    TV="$(torch_version)"
fi

mkdir -p "$VENV/etc"
CONSTRAINTS="$VENV/etc/constraints.txt"
{ cat constraints/cpu.txt | grep -v '^torch=='; echo "torch==$TV"; } > "$CONSTRAINTS.tmp"
mv "$CONSTRAINTS.tmp" "$CONSTRAINTS"

# npm packages from a pinned lockfile DIR/package-lock.json into DIR/node_modules (npm ci, no
# install scripts), skipped when the lockfile has not changed since the last install (stamp).
#   npm_install DIR WHAT WITHOUT   (WITHOUT: what happens when node/npm are missing)
npm_install() {
    local dir="$1" what="$2" without="$3"
    local stamp="$dir/node_modules/.splatpainter-npm-stamp"
    local want
    want="$(sha256sum "$dir/package-lock.json" | cut -c1-16)"
    if [ -f "$stamp" ] && grep -qxF "$want" "$stamp"; then
        echo "[setup] $what up to date ($dir/node_modules)"
    elif ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "[setup] NOTE: node and npm are not installed, so $what is not either; $without." \
            "Install node >= 18 with npm and rerun this."
    else
        echo "[setup] installing $what (npm ci, $dir/package-lock.json)"
        (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
        echo "$want" > "$stamp"
    fi
}

# The browser editor's WebGL viewport library (the PlayCanvas engine), which `splatpainter
# serve` serves locally. Without node/npm the editor falls back to server-rendered frames.
npm_install src/splatpainter/web "the browser editor's WebGL viewport library" \
    "\`splatpainter serve\` then shows server-rendered frames, and the browser tests of the viewport skip"
# With the tests: the reference tool the format tests run (@playcanvas/splat-transform; it
# asks for node >= 22 and runs the tests' conversions on node 20).
case ",$EXTRAS," in
*,dev,*)
    npm_install tests/tools "the format tests' reference tool (splat-transform)" \
        "the test that runs it skips"
    ;;
esac

# Skip the (slow) pip resolve when nothing that drives it has changed.
STAMP="$VENV/.setup-stamp"
WANT="$(cat pyproject.toml constraints/cpu.txt "$CONSTRAINTS" | sha256sum | cut -c1-16) $EXTRAS"
if [ -f "$STAMP" ] && grep -qxF "$WANT" "$STAMP"; then
    echo "[setup] $VENV up to date (torch $TV, extras: $EXTRAS)"
    exit 0
fi
echo "[setup] installing the project (extras: $EXTRAS) with torch pinned to $TV"
PIP_CONSTRAINT="$CONSTRAINTS" "$VPY" -m pip install --quiet -c "$CONSTRAINTS" -e ".[$EXTRAS]"
"$VPY" - <<'PY'
import importlib.metadata as m
import numpy, torch  # noqa: F401  (fail loudly here, not in the first test)
print(f"[setup] ok: torch {torch.__version__}, numpy {numpy.__version__}")
PY
echo "$WANT" >> "$STAMP"
