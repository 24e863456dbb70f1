#!/usr/bin/env bash
# Runs the plain units of deploy/systemd/ under a real systemd, in a Debian 12 container (systemd-nspawn), with the
# runtime from this checkout: a coordinator session and one agent over CurveZMQ for six rounds (enough that a
# restart after round 1 lands mid-session: a round takes under two seconds).
#
#   bash deploy/systemd-smoke.sh          # as root; about 3 minutes, plus ~1 min to debootstrap the first time
#
# Checks what deploy/ci-check.sh cannot without systemd as PID 1: Type=notify (READY and STATUS arrive), the
# hardening lets torch, pyzmq and the meter work, StateDirectory/CacheDirectory ownership, the progress-gated
# watchdog kills a stalled service (a small test unit using fedge.plumbing.sdnotify with WatchdogSec=4s), a
# coordinator restart resumes from its checkpoint, the session ends with the coordinator inactive and the agent
# still up and waiting for the next session (its status line says so), and SIGTERM stops the agent with status 0. Not part of CI; it needs systemd-nspawn to work on the machine.
#
# Environment: FEDGE_SMOKE_WORK (default /tmp/fedge-systemd-smoke) keeps the Debian base between runs.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${FEDGE_SMOKE_WORK:-/tmp/fedge-systemd-smoke}
BASE=$WORK/base.tar
ROOTFS=$WORK/rootfs
START=$SECONDS
NSPAWN_PID=
PASSED=0

step() { printf '\n== [%3ds] %s\n' $((SECONDS - START)) "$*"; }
fail() {
    printf 'FAIL: %s\n' "$*" >&2
    [ -z "${CPID:-}" ] || in_container journalctl --no-pager -n 60 -u 'fedge-*' >&2 || true
    exit 1
}
cleanup() {
    if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
        kill "$NSPAWN_PID" || true
        wait "$NSPAWN_PID" 2>/dev/null || true
    fi
    mountpoint -q "$ROOTFS/proc" && umount "$ROOTFS/proc"
    mountpoint -q "$ROOTFS/opt/wheels" && umount "$ROOTFS/opt/wheels"
    [ "$PASSED" = 0 ] || rm -rf "$ROOTFS" # kept for a look when something failed
    return 0
}
trap cleanup EXIT
in_container() { nsenter -t "$CPID" -a "$@"; }
show() { in_container systemctl show "$1" -p "$2" --value; }

[ "$(id -u)" = 0 ] || fail "run as root"
mkdir -p "$WORK"
if ! command -v systemd-nspawn >/dev/null || ! command -v debootstrap >/dev/null; then
    step "install systemd-container and debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container debootstrap >/dev/null
fi

if [ ! -s "$BASE" ]; then
    step "debootstrap a Debian 12 base (once)"
    rm -rf "$WORK/base"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,python3,python3-venv \
        bookworm "$WORK/base" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 ||
        fail "debootstrap failed ($WORK/debootstrap.log)"
    tar -C "$WORK/base" -cf "$BASE" . && rm -rf "$WORK/base"
fi

step "a fresh root file system with /opt/fedge (torch pinned, Fedge from this checkout)"
rm -rf "$ROOTFS" "$WORK/dist" && mkdir -p "$ROOTFS" "$WORK/dist"
tar -C "$ROOTFS" -xf "$BASE"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt" # this machine's trust store
python3 -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO" >"$WORK/wheel.log" 2>&1 || fail "wheel ($WORK/wheel.log)"
mkdir -p "$ROOTFS/opt/wheels" "$ROOTFS/tmp/dist"
cp "$WORK"/dist/fedge-*.whl "$ROOTFS/tmp/dist/"
[ -d /opt/wheels ] && mount --bind /opt/wheels "$ROOTFS/opt/wheels"
mount -t proc proc "$ROOTFS/proc"
arch=$(uname -m)
cp "$REPO/constraints/cpu-$arch.txt" "$ROOTFS/tmp/constraints.txt"
# shellcheck disable=SC2016 # expanded by the shell in the chroot
chroot "$ROOTFS" /bin/bash -euc '
    export PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_FIND_LINKS=/opt/wheels PIP_DISABLE_PIP_VERSION_CHECK=1
    python3 -m venv /opt/fedge
    cp /tmp/constraints.txt /opt/fedge/constraints.txt
    torch=$(grep -E "^torch==" /opt/fedge/constraints.txt)
    /opt/fedge/bin/pip install -q -c /opt/fedge/constraints.txt "$torch"
    /opt/fedge/bin/pip install -q -c /opt/fedge/constraints.txt /tmp/dist/fedge-*.whl
' >"$WORK/pip.log" 2>&1 || fail "pip in the container ($WORK/pip.log)"

step "the user, keys, configuration and units, as the playbook lays them out"
chroot "$ROOTFS" /bin/bash -euc '
    useradd --system --user-group --shell /usr/sbin/nologin --home-dir /nonexistent --no-create-home fedge
    install -d -o fedge -g fedge -m 0750 /var/lib/fedge-agent /var/lib/fedge-agent/data /var/lib/fedge-coordinator
    install -d -o fedge -g fedge -m 0700 /var/lib/fedge-agent/keys
    /opt/fedge/bin/edge-agent keygen --keys-dir /var/lib/fedge-agent/keys >/dev/null
    /opt/fedge/bin/coordinator keygen --keys-dir /var/lib/fedge-coordinator/keys >/dev/null
    cp /var/lib/fedge-agent/keys/agent.key /var/lib/fedge-coordinator/keys/allowed/smoke-agent.key
    install -d -m 0755 /etc/fedge /etc/fedge/coordinator
    install -m 0644 /var/lib/fedge-coordinator/keys/coordinator.key /etc/fedge/coordinator.key
    /opt/fedge/bin/coordinator partition --dataset fmnist-demo --partition iid --clients 10 --out /tmp/shards >/dev/null
    cp /tmp/shards/client-000.npz /var/lib/fedge-agent/data/shard.npz
    chown -R fedge:fedge /var/lib/fedge-agent /var/lib/fedge-coordinator
    chmod 0600 /var/lib/fedge-agent/keys/agent.key_secret /var/lib/fedge-coordinator/keys/coordinator.key_secret
'
cat >"$ROOTFS/etc/fedge/agent.toml" <<'EOF'
[agent]
coordinator = "tcp://127.0.0.1:5555"
client_id = "smoke-agent"
data = "/var/lib/fedge-agent/data/shard.npz"
state_dir = "/var/lib/fedge-agent"
device = "cpu"

[security]
curve = "on"
keys_dir = "/var/lib/fedge-agent/keys"
coordinator_public_key = "/etc/fedge/coordinator.key"
EOF
cat >"$ROOTFS/etc/fedge/coordinator/smoke.toml" <<'EOF'
[run]
rounds = 6
seed = 0

[fleet]
bind = "tcp://0.0.0.0:5555"
expect = 1
local_agents = 0

[round]
min_clients = 1
deadline_s = 300.0

[security]
curve = "on"
keys_dir = "/var/lib/fedge-coordinator/keys"
EOF
chroot "$ROOTFS" chgrp fedge /etc/fedge/agent.toml /etc/fedge/coordinator/smoke.toml
chmod 0640 "$ROOTFS/etc/fedge/agent.toml" "$ROOTFS/etc/fedge/coordinator/smoke.toml"
cp "$REPO/deploy/systemd/fedge-agent.service" "$REPO/deploy/systemd/fedge-coordinator@.service" \
    "$ROOTFS/etc/systemd/system/"
cat >"$ROOTFS/usr/local/bin/watchdog-stall.py" <<'EOF'
import time

from fedge.plumbing import sdnotify

steps = 0
sdnotify.ready("moving, then stalling")
with sdnotify.Watchdog(sdnotify.watchdog_interval(), lambda: steps):
    end = time.monotonic() + 8
    while time.monotonic() < end:
        steps += 1
        time.sleep(0.1)
    time.sleep(3600)
EOF
cat >"$ROOTFS/etc/systemd/system/watchdog-stall.service" <<'EOF'
[Service]
Type=notify
NotifyAccess=main
WatchdogSec=4s
ExecStart=/opt/fedge/bin/python /usr/local/bin/watchdog-stall.py
EOF
systemctl --root="$ROOTFS" enable fedge-agent.service fedge-coordinator@smoke.service >/dev/null 2>&1
umount "$ROOTFS/proc"
mountpoint -q "$ROOTFS/opt/wheels" && umount "$ROOTFS/opt/wheels"

step "boot the container"
systemd-nspawn -D "$ROOTFS" --boot --register=no --keep-unit --console=passive >"$WORK/nspawn.log" 2>&1 &
NSPAWN_PID=$!
CPID=
for _ in $(seq 60); do
    CPID=$(pgrep -P "$NSPAWN_PID" | head -n 1 || true)
    [ -n "$CPID" ] && in_container systemctl is-system-running --wait >/dev/null 2>&1 && break
    sleep 1
done
[ -n "$CPID" ] || fail "the container did not boot ($WORK/nspawn.log)"
in_container systemctl is-system-running || true

step "both services start and report READY"
for unit in fedge-coordinator@smoke fedge-agent; do
    [ "$(show $unit ActiveState)" = active ] || fail "$unit is $(show $unit ActiveState)"
    [ -n "$(show $unit StatusText)" ] || fail "$unit sent no STATUS"
    echo "$unit: active, watchdog $(show $unit WatchdogUSec), status \"$(show $unit StatusText)\""
done

RUN=$ROOTFS/var/lib/fedge-coordinator/smoke
wait_rounds() { # $1: rounds in metrics.jsonl, $2: seconds
    for _ in $(seq "$2"); do
        [ -f "$RUN/metrics.jsonl" ] && [ "$(wc -l <"$RUN/metrics.jsonl")" -ge "$1" ] && return 0
        sleep 1
    done
    fail "fewer than $1 round(s) in $RUN/metrics.jsonl after $2 s"
}

step "round 1, then a coordinator restart that must resume"
wait_rounds 1 600
in_container systemctl restart fedge-coordinator@smoke
resumed=
for _ in $(seq 60); do  # the restarted service logs it (to its run's coordinator.log; the journal gets warnings)
    if grep -q '"msg": "resumed ' "$RUN/coordinator.log" 2>/dev/null; then resumed=1; break; fi
    sleep 1
done
[ -n "$resumed" ] || fail "no resume after restart"
echo "resumed from the checkpoint"

step "the remaining rounds and the end of the session"
wait_rounds 6 600
for _ in $(seq 60); do
    [ "$(show fedge-coordinator@smoke ActiveState)" = inactive ] && break
    sleep 1
done
for unit in fedge-coordinator@smoke fedge-agent; do
    [ "$(show $unit Result)" = success ] || fail "$unit ended with $(show $unit Result)"
done
# The agent stays up for the next session (agent.after_session = wait) and says so in its status line.
for _ in $(seq 30); do
    case "$(show fedge-agent StatusText)" in "waiting for a session"*) break ;; esac
    sleep 1
done
[ "$(show fedge-agent ActiveState)" = active ] || fail "the agent did not stay up after the session"
echo "fedge-agent after the session: active, status \"$(show fedge-agent StatusText)\""
echo "records: $(wc -l <"$RUN/clients.jsonl") line(s) in clients.jsonl, $(wc -l <"$RUN/metrics.jsonl") in metrics.jsonl"
restarts=$(show fedge-agent NRestarts)
echo "agent restarts during the session: $restarts"
if [ "$restarts" != 0 ]; then
    echo "WARNING: the agent did not survive the coordinator's restart on its own; what systemd saw:"
    in_container journalctl --no-pager -u fedge-agent | grep -E "code=|Failed with|terminate called" || true
fi

step "SIGTERM stops an idle agent with status 0"
in_container systemctl stop fedge-agent
if [ "$(show fedge-agent ExecMainStatus)" != 0 ] || [ "$(show fedge-agent Result)" != success ]; then
    fail "fedge-agent stopped with status $(show fedge-agent ExecMainStatus), result $(show fedge-agent Result)"
fi
echo "exit status 0"

step "the watchdog kills a service whose loop stalls"
in_container systemctl start watchdog-stall
sleep 20
[ "$(show watchdog-stall Result)" = watchdog ] || fail "watchdog-stall ended with $(show watchdog-stall Result)"
echo "killed by the watchdog after the loop stopped moving"

step "systemd smoke test passed in $((SECONDS - START)) s"
PASSED=1
