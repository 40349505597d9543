"""Compile ``protos/`` into ``ext_proc/_pb`` with grpcio-tools (and mypy-protobuf stubs).

Run by ``make protos``; the output is committed so that installing ICE needs no compiler.
``generate(out_dir)`` is also used by a test that checks the committed files are current.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["PROTO_FILES", "ROOT", "generate"]

ROOT = Path(__file__).resolve().parents[2]
PROTO_FILES = ("ice/policy/v1/policy.proto",)


def generate(out_dir: Path) -> None:
    """Write ``<name>_pb2.py`` and ``.pyi`` for each proto into ``out_dir`` (flat)."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    out_dir.mkdir(parents=True, exist_ok=True)
    for rel in PROTO_FILES:
        src = ROOT / "protos" / rel
        args = [
            "protoc",
            f"-I{src.parent}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
            f"--mypy_out={out_dir}",
            str(src),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {rel}")


if __name__ == "__main__":
    generate(ROOT / "ext_proc" / "_pb")
    sys.exit(0)
