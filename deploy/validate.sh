#!/usr/bin/env bash
# Validate the deployment files offline with validators installed from the
# project's dev extra: yamllint (syntax and style), check-jsonschema with its
# bundled Compose Specification schema, and kubernetes-validate with its
# bundled Kubernetes OpenAPI schemas (strict: unknown fields are errors).
set -euo pipefail
cd "$(dirname "$0")"
BIN="${VENV_BIN:-../.venv/bin}"
K8S_VERSION="${K8S_VERSION:-1.30.0}"

"$BIN/yamllint" --strict -c .yamllint.yaml .
"$BIN/check-jsonschema" --builtin-schema vendor.compose-spec compose.yaml
"$BIN/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" k8s/*.yaml
echo "deploy: yamllint, compose schema and Kubernetes $K8S_VERSION schemas passed"
