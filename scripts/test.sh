#!/usr/bin/env bash
# The whole test suite, as CI runs it: install (idempotent), ruff, mypy (over the fedge.* tree that
# scripts/mypy_tree.py builds), every pytest test (the slow full-fleet one included), then the deployment checks
# (ansible-playbook --syntax-check, ansible-lint, a real playbook run into a throwaway prefix with an idempotence
# check, systemd-analyze verify; needs root, as CI is).
#
#   bash scripts/test.sh            # arguments go to pytest
#   FEDGE_TEST_WORKERS=0 bash scripts/test.sh tests/test_config.py   # one pytest process (default: cores + 1)
#
# pytest runs one worker more than the machine has cores (pytest-xdist; a module's tests on one worker, so that its
# module-scoped runs are played once; many tests wait on paced agents and timeouts, which leaves a core idle a fifth
# of the time with one worker per core: docs/testing.md has the figures) with its temporary directories on tmpfs (/dev/shm) where the machine has one: the sessions the
# tests play write and fsync run directories, which costs real time on a disk and nothing on tmpfs. A failed test's
# directory is kept there until the next run; a passed test's is removed at once.
#
# The deployment checks need nothing of the rest (their own tools, a wheel built from the tree): they start first,
# in the background, beside the install, ruff and mypy (which keep one core busy), their output in a log printed
# when pytest is done; the script fails if either fails.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy_log=$(mktemp -t fedge-deploy-check.XXXXXX)
bash deploy/ci-check.sh >"$deploy_log" 2>&1 &
deploy=$!
trap 'kill "$deploy" 2>/dev/null || true' EXIT
bash scripts/install.sh --dev
.venv/bin/ruff check .
.venv/bin/python scripts/mypy_tree.py
.venv/bin/python scripts/mypy_tree.py --check-resolution  # mypy resolves fedge.* and refuses what is not there
basetemp=()
[[ -d /dev/shm && -w /dev/shm ]] && basetemp=(--basetemp "/dev/shm/fedge-tests-$(id -u)")
tests=0
.venv/bin/python -m pytest -n "${FEDGE_TEST_WORKERS:-$(($(nproc) + 1))}" --dist loadscope --no-loadscope-reorder "${basetemp[@]}" "$@" || tests=$?
deployed=0
wait "$deploy" || deployed=$?
trap - EXIT
cat "$deploy_log"
rm -f "$deploy_log"
(( deployed == 0 )) || echo "the deployment checks failed (exit $deployed)" >&2
(( tests == 0 && deployed == 0 ))
