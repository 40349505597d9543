"""``ice doctor``: check a running deployment against the production checklist, from outside.

    ice doctor --envoy-admin http://127.0.0.1:9901 --ice 127.0.0.1:50051 \\
        [--ice-metrics http://127.0.0.1:9000/metrics] [--policy policy.yaml] [--json]

Reads Envoy's admin ``/config_dump`` and ``/clusters``, ICE's gRPC health and metrics, and
each backend's ``/metrics`` (the pools of ``--policy``, default ICE's built-in policy);
prints one line per check, ``PASS|WARN|FAIL|MANUAL  name  detail (fix: ...)``, or with
``--json`` a JSON list of ``{status, name, detail, fix}``. docs/doctor.md lists the checks.

Exit status: 1 when any check FAILs (an unreachable endpoint is a FAIL naming why), else 0;
2 for bad arguments, an invalid policy or mesh spec.

Invariants: no traceback for anything the deployment does: each part (Envoy, ICE, backends)
that breaks unexpectedly becomes one FAIL ``<part>.doctor_error`` and the others still run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from ext_proc.tools.doctor.checks import Check, exit_status, fail, render_json, render_text

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ice doctor",
        description="Check a running ICE deployment (Envoy, ICE, backends) against the "
        "production checklist.",
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--envoy-admin", metavar="URL", help="Envoy's admin address")
    where.add_argument(
        "--config-dump",
        metavar="FILE",
        type=Path,
        help="instead of --envoy-admin: a saved /config_dump (JSON) or an Envoy bootstrap",
    )
    ap.add_argument(
        "--ice",
        metavar="HOST:PORT",
        action="append",
        required=True,
        help="an ICE worker's gRPC address (repeat for each worker)",
    )
    ap.add_argument("--ice-metrics", metavar="URL", help="ICE's /metrics (--metrics-address)")
    ap.add_argument("--policy", metavar="P", help="ICE's policy file (default: the built-in one)")
    ap.add_argument(
        "--mesh",
        metavar="FILE",
        type=Path,
        help="the mesh spec naming the judged paths "
        "(default: envoy/mesh.yaml of this checkout, else ICE's judged endpoints)",
    )
    ap.add_argument(
        "--host",
        help="the Host clients send (default: the mesh spec's first gateway host, else the "
        "'*' virtual host)",
    )
    ap.add_argument("--timeout", type=float, default=3.0, help="per request, seconds")
    ap.add_argument("--json", action="store_true", help="a JSON list instead of lines")
    return ap


def _url(value: str | None) -> str | None:
    """``host:port/path`` → ``http://host:port/path`` (a scheme given is kept)."""
    return value if value is None or "://" in value else f"http://{value}"


def _guarded(part: str, run: Callable[[], list[Check]]) -> list[Check]:
    try:
        return run()
    except Exception as e:  # a shape the doctor did not foresee: report it, go on
        return [
            fail(
                f"{part}.doctor_error",
                f"the {part} checks stopped: {type(e).__name__}: {e}",
                "report this with the input (e.g. the config_dump) to ICE's maintainers",
            )
        ]


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2

    from ext_proc.policy.load import PolicyError, default_policy_text, load_policy
    from ext_proc.tools.doctor.backend import backend_checks
    from ext_proc.tools.doctor.dump import from_bootstrap, from_config_dump
    from ext_proc.tools.doctor.envoy import envoy_checks, view_checks
    from ext_proc.tools.doctor.envoy_mesh import node_of
    from ext_proc.tools.doctor.expect import expected
    from ext_proc.tools.doctor.fetch import http_get
    from ext_proc.tools.doctor.ice import health_checks, metrics_checks
    from ext_proc.tools.doctor.manual import manual_checks
    from ext_proc.tools.envoygen.spec import SpecError

    try:
        policy = load_policy(args.policy)
        data = Path(args.policy).read_bytes() if args.policy else default_policy_text().encode()
        ex = expected(policy, args.policy or "built-in default", data, args.mesh)
    except (PolicyError, OSError) as e:
        print(f"ice doctor: invalid policy: {e}", file=sys.stderr)
        return 2
    except SpecError as e:
        print(f"ice doctor: invalid mesh spec: {e}", file=sys.stderr)
        return 2

    timeout_s = args.timeout
    checks: list[Check] = []
    if args.envoy_admin:
        admin = _url(args.envoy_admin) or ""
        checks += _guarded("envoy", lambda: envoy_checks(admin, ex, http_get, timeout_s, args.host))
    else:
        try:
            text = args.config_dump.read_text("utf-8")
            try:
                doc = json.loads(text)  # a dump (fast); else a YAML bootstrap
            except ValueError:
                doc = yaml.safe_load(text)
        except (OSError, yaml.YAMLError) as e:
            print(f"ice doctor: cannot read {args.config_dump}: {e}", file=sys.stderr)
            return 2
        doc = doc if isinstance(doc, dict) else {}
        view = from_config_dump(doc) if "configs" in doc else from_bootstrap(doc)
        node = node_of(doc)
        checks += _guarded("envoy", lambda: view_checks(view, ex, args.host, node))
    checks += _guarded("ice", lambda: health_checks(args.ice, timeout_s))
    metrics_url = _url(args.ice_metrics)
    checks += _guarded("ice", lambda: metrics_checks(metrics_url, ex, http_get, timeout_s))
    checks += _guarded("backend", lambda: backend_checks(ex, http_get, timeout_s))
    checks += manual_checks()
    print(render_json(checks) if args.json else render_text(checks))
    return exit_status(checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
