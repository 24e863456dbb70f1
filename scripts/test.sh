#!/usr/bin/env bash
# The whole test suite, as CI runs it: install (idempotent), ruff, mypy (over the fedge.* tree that
# scripts/mypy_tree.py builds), every pytest test (the slow full-fleet one included), then the deployment checks
# (ansible-playbook --syntax-check, ansible-lint, a real playbook run into a throwaway prefix with an idempotence
# check, systemd-analyze verify; needs root, as CI is).
#
#   bash scripts/test.sh            # arguments go to pytest
#   FEDGE_TEST_WORKERS=0 bash scripts/test.sh tests/test_config.py   # one pytest process (default: one per core)
#
# pytest runs on every core (pytest-xdist; a module's tests on one worker, so that its module-scoped runs are
# played once) with its temporary directories on tmpfs (/dev/shm) where the machine has one: the sessions the
# tests play write and fsync run directories, which costs real time on a disk and nothing on tmpfs. A failed test's
# directory is kept there until the next run; a passed test's is removed at once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
.venv/bin/ruff check .
.venv/bin/python scripts/mypy_tree.py
.venv/bin/python scripts/mypy_tree.py --check-resolution  # mypy resolves fedge.* and refuses what is not there
basetemp=()
[[ -d /dev/shm && -w /dev/shm ]] && basetemp=(--basetemp "/dev/shm/fedge-tests-$(id -u)")
.venv/bin/python -m pytest -n "${FEDGE_TEST_WORKERS:-auto}" --dist loadscope "${basetemp[@]}" "$@"
bash deploy/ci-check.sh
