#!/usr/bin/env bash
# scripts/sdk-venv.sh: installs the cloud SDKs the metadata proxy's tests run (tests/proxy_sdks.rs,
# tests/proxy/sdk_probe.py) from PyPI into a virtualenv under target/ (the system Python stays
# untouched), pinned below; reused as long as the pins match. scripts/test.sh calls it before
# `cargo test`; run it by hand before `cargo test --test proxy_sdks`.
#
#   scripts/sdk-venv.sh     prints the venv's python (target/sdk-venv/bin/python)
#
# Needs python3-venv (scripts/test.sh installs it) and PyPI.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=$PWD/target/sdk-venv
PINS=(
  boto3==1.44.18 botocore==1.44.18
  google-auth==2.63.1 requests==2.34.2
  azure-identity==1.27.0
)

die() {
  printf 'scripts/sdk-venv.sh: %s\n' "$*" >&2
  exit 1
}

if [ "$(cat "$VENV/pins" 2>/dev/null)" != "${PINS[*]}" ] || ! "$VENV/bin/python" -c 'import boto3, google.auth, azure.identity' 2>/dev/null; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv (python3-venv) failed"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PINS[@]}" ||
    die "pip install ${PINS[*]} failed"
  echo "${PINS[*]}" >"$VENV/pins"
fi
echo "$VENV/bin/python"
