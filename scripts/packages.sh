# scripts/packages.sh: sourced by the scripts that install what they need on Debian 12.
#
# ensure_packages PKG...   installs the packages dpkg does not list as installed (one
#                          `apt-get update` + `install`, only when something is missing);
#                          prints what it installs on stderr.
# ensure_cargo             puts cargo on PATH (rustup's env file) or fails.

ensure_packages() {
  local p status missing=()
  for p in "$@"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [ "$status" = installed ] || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  printf 'installing: %s\n' "${missing[*]}" >&2
  # Another install holding dpkg's lock is waited for (bounded), not a failure.
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q \
    --no-install-recommends "${missing[@]}"
}

ensure_cargo() {
  if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
  fi
  command -v cargo >/dev/null || {
    printf 'cargo not found (install Rust: https://rustup.rs)\n' >&2
    return 1
  }
}
