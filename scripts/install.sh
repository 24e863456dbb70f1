#!/usr/bin/env bash
# Create (or update) the virtual environment .venv and install Fedge into it, torch first.
#
#   bash scripts/install.sh          # the runtime with ONNX export and plots
#   bash scripts/install.sh --dev    # plus everything the test suite needs
#
# torch is installed first, pinned by a constraints file chosen for this machine, so that pip never resolves an
# unpinned `torch` (which pulls a multi-GB CUDA build). On a Jetson, set FEDGE_TORCH_WHEEL to NVIDIA's wheel (a
# path or URL) before running this; on a Raspberry Pi (aarch64) the CPU wheel of constraints/cpu-aarch64.txt is used.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="export,report,svhn"
if [[ "${1:-}" == "--dev" ]]; then extras="dev,export,report,svhn"; fi

case "$(uname -m)" in
  x86_64|amd64) constraints="constraints/cpu-x86_64.txt" ;;
  aarch64|arm64) constraints="constraints/cpu-aarch64.txt" ;;
  *) echo "install.sh: no torch wheel is known for $(uname -m); install torch yourself, then pip install -e ." >&2
     exit 2 ;;
esac

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv || { echo "install.sh: python3 -m venv failed: apt-get install python3-venv" >&2; exit 2; }
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
if [[ -n "${FEDGE_TORCH_WHEEL:-}" ]]; then
  "${pip[@]}" install "$FEDGE_TORCH_WHEEL"
  "${pip[@]}" install -e ".[${extras}]"
else
  torch_pin="$(grep -E '^torch==' "$constraints")"
  "${pip[@]}" install -c "$constraints" "$torch_pin"
  "${pip[@]}" install -c "$constraints" -e ".[${extras}]"
fi
.venv/bin/python -c "import torch; print('fedge installed in .venv; torch', torch.__version__)"
