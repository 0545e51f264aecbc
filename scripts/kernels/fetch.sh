# scripts/kernels/fetch.sh: sourced by scripts/kernels.sh.
#
# fetch_kernel SUITE DIR   puts Debian SUITE's newest amd64 kernel in DIR (a cache directory):
#                          DIR/vmlinuz, DIR/root/lib/modules/<version>/ (with depmod's index),
#                          DIR/version. Uses a temporary apt configuration of its own (sources,
#                          state, cache, no source parts), so the machine's apt setup is never
#                          read or changed; the archive host is the one the machine's own sources
#                          name. Already complete in DIR: nothing is fetched.

debian_mirror() {
  local url
  url=$(grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list.d/ /etc/apt/sources.list 2>/dev/null |
    head -n1 | tr -d ' ')
  printf '%s\n' "${url:-http://deb.debian.org/debian}"
}

fetch_kernel() {
  local suite=$1 dir=$2 apt pkg deb ver mods
  [ -s "$dir/version" ] && [ -s "$dir/vmlinuz" ] && return 0
  rm -rf "$dir" && mkdir -p "$dir"
  apt=$dir/apt
  mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/etc/sources.list.d" \
    "$apt/etc/preferences.d" "$apt/etc/apt.conf.d"
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
    "$(debian_mirror)" "$suite" >"$apt/etc/sources.list"
  cat >"$apt/apt.conf" <<CONF
Dir::State "$apt/state";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
Dir::Etc "$apt/etc";
Dir::Etc::sourcelist "$apt/etc/sources.list";
Dir::Etc::sourceparts "$apt/etc/sources.list.d";
Dir::Etc::preferencesparts "$apt/etc/preferences.d";
Dir::Etc::parts "$apt/etc/apt.conf.d";
Dir::Etc::trusted "/etc/apt/trusted.gpg";
Dir::Etc::trustedparts "/etc/apt/trusted.gpg.d";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
Acquire::Languages "none";
CONF
  : >"$apt/state/status"
  APT_CONFIG=$apt/apt.conf apt-get -q update >"$apt/update.log" 2>&1 ||
    { cat "$apt/update.log" >&2; echo "apt-get update for $suite failed" >&2; return 1; }
  # The meta-package linux-image-amd64 depends on the suite's current ABI package.
  pkg=$(APT_CONFIG=$apt/apt.conf apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  [ -n "$pkg" ] || { echo "no linux-image-<abi>-amd64 in $suite" >&2; return 1; }
  (cd "$apt" && APT_CONFIG=$apt/apt.conf apt-get -q download "$pkg" >download.log 2>&1) ||
    { cat "$apt/download.log" >&2; echo "apt-get download $pkg ($suite) failed" >&2; return 1; }
  deb=$(ls "$apt"/"${pkg}"_*.deb 2>/dev/null | head -n1)
  [ -n "$deb" ] || { echo "apt-get download $pkg left no .deb" >&2; return 1; }
  mkdir -p "$dir/root"
  dpkg-deb -x "$deb" "$dir/root" || return 1
  # bookworm and older ship lib/modules, trixie (merged /usr) usr/lib/modules.
  mods=$dir/root/lib/modules
  [ -d "$mods" ] || mods=$dir/root/usr/lib/modules
  ver=$(ls "$mods" 2>/dev/null | head -n1)
  [ -n "$ver" ] && [ -f "$dir/root/boot/vmlinuz-$ver" ] ||
    { echo "$deb has no boot/vmlinuz or lib/modules" >&2; return 1; }
  if [ "$mods" != "$dir/root/lib/modules" ]; then
    mkdir -p "$dir/root/lib" && mv "$mods" "$dir/root/lib/modules"
  fi
  # Compressed modules (trixie: .ko.xz) are unpacked, so busybox's insmod/modprobe load them on
  # every kernel alike; busybox's depmod then writes the index that modprobe reads.
  find "$dir/root/lib/modules/$ver" -name '*.ko.xz' -print0 | xargs -0 -r -n 200 xz -d || return 1
  busybox depmod -b "$dir/root" "$ver" || return 1
  cp "$dir/root/boot/vmlinuz-$ver" "$dir/vmlinuz" || return 1
  basename "$deb" >"$dir/package"
  rm -rf "$apt"
  printf '%s\n' "$ver" >"$dir/version"
}
