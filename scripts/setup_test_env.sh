#!/usr/bin/env bash
# Build the CPU test environment in $VENV (default .venv): torch CPU, vllm 0.23.0 from its
# sdist without kernels, the pinned test tools. Idempotent: a stamp file records the
# requirements it was built from, so an unchanged environment is reused at no cost.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$here/.venv}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=0.23.0
stamp="$VENV/.patchset-env"
want=$(cat "$here/requirements-test.txt" "$here/requirements-build.txt" "$0" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setting up the test environment in $VENV (a few minutes, once)"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade "pip>=24"
"${pip[@]}" install -q -r "$here/requirements-build.txt" -r "$here/requirements-test.txt"
# vllm without kernels; the version override makes the '+empty' build satisfy ==0.23.0.
VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=$VLLM_VERSION \
  "${pip[@]}" install -q --no-build-isolation --no-binary vllm "vllm==$VLLM_VERSION" \
  -r "$here/requirements-test.txt"
# xgrammar pulls triton, which nothing here needs (1 GB); torchvision breaks CPU torch.
"${pip[@]}" uninstall -q -y triton torchvision 2>/dev/null || true
"${pip[@]}" install -q --no-deps -e "$here"
echo "$want" > "$stamp"
