"""Split rendered Kubernetes manifests for the validators (deploy/validate.sh).

Built-in kinds go to OUT/builtin.yaml for kubernetes-validate (it has no
schemas for custom resources). Each custom resource goes to its own file and
is printed as `SCHEMA<TAB>FILE` for check-jsonschema, with the schema from
CUSTOM_SCHEMAS. A custom kind with no schema there is an error, never skipped.

usage: split_manifests.py RENDERED.yaml OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
# apiVersion/kind → JSON Schema for the fields we use (strict: unknown fields fail).
CUSTOM_SCHEMAS = {
    "monitoring.coreos.com/v1/ServiceMonitor": SCHEMAS / "servicemonitor.schema.json",
}
# Groups kubernetes-validate knows (core is the empty group).
BUILTIN_GROUPS = {
    "",
    "apps",
    "autoscaling",
    "batch",
    "policy",
    "networking.k8s.io",
    "rbac.authorization.k8s.io",
}


def main(rendered: str, out_dir: str) -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    builtin = []
    for n, doc in enumerate(d for d in yaml.safe_load_all(Path(rendered).read_text()) if d):
        api, kind = doc["apiVersion"], doc["kind"]
        group = api.rpartition("/")[0]
        if group in BUILTIN_GROUPS:
            builtin.append(doc)
            continue
        schema = CUSTOM_SCHEMAS.get(f"{api}/{kind}")
        if schema is None:
            print(f"{rendered}: no schema for custom resource {api} {kind}", file=sys.stderr)
            return 1
        path = out / f"{n:03d}-{kind}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        print(f"{schema}\t{path}")
    (out / "builtin.yaml").write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
