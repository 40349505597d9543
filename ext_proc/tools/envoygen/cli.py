"""``ice envoy-config [--spec envoy/mesh.yaml] [--out DIR] [--check]``.

Writes every Envoy-facing file from the spec (``envoy/mesh.yaml`` by default; the files go
beside it unless ``--out``): ``envoy.yaml``, ``bench.yaml``,
``k8s/overlays/istio/generated/istio.yaml``,
``k8s/overlays/envoy-gateway/generated/envoy-gateway.yaml``. All are built before any is
written: a bad spec writes nothing. ``--check`` writes nothing and exits 1 naming the files
that differ from what the spec gives (a test runs it on the checked-in files).

Exit status: 0 done (or up to date), 1 ``--check`` found stale files, 2 a bad spec.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ext_proc.tools.envoygen.spec import SpecError, load_spec

__all__ = ["main", "render_all"]

DEFAULT_SPEC = Path("envoy/mesh.yaml")


def render_all(spec_path: Path) -> dict[str, str]:
    """Relative path → file text, for every generated file."""
    from ext_proc.tools.envoygen import gateway, istio
    from ext_proc.tools.envoygen.emit import to_yaml
    from ext_proc.tools.envoygen.local import bench_bootstrap, local_bootstrap

    spec = load_spec(spec_path)
    return {
        "envoy.yaml": to_yaml([local_bootstrap(spec)], local_header()),
        "bench.yaml": to_yaml([bench_bootstrap(spec)], bench_header()),
        "k8s/overlays/istio/generated/istio.yaml": to_yaml(istio.objects(spec), istio.HEADER),
        "k8s/overlays/envoy-gateway/generated/envoy-gateway.yaml": to_yaml(
            gateway.objects(spec), gateway.HEADER
        ),
    }


def local_header() -> list[str]:
    return [
        "Envoy bootstrap for ICE's local stack (make demo, the e2e tests):",
        "  client → 127.0.0.1:10000 (Envoy) → ext_proc ICE 127.0.0.1:50051",
        "         → backend 127.0.0.1:8000",
        "Closed by default: the judged endpoints (through ICE), the read-only paths (GET/HEAD,",
        "ICE off), and Envoy's own 404 in the OpenAI error format for anything else (route",
        "`closed`; docs/endpoints.md). Why each piece is there: ext_proc/tools/envoygen/",
        "pieces.py and local.py. Tests and the demo render it with other ports",
        "(ext_proc/lab/stack.py).",
    ]


def bench_header() -> list[str]:
    return [
        "Envoy bootstrap for ICE's throughput benchmark (bench/throughput.py, `make bench`):",
        "  wrk → ingress 127.0.0.1:10100 → (x-bench-route: direct, ICE off | ICE 127.0.0.1:50151)",
        "      → fast_upstream 127.0.0.1:10101 (a static inference server inside Envoy)",
        "The HCM filters and the `ice` cluster are envoy.yaml's: the benchmark measures the",
        "production configuration. Run Envoy with `--concurrency 1` on a 2-core machine.",
    ]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ice envoy-config", description=__doc__.split("\n")[0])
    ap.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="default: envoy/mesh.yaml")
    ap.add_argument("--out", type=Path, help="folder for the files (default: the spec's)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when stale")
    args = ap.parse_args(argv)
    try:
        files = render_all(args.spec)
    except SpecError as e:
        print(f"ice envoy-config: {e}", file=sys.stderr)
        return 2
    out = args.out or args.spec.parent
    if args.check:
        stale = [
            name
            for name, text in files.items()
            if not (out / name).is_file() or (out / name).read_text() != text
        ]
        for name in stale:
            print(f"stale: {out / name} (run `ice envoy-config`)", file=sys.stderr)
        return 1 if stale else 0
    for name, text in files.items():
        _write(out / name, text)
        print(out / name)
    return 0
