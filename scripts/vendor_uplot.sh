#!/usr/bin/env bash
# Refresh the chart library the dashboard ships (dashboard/static/): uPlot from the npm registry, never from a CDN
# at run time (field coordinators are often offline). Writes its files and dashboard/static/VENDOR.json (name,
# version, licence, the registry tarball's integrity, each file's sha256 and size); tests/test_dashboard_security.py
# checks the shipped files against that record.
#
#   bash scripts/vendor_uplot.sh            # the version pinned below
#   bash scripts/vendor_uplot.sh 1.6.32     # another version (then update the pin)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-1.6.32}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@${version}" >/dev/null)
tar -xzf "$work/uplot-${version}.tgz" -C "$work"
integrity="$(cd "$work" && npm view "uplot@${version}" dist.integrity)"
licence="$(node -e 'console.log(require(process.argv[1]).license)' "$work/package/package.json")"
static=dashboard/static
cp "$work/package/dist/uPlot.iife.min.js" "$static/uplot.iife.min.js"
cp "$work/package/dist/uPlot.min.css" "$static/uplot.min.css"
cp "$work/package/LICENSE" "$static/uplot.LICENSE.txt"
python3 - "$static" "$version" "$licence" "$integrity" <<'PY'
import hashlib, json, sys
from pathlib import Path
static, version, licence, integrity = Path(sys.argv[1]), *sys.argv[2:]
files = {name: {"sha256": hashlib.sha256((static / name).read_bytes()).hexdigest(), "bytes": (static / name).stat().st_size}
         for name in ("uplot.iife.min.js", "uplot.min.css", "uplot.LICENSE.txt")}
record = {"name": "uplot", "version": version, "license": licence, "source": f"npm registry, uplot@{version}",
          "tarball_integrity": integrity, "files": files}
(static / "VENDOR.json").write_text(json.dumps(record, indent=2) + "\n")
print(f"vendored uplot {version} ({licence}): " + ", ".join(f"{n} {f['bytes']} B" for n, f in files.items()))
PY
