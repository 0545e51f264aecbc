# scripts/kernels/initramfs.sh: sourced by scripts/kernels.sh.
#
# make_initramfs KDIR OUT   writes OUT, a gzipped cpio initramfs for the kernel unpacked in KDIR
#                           (scripts/kernels/fetch.sh): busybox, the kernel's own modules that
#                           mounting the host's filesystem needs (virtio, 9p, overlay), in
#                           dependency order, and scripts/kernels/init as /init.

# The modules /init loads before it can see the host's filesystem. A name that is built into
# this kernel (modules.builtin) or absent is left out.
INITRAMFS_MODULES=(virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
  virtio_rng 9pnet 9pnet_virtio netfs fscache 9p overlay)

# module_closure MODDIR NAME...: module paths (relative to MODDIR), dependencies first.
module_closure() {
  local moddir=$1
  shift
  awk -v want="$*" '
    BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) { gsub(/-/, "_", w[i]); wanted[w[i]] = 1 } }
    {
      path = $1; sub(/:$/, "", path)
      name = path; sub(/.*\//, "", name); sub(/\.ko.*$/, "", name); gsub(/-/, "_", name)
      deps[path] = ""; for (i = 2; i <= NF; i++) deps[path] = deps[path] " " $i
      byname[name] = path
    }
    function visit(p,   d, k, i) {
      if (p in done) return
      done[p] = 1
      k = split(deps[p], d, " ")
      for (i = k; i >= 1; i--) visit(d[i])
      print p
    }
    END { for (i = 1; i <= n; i++) if (w[i] in byname) visit(byname[w[i]]) }
  ' "$moddir/modules.dep"
}

make_initramfs() {
  local kdir=$1 out=$2 ver moddir tmp m
  ver=$(cat "$kdir/version")
  moddir=$kdir/root/lib/modules/$ver
  tmp=$(mktemp -d /tmp/ngk-initramfs.XXXXXX)
  mkdir -p "$tmp"/{bin,proc,sys,dev,lower,upper,newroot,out}
  cp /bin/busybox "$tmp/bin/busybox"
  : >"$tmp/modules"
  for m in $(module_closure "$moddir" "${INITRAMFS_MODULES[@]}"); do
    mkdir -p "$tmp/lib/modules/$(dirname "$m")"
    cp "$moddir/$m" "$tmp/lib/modules/$m"
    printf '/lib/modules/%s\n' "$m" >>"$tmp/modules"
  done
  cp "$KERNELS_DIR/init" "$tmp/init"
  chmod 755 "$tmp/init"
  (cd "$tmp" && find . | busybox cpio -o -H newc -R 0:0 2>/dev/null | gzip -1) >"$out.tmp" && mv "$out.tmp" "$out"
  local rc=$?
  rm -rf "$tmp"
  return $rc
}
