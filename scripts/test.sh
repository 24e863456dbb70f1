#!/usr/bin/env bash
# The whole test suite, as CI runs it: install (idempotent), ruff, mypy (over the fedge.* tree that
# scripts/mypy_tree.py builds), every pytest test (the slow full-fleet one included), then the deployment checks
# (ansible-playbook --syntax-check, ansible-lint, a real playbook run into a throwaway prefix with an idempotence
# check, systemd-analyze verify; needs root, as CI is).
#
#   bash scripts/test.sh            # arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --dev
.venv/bin/ruff check .
.venv/bin/python scripts/mypy_tree.py
.venv/bin/python -m pytest "$@"
bash deploy/ci-check.sh
