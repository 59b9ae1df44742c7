"""Generate the Python gRPC stubs for proto/ with grpcio-tools (run by `make proto`).

protoc's virtual include path "gpuslice/proto=proto" makes the generated modules import
each other as `gpuslice.proto...`, the name they are installed under.
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent


def main() -> int:
    protos = sorted(ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as out:
        include = str(pathlib.Path(protoc.__file__).parent / "_proto")
        args = [
            "protoc",
            f"-Igpuslice/proto={ROOT}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *map(str, protos),
        ]
        if protoc.main(args) != 0:
            print("protoc failed for " + ", ".join(p.name for p in protos), file=sys.stderr)
            return 1
        generated = pathlib.Path(out, "gpuslice", "proto")
        for source in generated.rglob("*.py*"):
            target = ROOT / source.relative_to(generated)
            shutil.copyfile(source, target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
