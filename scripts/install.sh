#!/usr/bin/env bash
# Create (or update) the virtual environment .venv and install Fedge into it, torch first.
#
#   bash scripts/install.sh               # a coordinator or workstation: the runtime with ONNX export, plots and
#                                         # the privacy accountant (dp-accounting)
#   bash scripts/install.sh --agent       # a device: the agent and on-device inference, nothing else
#   bash scripts/install.sh --dev         # everything the test suite needs (Ray included)
#   bash scripts/install.sh --ray         # the default plus Ray, for simulated fleets and sweeps on a cluster
#   bash scripts/install.sh --examples    # the default plus the worked example (examples/tabular, scikit-learn)
#   bash scripts/install.sh --flower      # the default plus Flower, for benchmarks/vs_flower.py
#   bash scripts/install.sh --plan FILE   # only resolve torch (pip --dry-run --report FILE); installs nothing
#                                         # (it creates .venv, whose pip resolves)
#
# torch is installed first, pinned by the constraints file of this machine's architecture, so that pip never
# resolves an unpinned `torch`:
# - x86_64: the CPU build, `torch==X+cpu` from PyTorch's CPU wheel index (FEDGE_TORCH_INDEX; default
#   https://download.pytorch.org/whl/cpu, or any mirror of it, a file:// index included). PyPI's x86_64 wheel of
#   the same version is the multi-GB CUDA build; the `+cpu` pin can never match it, so an unreachable index is an
#   error, never a fallback. A wheel that pip's own configuration offers (find-links) is taken as well.
# - aarch64 (Raspberry Pi, 64-bit OS): PyPI's aarch64 wheel, a CPU build.
# - Jetson: FEDGE_TORCH_WHEEL=NVIDIA's wheel (a path or URL), with constraints/jetson.txt (numpy<2, as the
#   Ansible role); NVIDIA's wheel links OpenBLAS, which is checked first. On x86_64 FEDGE_TORCH_WHEEL installs the
#   given wheel with no pin of Fedge's.
# Downloads retry FEDGE_PIP_RETRIES times (default 2) with a FEDGE_PIP_TIMEOUT-second timeout (default 15).
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "install.sh: $*" >&2; exit 2; }

profile=default plan=""
case "${1:-}" in
  "") ;;
  --dev) profile=dev ;;
  --agent) profile=agent ;;
  --examples) profile=examples ;;
  --ray) profile=ray ;;
  --flower) profile=flower ;;
  --plan) plan="${2:?--plan needs a report file}"; profile=plan ;;
  *) fail "unknown option ${1} (use --agent, --dev, --ray, --examples, --flower or --plan FILE)" ;;
esac
case "$profile" in
  default) extras="export,report,svhn,privacy" ;;
  agent) extras="agent" ;;
  dev) extras="dev,export,report,svhn,ray,privacy,tensorboard,mlflow" ;;
  ray) extras="export,report,svhn,privacy,ray" ;;
  examples) extras="examples,export,report,svhn,privacy" ;;
  flower) extras="export,report,svhn,privacy,flower" ;;
  plan) extras="" ;;
esac

machine="$(uname -m)"
case "$machine" in
  x86_64) constraints="constraints/cpu-x86_64.txt" index="${FEDGE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}" ;;
  aarch64) constraints="constraints/cpu-aarch64.txt" index="${FEDGE_TORCH_INDEX:-}" ;;
  *) fail "no torch wheel is known for $machine; install torch yourself, then pip install -e ." ;;
esac
retries="${FEDGE_PIP_RETRIES:-2}" timeout="${FEDGE_PIP_TIMEOUT:-15}"

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv || fail "python3 -m venv failed: apt-get install python3-venv"
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q --retries "$retries" --timeout "$timeout")

if [[ -n "${FEDGE_TORCH_WHEEL:-}" ]]; then
  [[ -z "$plan" ]] || fail "--plan resolves the CPU wheel; with FEDGE_TORCH_WHEEL there is nothing to resolve"
  if [[ "$machine" == aarch64 ]]; then  # a Jetson: NVIDIA's wheel
    libraries="$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null || true)"
    [[ "$libraries" == *libopenblas.so* ]] \
      || fail "NVIDIA's torch wheel links OpenBLAS, which this machine lacks: apt-get install libopenblas-dev"
    constraints="constraints/jetson.txt"
  else  # a wheel of your own choosing: no pin of ours applies
    constraints="/dev/null"
  fi
  "${pip[@]}" install -c "$constraints" "$FEDGE_TORCH_WHEEL" || fail "could not install $FEDGE_TORCH_WHEEL"
else
  torch_pin="$(grep -E '^torch==' "$constraints")"
  from_index=()
  [[ -n "$index" ]] && from_index=(--index-url "$index")
  if [[ -n "$plan" ]]; then
    "${pip[@]}" install --dry-run --ignore-installed --no-deps --report "$plan" "${from_index[@]}" "$torch_pin" \
      || fail "could not resolve $torch_pin${index:+ from $index} (set FEDGE_TORCH_INDEX to a reachable mirror)"
    exit 0
  fi
  installed="$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
  if [[ "torch==$installed" != "$torch_pin" ]]; then
    # torch alone from the CPU index (its dependencies come from pip's usual index in the next step).
    "${pip[@]}" install --no-deps "${from_index[@]}" "$torch_pin" 2>.venv/torch-install.log \
      || fail "could not get $torch_pin${index:+ from $index} (see .venv/torch-install.log; set FEDGE_TORCH_INDEX to a reachable mirror of PyTorch's CPU index, or FEDGE_TORCH_WHEEL to a wheel file)"
  fi
  "${pip[@]}" install -c "$constraints" "$torch_pin" || fail "could not install torch's dependencies"
fi
pins=(-c "$constraints")
[[ ",$extras," == *,ray,* ]] && pins+=(-c constraints/ray.txt)  # Ray pinned: every node of a cluster needs the same
"${pip[@]}" install "${pins[@]}" -e ".${extras:+[$extras]}" || fail "could not install Fedge (profile $profile)"
if [ "$profile" = examples ]; then  # the team's plugin package: no dependencies of its own (Fedge is installed)
  "${pip[@]}" install --no-deps -e examples/tabular || fail "could not install the example package examples/tabular"
fi
.venv/bin/python -c "import torch, fedge; print(f'fedge {fedge.__version__} installed in .venv ($profile); torch', torch.__version__)"
