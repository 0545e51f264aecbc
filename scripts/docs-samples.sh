#!/usr/bin/env bash
# scripts/docs-samples.sh [--write]: docs/operations.md's sample outputs of `natguard status`,
# `natguard status --json` and `natguard metrics` are what the demo (scripts/demo.sh) prints
# at its step 6, so they cannot go stale. Runs the demo with NG_DEMO_SAMPLES, then compares
# each output with the fenced block after its marker in docs/operations.md
# (`<!-- sample: status -->`, `<!-- sample: status-json -->`, `<!-- sample: metrics -->`),
# both normalised: every number, veth name and policy fingerprint stands for any other (the
# counters of a run depend on its timing; what goes stale is the shape: the lines, their words,
# the labels and the keys).
#
#   scripts/docs-samples.sh           compare; exit 1 (with a diff) if a sample is stale
#   scripts/docs-samples.sh --write   put this run's outputs into docs/operations.md
#
# Root (the demo creates network namespaces); about a minute. NG_DEMO_SAMPLES_DIR=DIR compares
# the samples a demo run saved there (NG_DEMO_SAMPLES) instead of running the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d /tmp/ng-docs-samples.XXXXXX)
trap 'rm -rf "$out"' EXIT
# NG_DEMO_SAMPLES_DIR: the samples of a demo run already made (scripts/test.sh's demo layer).
samples=${NG_DEMO_SAMPLES_DIR:-$out/samples}
if [ -z "${NG_DEMO_SAMPLES_DIR:-}" ]; then
  NG_DEMO_SAMPLES=$samples scripts/demo.sh </dev/null >"$out/demo.log" 2>&1 || {
    tail -40 "$out/demo.log" >&2
    echo "scripts/docs-samples.sh: the demo failed" >&2
    exit 1
  }
fi
/usr/bin/python3 - "$samples" docs/operations.md "${1:-}" <<'PY'
import difflib, re, sys
samples, doc_path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
doc = open(doc_path).read()
files = {"status": "status.txt", "status-json": "status.json", "metrics": "metrics.txt"}
def norm(text):
    text = re.sub(r"veth[0-9a-f]{8}", "vethX", text)
    text = re.sub(r"\b[0-9a-f]{16}\b", "FINGERPRINT", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return [l.rstrip() for l in text.strip("\n").splitlines()]
bad = 0
for name, f in files.items():
    got = open(f"{samples}/{f}").read()
    m = re.search(r"<!-- sample: %s -->\n(```[a-z]*\n)(.*?)```" % re.escape(name), doc, re.S)
    if not m:
        print(f"FAIL docs/operations.md has no <!-- sample: {name} --> block")
        bad = 1
        continue
    if mode == "--write":
        doc = doc[: m.start(2)] + got.rstrip("\n") + "\n" + doc[m.end(2):]
        print(f"wrote {name}")
        continue
    if norm(m.group(2)) == norm(got):
        print(f"ok   docs/operations.md's {name} sample is what the demo prints")
    else:
        print(f"FAIL docs/operations.md's {name} sample differs from the demo's (run scripts/docs-samples.sh --write):")
        sys.stdout.writelines(l + "\n" for l in difflib.unified_diff(norm(m.group(2)), norm(got), "docs", "demo", lineterm=""))
        bad = 1
if mode == "--write":
    open(doc_path, "w").write(doc)
sys.exit(bad)
PY
