#!/usr/bin/env bash
# Generate every language's stubs with buf.gen.yaml (local plugins only) and
# check what can be checked offline: the Python stubs import and serve the
# same services as the committed ones; the TypeScript compiles (tsc --strict).
# Go and Java are generated, not compiled here (no Go/Java toolchain in CI).
# Needs: Debian protobuf-compiler protobuf-compiler-grpc protoc-gen-go
# protoc-gen-go-grpc protobuf-compiler-grpc-java-plugin; `npm ci` in protos/.
set -euo pipefail
cd "$(dirname "$0")"
BIN="${VENV_BIN:-../.venv/bin}"
"$BIN/buf" generate
for f in ../gen/go/fairgate/v1/{admin,inference}{.pb.go,_grpc.pb.go} \
  ../gen/java/dev/fairgate/v1/{AdminServiceGrpc,InferenceServiceGrpc}.java \
  ../gen/ts/fairgate/v1/{admin,inference}_pb.ts; do
  test -s "$f" || { echo "missing stub: $f" >&2; exit 1; }
done
PYTHONPATH=../gen/python "$BIN/python" - <<'PY'
import sys
sys.modules.pop("fairgate", None)
from fairgate.v1 import admin_pb2_grpc, inference_pb2, inference_pb2_grpc  # noqa: F401
assert inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].methods_by_name["Generate"]
assert hasattr(admin_pb2_grpc, "AdminServiceStub") and hasattr(inference_pb2_grpc, "InferenceServiceStub")
PY
# A copy under protos/ so that its imports resolve to protos/node_modules
# (never a link into gen/: `buf generate` cleans gen/ and would follow it).
rm -rf .tscheck && cp -r ../gen/ts .tscheck
trap 'rm -rf .tscheck' EXIT
node_modules/.bin/tsc --noEmit --strict --target es2020 --module nodenext \
  --moduleResolution nodenext .tscheck/fairgate/v1/*.ts
echo "stubs: python, go, typescript, java generated; python imports, typescript compiles"
