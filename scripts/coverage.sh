#!/usr/bin/env bash
# The product's line coverage under the whole test suite, as scripts/test.sh runs it (every core, tmpfs), with
# every Python process the tests start measured too: coordinators, agents, CLI commands, pool workers
# ([tool.coverage.run] in pyproject.toml: parallel data files, subprocesses patched). A process killed with SIGKILL
# writes no data; the tests that do so count only their own process's lines.
#
#   bash scripts/coverage.sh                  # the whole suite; prints the per-module table and the total
#   bash scripts/coverage.sh tests/test_x.py  # arguments go to pytest
#
# Data and the table go to build/coverage/ (report.txt, the TOTAL line last). Assumes scripts/install.sh --dev ran.
set -uo pipefail
cd "$(dirname "$0")/.."
out="$PWD/build/coverage"
rm -rf "$out" && mkdir -p "$out"
basetemp=()
[[ -d /dev/shm && -w /dev/shm ]] && basetemp=(--basetemp "/dev/shm/fedge-coverage-$(id -u)")
COVERAGE_FILE="$out/.coverage" .venv/bin/python -m coverage run -m pytest -n "${FEDGE_TEST_WORKERS:-$(($(nproc) + 1))}" \
  --dist loadscope --no-loadscope-reorder "${basetemp[@]}" "$@"
status=$?
COVERAGE_FILE="$out/.coverage" .venv/bin/python -m coverage combine -q "$out"
COVERAGE_FILE="$out/.coverage" .venv/bin/python -m coverage report > "$out/report.txt"
tail -n 1 "$out/report.txt"
exit $status
