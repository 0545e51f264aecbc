#!/bin/bash
# busybox-image.sh OUT.tar IMAGE_REF [CMD_JSON]
#
# Writes an OCI image-layout archive of Debian's busybox-static (one layer: /bin/busybox,
# one symlink per applet, /etc/passwd, /etc/group, /tmp), without a registry or an image
# builder. Same input, same bytes: the layer tar and every JSON document are reproducible.
# The archive loads with `ctr [-n k8s.io] images import OUT.tar` and `podman load -i OUT.tar`.
#   IMAGE_REF       e.g. docker.io/library/ng-e2e-busybox:1 (the name ctr/CRI will use)
#   CMD_JSON        default ["/bin/sh"]; there is no Entrypoint, so `run IMAGE CMD...` runs
#                   CMD. A CRI sandbox ("pause") image uses ["/bin/sleep","2147483647"].
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT.tar IMAGE_REF [CMD_JSON]" >&2; exit 2; }
out=$1 ref=$2 cmd=${3:-'["/bin/sh"]'}
bb=/bin/busybox
[ -x "$bb" ] || { echo "$0: $bb missing (apt-get install busybox-static)" >&2; exit 1; }
# a dynamically linked busybox would not run inside the image
if ldd "$bb" >/dev/null 2>&1; then echo "$0: $bb is dynamically linked (install busybox-static)" >&2; exit 1; fi
for c in jq sha256sum gzip tar; do command -v $c >/dev/null || { echo "$0: $c missing" >&2; exit 1; }; done

work=$(mktemp -d /tmp/ng-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs blobs=$work/layout/blobs/sha256
mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev,root} "$blobs"
cp "$bb" "$root/bin/busybox"
for applet in $("$bb" --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
chmod 1777 "$root/tmp"

epoch='2024-01-01T00:00:00Z'
reproducible_tar() { tar --sort=name --mtime="$epoch" --owner=0 --group=0 --numeric-owner --format=posix \
                         --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"; }
# blob FILE -> moves FILE into the blob store, prints "sha256:<hex> <size>"
blob() {
  local d s; d=$(sha256sum "$1" | cut -d' ' -f1); s=$(stat -c %s "$1")
  mv "$1" "$blobs/$d"; echo "sha256:$d $s"
}

reproducible_tar -C "$root" -cf "$work/layer.tar" .
diff_id=sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -9 < "$work/layer.tar" > "$work/layer.tgz"
read -r layer_digest layer_size < <(blob "$work/layer.tgz")

jq -cn --arg created "$epoch" --arg diff "$diff_id" --argjson cmd "$cmd" '{
  created: $created, architecture: "amd64", os: "linux",
  config: {Env: ["PATH=/bin:/sbin:/usr/bin:/usr/sbin"], Cmd: $cmd, WorkingDir: "/"},
  rootfs: {type: "layers", diff_ids: [$diff]},
  history: [{created: $created, created_by: "scripts/e2e/busybox-image.sh"}]}' > "$work/config.json"
read -r config_digest config_size < <(blob "$work/config.json")

jq -cn --arg cd "$config_digest" --argjson cs "$config_size" --arg ld "$layer_digest" --argjson ls "$layer_size" '{
  schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
  config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
  layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $ld, size: $ls}]}' > "$work/manifest.json"
read -r manifest_digest manifest_size < <(blob "$work/manifest.json")

# io.containerd.image.name: the full reference ctr imports it as;
# org.opencontainers.image.ref.name: the reference podman load tags it with.
jq -cn --arg md "$manifest_digest" --argjson ms "$manifest_size" --arg ref "$ref" '{
  schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
  manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $md, size: $ms,
    platform: {architecture: "amd64", os: "linux"},
    annotations: {"io.containerd.image.name": $ref, "org.opencontainers.image.ref.name": $ref}}]}' \
  > "$work/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$work/layout/oci-layout"
reproducible_tar -C "$work/layout" -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"
echo "$out $ref $manifest_digest"
