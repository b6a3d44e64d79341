"""Generate controlplane/api/v1 from proto/controlplane/v1 (run by `make proto`).

protoc writes `from controlplane.v1 import ...`, which would resolve against this project's own
`controlplane` package; the generated imports are rewritten to `controlplane.api.v1`. With --check the
generated files are compared with the committed ones instead of written (exit 1 when stale).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
TARGET = ROOT / "controlplane" / "api" / "v1"
_INIT = '"""Generated from proto/controlplane/v1 by tools/gen_proto.py; do not edit."""\n'


def generate(out_dir: Path) -> None:
    """Write the generated modules for every .proto file into out_dir."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    grpc_include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as raw:
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{grpc_include}", f"--python_out={raw}", f"--pyi_out={raw}",
                f"--grpc_python_out={raw}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        for path in sorted((Path(raw) / "controlplane" / "v1").iterdir()):
            text = path.read_text().replace("from controlplane.v1 import", "from controlplane.api.v1 import")
            (out_dir / path.name).write_text(text)
        (out_dir / "__init__.py").write_text(_INIT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare with the committed files")
    args = parser.parse_args()
    if not args.check:
        if TARGET.exists():
            shutil.rmtree(TARGET)
        generate(TARGET)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "v1"
        generate(fresh)
        names = sorted(p.name for p in fresh.iterdir())
        committed = sorted(p.name for p in TARGET.iterdir() if p.suffix in (".py", ".pyi")) if TARGET.exists() else []
        _match, mismatch, errors = filecmp.cmpfiles(fresh, TARGET, names, shallow=False)
        if mismatch or errors or names != committed:
            print(f"controlplane/api/v1 is stale against proto/ (differs: {mismatch + errors}); run `make proto`",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
