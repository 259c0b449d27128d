"""Regenerate the harness service's gRPC code: ``python -m kvhandoff.conformance.proto.build [OUT_DIR]``
(default: conformance/proto/gen; `make proto` runs it). Same recipe as impl/proto/build.py:
the generated service module imports its messages as ``conformance.proto.gen.kvhandoff...``."""

from __future__ import annotations

import sys
from pathlib import Path

from kvhandoff.impl.proto.build import generate_proto

PROTO_ROOT = Path(__file__).resolve().parent
PROTO_FILE = "kvhandoff/harness/v1/harness.proto"
PACKAGE = "kvhandoff.conformance.proto.gen"


def generate(out_dir: Path) -> list[Path]:
    return generate_proto(PROTO_ROOT, PROTO_FILE, PACKAGE, out_dir)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT / "gen"
    for path in generate(target):
        print(path)
