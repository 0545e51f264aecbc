#!/usr/bin/env bash
# Builds natguard's container image as an OCI image-layout archive, without a container engine.
#
#   scripts/image.sh [OUT.tar]        (default: target/natguard-image.tar)
#
# The image holds the static release binary alone, at /natguard, with the entrypoint
# ["/natguard","install","--watch"]. The archive is reproducible: the same binary gives the same
# bytes, so the same digests (fixed mtimes, owners, modes and order in both tars, gzip -n, a fixed
# "created" time). Load it with
#   ctr -n k8s.io images import target/natguard-image.tar    (names it docker.io/library/natguard:0.2.0)
#   podman load -i target/natguard-image.tar                  (names it docker.io/library/natguard:0.2.0)
# Kubernetes normalizes the DaemonSet's "natguard:0.2.0" to docker.io/library/natguard:0.2.0, so
# the imported image is found without a registry.
#
# The image config carries the OCI labels org.opencontainers.image.title, .version and
# .revision (what the binary's `--version` says: the crate version and the git revision it was
# built from), .licenses (Apache-2.0) and .source. Every label comes from the binary or the
# environment, so the same binary and environment still give the same digests.
#
# Environment:
#   NATGUARD_BIN       use this binary instead of building target/x86_64-unknown-linux-gnu/release/natguard
#   IMAGE_ARCH         the image's architecture, amd64 (default) or arm64; for arm64, NATGUARD_BIN
#                      must be a static aarch64 binary (built on an arm64 host: docs/upgrade.md)
#   IMAGE_REF          image reference (default natguard:0.2.0)
#   IMAGE_SOURCE       org.opencontainers.image.source (default: Cargo.toml's package.repository;
#                      never the git remote, whose URL may hold credentials; an http(s) URL)
#   SOURCE_DATE_EPOCH  the image's "created" time and every file's mtime (default 0)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/target/natguard-image.tar}
ref=${IMAGE_REF:-natguard:0.2.0}
epoch=${SOURCE_DATE_EPOCH:-0}
arch=${IMAGE_ARCH:-amd64}

die() { echo "image.sh: $*" >&2; exit 1; }

case $ref in
  *:*) name=${ref%:*} tag=${ref##*:} ;;
  *) die "IMAGE_REF must be NAME:TAG, got $ref" ;;
esac
# The fully qualified name Kubernetes and podman resolve a short name to.
case $name in
  */*/*) full=$name ;;
  *.*/* | *:*/* | localhost/*) full=$name ;;
  */*) full=docker.io/$name ;;
  *) full=docker.io/library/$name ;;
esac

case $arch in
  amd64) machine='X86-64' ;;
  arm64) machine='AArch64' ;;
  *) die "IMAGE_ARCH must be amd64 or arm64, got $arch" ;;
esac
if [[ -z ${NATGUARD_BIN:-} && $arch != amd64 ]]; then
  die "IMAGE_ARCH=$arch needs NATGUARD_BIN: a static $arch binary built on such a host"
fi
if [[ -n ${NATGUARD_BIN:-} ]]; then
  bin=$NATGUARD_BIN
else
  (cd "$root" && cargo build --release --locked --quiet)
  bin=$root/target/x86_64-unknown-linux-gnu/release/natguard
fi
[[ -x $bin ]] || die "no binary at $bin"
# The image has no libc and no loader: only a static binary runs in it.
if readelf -lW "$bin" | grep 'program interpreter' >/dev/null; then
  die "$bin is dynamically linked; build with the crate's .cargo/config.toml (crt-static)"
fi
readelf -hW "$bin" | grep -q "Machine:.*$machine" || die "$bin is not a $arch binary"

# Version and revision as the binary reports them: "natguard 0.1.0 (revision 0123456789ab)".
version_line=$("$bin" --version) || die "$bin --version failed"
version=$(sed -n 's/^natguard \([^ ]*\).*/\1/p' <<<"$version_line")
revision=$(sed -n 's/.*(revision \([^)]*\))$/\1/p' <<<"$version_line")
[[ -n $version ]] || die "$bin --version: unexpected output: $version_line"
revision=${revision:-unknown}
source_url=${IMAGE_SOURCE:-$(sed -n 's/^repository *= *"\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)}
[[ $source_url == https://* || $source_url == http://* ]] ||
  die "org.opencontainers.image.source must be the project's URL: set package.repository in Cargo.toml or IMAGE_SOURCE (got '${source_url}')"
for v in "$version" "$revision" "$source_url" "$tag"; do
  # The values are written into JSON as they are: no quotes, backslashes or control characters.
  [[ $v != *[\"\\[:cntrl:]]* ]] || die "a label value may not hold quotes, backslashes or control characters: $v"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs" "$work/layout/blobs/sha256"
install -m 0755 "$bin" "$work/rootfs/natguard"

# One tar invocation for both archives: fixed order, times, owners; ustar has no atime/ctime.
dtar() {
  tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=ustar "$@"
}
dtar -C "$work/rootfs" -cf "$work/layer.tar" natguard
diff_id=$(sha256sum <"$work/layer.tar" | cut -d' ' -f1)
gzip -n -9 <"$work/layer.tar" >"$work/layer.tar.gz"

blob() { # FILE -> prints "digest size", stores FILE as a blob
  local d s
  d=$(sha256sum <"$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  cp "$1" "$work/layout/blobs/sha256/$d"
  echo "$d $s"
}
read -r layer_digest layer_size < <(blob "$work/layer.tar.gz")

created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
printf '%s' \
  '{"architecture":"'"$arch"'","os":"linux",' \
  '"config":{"Entrypoint":["/natguard","install","--watch"],"WorkingDir":"/",' \
  '"Labels":{"org.opencontainers.image.licenses":"Apache-2.0",' \
  '"org.opencontainers.image.revision":"'"$revision"'",' \
  '"org.opencontainers.image.source":"'"$source_url"'",' \
  '"org.opencontainers.image.title":"natguard",' \
  '"org.opencontainers.image.version":"'"$version"'"}},' \
  '"created":"'"$created"'",' \
  '"history":[{"created":"'"$created"'","created_by":"scripts/image.sh: /natguard"}],' \
  '"rootfs":{"type":"layers","diff_ids":["sha256:'"$diff_id"'"]}}' >"$work/config.json"
read -r config_digest config_size < <(blob "$work/config.json")

printf '%s' \
  '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",' \
  '"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'"$config_digest"'","size":'"$config_size"'},' \
  '"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:'"$layer_digest"'","size":'"$layer_size"'}]}' \
  >"$work/manifest.json"
read -r manifest_digest manifest_size < <(blob "$work/manifest.json")

# ctr import (1.6) names the image after io.containerd.image.name, else after
# org.opencontainers.image.ref.name, as written: a short "natguard:0.2.0" stays short, and the CRI
# plugin, which looks the DaemonSet's image up as docker.io/library/natguard:0.2.0, would not find
# it. podman load takes ref.name and turns a short name into localhost/natguard:0.2.0. Both get the
# fully qualified name, which both then find under the short name too.
printf '%s' \
  '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json",' \
  '"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:'"$manifest_digest"'","size":'"$manifest_size"',' \
  '"platform":{"architecture":"'"$arch"'","os":"linux"},' \
  '"annotations":{"io.containerd.image.name":"'"$full:$tag"'","org.opencontainers.image.ref.name":"'"$full:$tag"'"}}]}' \
  >"$work/layout/index.json"
printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"

find "$work/layout" -type d -exec chmod 0755 {} +
find "$work/layout" -type f -exec chmod 0644 {} +
mkdir -p "$(dirname "$out")"
dtar -C "$work/layout" -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"
echo "image.sh: $out: $full:$tag manifest sha256:$manifest_digest archive sha256:$(sha256sum <"$out" | cut -d' ' -f1)"
