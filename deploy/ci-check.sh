#!/usr/bin/env bash
# Checks the field deployment on this machine, as root, in a few minutes:
#
#   bash deploy/ci-check.sh
#
#  1. the plain units in deploy/systemd/ match the role templates (deploy/systemd/render.py --check);
#  2. ansible-playbook --syntax-check and ansible-lint (profile production, offline), with the versions pinned in
#     deploy/ci-requirements.txt, installed into a virtual environment of this script's own;
#  3. a real run of deploy/ansible/site.yml against this machine (a coordinator and an agent, connection local)
#     with every path under a throwaway root (deploy/ansible/ci/vars.yml) and a Fedge wheel built from the
#     checkout; torch comes from constraints/cpu-x86_64.txt through pip's configured index;
#  4. a second run changes nothing (PLAY RECAP: changed=0 on every host);
#  5. systemd-analyze verify on the units that run wrote (the real prefix paths), and render.py gives the same
#     text for the same values;
#  6. what the run left: torch at the pinned version, Fedge importable, key files and modes, the coordinator's
#     key at the agent and the agent's key in allowed/, the session TOML accepted by fedge.coordinator.config.
#
# Services are never started: systemd is not the running init on a CI box (the playbook checks), and ci/vars.yml
# turns them off in any case. Outside the throwaway root the run installs Debian packages (python3-venv,
# python3-packaging, python3-apt, systemd for systemd-analyze) and creates the system user and group fedge.
#
# Environment: FEDGE_DEPLOY_WORK (default /tmp/fedge-deploy-ci) holds the tools, the wheel, the root and the logs;
# the tools are kept between runs, the rest is made anew each run. FEDGE_DEPLOY_SOURCE (default: this checkout)
# is the tree the wheel is built from.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SOURCE=${FEDGE_DEPLOY_SOURCE:-$REPO}
WORK=${FEDGE_DEPLOY_WORK:-/tmp/fedge-deploy-ci}
TOOLS=$WORK/tools
ROOT=$WORK/root
PLAYBOOK_DIR=$REPO/deploy/ansible
PYTHON=${PYTHON:-python3}
START=$SECONDS

step() { printf '\n== [%3ds] %s\n' $((SECONDS - START)) "$*"; }
fail() {
    printf 'FAIL: %s\n' "$*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || fail "run as root: the playbook installs Debian packages and creates the system user fedge"
mkdir -p "$WORK"

step "tools: ansible-core and ansible-lint from deploy/ci-requirements.txt into $TOOLS"
want=$(sha256sum "$REPO/deploy/ci-requirements.txt" | cut -d' ' -f1)
if [ ! -x "$TOOLS/bin/ansible-lint" ] || [ "$(cat "$TOOLS/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    rm -rf "$TOOLS"
    "$PYTHON" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q --disable-pip-version-check -r "$REPO/deploy/ci-requirements.txt" \
        >"$WORK/tools.log" 2>&1 || {
        tail -n 30 "$WORK/tools.log"
        fail "could not install the tools ($WORK/tools.log)"
    }
    echo "$want" >"$TOOLS/.requirements.sha256"
fi
export PATH="$TOOLS/bin:$PATH"
export ANSIBLE_CONFIG=$PLAYBOOK_DIR/ansible.cfg ANSIBLE_HOME=$WORK/ansible-home ANSIBLE_NOCOLOR=1
export ANSIBLE_FORCE_COLOR=0 ANSIBLE_STDOUT_CALLBACK=default PY_COLORS=0 NO_COLOR=1
ansible-playbook --version | sed -n 1p
ansible-lint --version 2>/dev/null | sed -n 1p

step "units: deploy/systemd/ is what render.py makes from the role templates"
python "$REPO/deploy/systemd/render.py" --check
echo "in sync"

step "syntax: ansible-playbook --syntax-check"
cd "$PLAYBOOK_DIR"
ansible-playbook -i ci/inventory.ini site.yml --syntax-check

step "lint: ansible-lint (profile production, offline)"
ansible-lint --offline --project-dir "$PLAYBOOK_DIR" -c "$PLAYBOOK_DIR/.ansible-lint"

step "wheel: build Fedge from $SOURCE"
rm -rf "$WORK/src" "$WORK/dist" "$ROOT"
mkdir -p "$WORK/src" "$WORK/dist" "$ROOT"
if git -C "$SOURCE" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Tracked and untracked-but-not-ignored files: what a commit of this tree would hold.
    (cd "$SOURCE" && git ls-files -z --cached --others --exclude-standard |
        tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -xf - -C "$WORK/src"
else
    cp -a "$SOURCE/." "$WORK/src/"
fi
pip wheel -q --disable-pip-version-check --no-deps -w "$WORK/dist" "$WORK/src" >"$WORK/wheel.log" 2>&1 || {
    tail -n 30 "$WORK/wheel.log"
    fail "could not build the wheel ($WORK/wheel.log)"
}
WHEEL=$(ls "$WORK"/dist/fedge-*.whl)
echo "$WHEEL"

if ! command -v systemd-analyze >/dev/null; then
    step "install systemd-analyze (Debian package systemd)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi

run_playbook() { # $1: log name
    ansible-playbook -i ci/inventory.ini site.yml -e @ci/vars.yml -e "fedge_ci_root=$ROOT" \
        -e "fedge_wheel=$WHEEL" >"$WORK/$1.log" 2>&1 || {
        tail -n 60 "$WORK/$1.log"
        fail "ansible-playbook failed ($WORK/$1.log)"
    }
    sed -n '/^PLAY RECAP/,$p' "$WORK/$1.log"
}

step "playbook, first run: install into $ROOT"
mkdir -p "$ROOT/etc/systemd/system" "$ROOT/etc/udev/rules.d" # there on any real host
run_playbook run1

step "playbook, second run: must change nothing"
run_playbook run2
changed=$(sed -n '/^PLAY RECAP/,$p' "$WORK/run2.log" | awk '/ changed=/ { split($0, a, "changed="); split(a[2], b, " "); s += b[1] } END { print s + 0 }')
if [ "$changed" != 0 ]; then
    grep -B3 '^changed:' "$WORK/run2.log" || true
    fail "the second run changed $changed thing(s): the playbook is not idempotent ($WORK/run2.log)"
fi
echo "idempotent: changed=0"

UNITS=$ROOT/etc/systemd/system
step "systemd-analyze verify on the units the run wrote ($UNITS)"
out=$(systemd-analyze verify --man=no --generators=no "$UNITS/fedge-agent.service" \
    "$UNITS/fedge-coordinator@.service" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify printed warnings: $out"
echo "verified: syntax, known directives and values, executables present ($ROOT/opt/fedge/bin/...)"
python "$REPO/deploy/systemd/render.py" --check --out "$UNITS" --set "fedge_prefix=$ROOT/opt/fedge" \
    --set "fedge_config_dir=$ROOT/etc/fedge"
echo "render.py makes the same units as Ansible for the same values"
systemd-analyze security --offline=true --no-pager "$UNITS/fedge-agent.service" 2>&1 | tail -n 1 || true
systemd-analyze security --offline=true --no-pager "$UNITS/fedge-coordinator@.service" 2>&1 | tail -n 1 || true

step "what the run left"
"$ROOT/opt/fedge/bin/python" - "$ROOT" "$REPO/constraints/cpu-$(uname -m).txt" <<'EOF'
import importlib.metadata as md
import pwd
import re
import stat
import sys
import tomllib
from pathlib import Path

root, constraints = Path(sys.argv[1]), Path(sys.argv[2])
problems = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        problems.append(what)


pin = re.search(r"^torch==(\S+)", constraints.read_text(), re.M).group(1)
check(md.version("torch").split("+")[0] == pin.split("+")[0], f"torch {md.version('torch')} matches the pin {pin}")
check(md.version("fedge") != "", f"fedge {md.version('fedge')} installed")
fedge_uid = pwd.getpwnam("fedge").pw_uid
for path, mode in [
    ("var/lib/fedge-agent/keys/agent.key_secret", 0o600),
    ("var/lib/fedge-agent/keys/agent.key", 0o644),
    ("var/lib/fedge-coordinator/keys/coordinator.key_secret", 0o600),
    ("var/lib/fedge-coordinator/keys/coordinator.key", 0o644),
    ("var/lib/fedge-coordinator/keys/allowed/ci-device-7.key", 0o644),
]:
    st = (root / path).stat() if (root / path).exists() else None
    check(st is not None and stat.S_IMODE(st.st_mode) == mode and st.st_uid == fedge_uid,
          f"{path} owned by fedge, mode {mode:o}")
check((root / "etc/fedge/coordinator.key").read_bytes()
      == (root / "var/lib/fedge-coordinator/keys/coordinator.key").read_bytes(),
      "the agent holds the coordinator's public key")
check((root / "var/lib/fedge-coordinator/keys/allowed/ci-device-7.key").read_bytes()
      == (root / "var/lib/fedge-agent/keys/agent.key").read_bytes()
      and not (root / "var/lib/fedge-coordinator/keys/allowed/ci-agent.key").exists(),
      "the coordinator allows the agent's public key as its client id (allowed/CLIENT_ID.key)")
agent = tomllib.loads((root / "etc/fedge/agent.toml").read_text())
check(agent["agent"]["coordinator"] == "tcp://ci-coordinator:5555" and agent["security"]["curve"] == "on"
      and agent["security"]["keys_dir"] == str(root / "var/lib/fedge-agent/keys"), "agent.toml as templated")
session = root / "etc/fedge/coordinator/ci.toml"
raw = tomllib.loads(session.read_text())
check(raw["fleet"]["bind"] == "tcp://0.0.0.0:5555" and raw["fleet"]["expect"] == 1, "ci.toml: bind and expect")
# The runtime's own loaders, from the installed wheel: the templated files must be what they accept.
try:
    from fedge.coordinator.config import load_config
    from fedge.edge_agent.config import load_settings
except ImportError as exc:
    check(False, f"the runtime's config loaders import: {exc}")
else:
    for what, load in [("ci.toml", lambda: load_config(session)),
                       ("agent.toml", lambda: load_settings(str(root / "etc/fedge/agent.toml"), {}))]:
        try:
            load()
            check(True, f"{what} accepted by the runtime's loader")
        except Exception as exc:
            check(False, f"{what} accepted by the runtime's loader: {exc}")
sys.exit(1 if problems else 0)
EOF

step "deploy checks passed in $((SECONDS - START)) s"
