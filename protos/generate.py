"""Generate the Python code for protos/fairgate/** into clients/fairgate/.

One script, one source of truth: `python protos/generate.py` rewrites the
committed code; `python protos/generate.py --check` exits 1 when the
committed code has drifted from the .proto files (CI and a test run it).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
OUT_ROOT = REPO_ROOT / "clients"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _protos() -> list[Path]:
    return sorted(PROTO_ROOT.glob("fairgate/**/*.proto"))


def _generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # dev dependency, imported only here

    include = Path(protoc.__file__).resolve().parent / "_proto"
    # mypy-protobuf's protoc plugins live beside the interpreter.
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(p.relative_to(PROTO_ROOT)) for p in _protos()),
    ]
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    return sorted(p for p in out_dir.rglob("*") if p.name.endswith(SUFFIXES))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed code drifted")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        generated = _generate(tmp_dir)
        drift: list[str] = []
        for src in generated:
            rel = src.relative_to(tmp_dir)
            dst = OUT_ROOT / rel
            if ns.check:
                if not dst.exists() or not filecmp.cmp(src, dst, shallow=False):
                    drift.append(str(rel))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        if ns.check:
            expected = {str(p.relative_to(tmp_dir)) for p in generated}
            for stale in (OUT_ROOT / "fairgate").rglob("*"):
                rel = str(stale.relative_to(OUT_ROOT))
                if stale.name.endswith(SUFFIXES) and rel not in expected:
                    drift.append(f"{rel} (no .proto source)")
            if drift:
                print("generated code drifted from protos/; run `python protos/generate.py`:")
                print("\n".join(f"  {d}" for d in drift))
                return 1
            print(f"generated code is up to date ({len(generated)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
