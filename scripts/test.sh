#!/usr/bin/env bash
# Set up .venv (idempotent), lint, then run the whole test suite.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k planner
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenMP threads (torch and numba) must sleep, not spin, while waiting: spinning threads of
# parallel test workers starve each other on a 2-core machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
bash scripts/setup.sh "knapformer,splatpainter,web,dev"
# The browser tests drive Debian's chromium (never a Playwright browser download): install it
# when missing and apt is there; otherwise those tests skip and say why.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; fi
    echo "[test] installing chromium (apt) for the browser tests"
    { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq chromium >/dev/null; } \
        || echo "[test] could not install chromium; browser tests will skip"
fi
V=.venv/bin
echo "[test] ruff"
"$V/ruff" check src tests benchmarks
"$V/ruff" format --check src tests benchmarks
echo "[test] pytest"
# One run over the whole suite on 2 workers; slow tests are marked (`-m "not slow"` skips them
# locally) but always run here, so CI tests exactly what a user runs.
"$V/python" -m pytest -n 2 "$@"
