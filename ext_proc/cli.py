"""The ``ice`` command: serve, evaluate, plan, signals, truncate, envoy-config, doctor,
calibrate, prefix-report, demo, dev-backend.

Exit status 2 with a one-line message for bad arguments or a bad policy file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["main"]


def _lab_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("ext_proc.lab") is not None


def _parser() -> argparse.ArgumentParser:
    from ext_proc.admit.backlog import DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MESSAGE_TIMEOUT_S
    from ext_proc.placement.ledger_redis import DEFAULT_DEADLINE_S, DEFAULT_TTL_S

    ap = argparse.ArgumentParser(prog="ice", description="ICE, the Inference Constraint Evaluator")
    sub = ap.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the ext_proc gRPC server")
    s.add_argument("--address", default="127.0.0.1:50051", help="HOST:PORT or unix:PATH")
    s.add_argument("--policy", help="policy YAML (default: the built-in policy)")
    s.add_argument("--workers", type=int, default=1, help="worker processes (ports PORT..PORT+N-1)")
    s.add_argument("--metrics-address", help="HOST:PORT for ICE's own Prometheus /metrics")
    s.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    s.add_argument("--shutdown-grace-s", type=float, default=10.0)
    s.add_argument(
        "--heavy-containers",
        type=int,
        default=20_000,
        help="bodies with more JSON objects/arrays are judged in a helper process",
    )
    s.add_argument(
        "--max-inflight-bytes",
        type=int,
        default=DEFAULT_MAX_INFLIGHT_BYTES,
        help="body bytes a worker asks Envoy for at once; past it, requests are judged from "
        "their headers (docs/flood.md)",
    )
    s.add_argument(
        "--message-timeout-ms",
        type=int,
        default=int(DEFAULT_MESSAGE_TIMEOUT_S * 1000),
        help="Envoy's ext_proc message_timeout (the shipped configs: 1000)",
    )

    s.add_argument(
        "--ledger",
        default=None,
        help="redis://HOST:PORT/DB: the in-flight ledger shared by several ICE replicas "
        "(docs/high-availability.md); default: this host's own",
    )
    s.add_argument(
        "--ledger-deadline-ms",
        type=float,
        default=DEFAULT_DEADLINE_S * 1000,
        help="longest wait on the shared ledger per call; past it, the local ledger",
    )
    s.add_argument(
        "--ledger-ttl-s",
        type=float,
        default=DEFAULT_TTL_S,
        help="a replica that stops renewing its presence this long no longer counts",
    )
    s.add_argument(
        "--leader-elect",
        action="store_true",
        help="active-passive in Kubernetes: gRPC health SERVING only while this pod holds the "
        "Lease (ext_proc/serve/lease.py; needs the k8s extra and --workers 1)",
    )
    s.add_argument("--lease-name", default="ice-leader", help="the Lease (--leader-elect)")
    s.add_argument(
        "--lease-namespace", help="the Lease's namespace (default: env POD_NAMESPACE, the pod's)"
    )

    e = sub.add_parser("evaluate", help="dry-run one request against a policy and a metrics page")
    e.add_argument("request", help="request body JSON file ('-' for stdin)")
    e.add_argument("--policy", help="policy YAML (default: the built-in policy)")
    e.add_argument("--metrics", help="a saved /metrics page or its URL (omit: pressure unknown)")
    e.add_argument("--route", default="", help="route name as Envoy sends it (x-ice-route)")
    e.add_argument("--profile", default="", help="profile name (overrides the route's)")
    e.add_argument("--path", default="/v1/chat/completions")
    e.add_argument("--priority", help="value of the priority header")

    d = sub.add_parser("demo", help="run Envoy + ICE + a local backend and walk through decisions")
    d.add_argument("--no-wait", action="store_true", help="exit after the walk-through")
    d.add_argument(
        "--backend",
        choices=("auto", "vllm", "dev"),
        default="auto",
        help="vllm: a real vLLM (make vllm-install); dev: the test backend; "
        "auto (default): vllm when installed, else dev",
    )

    sub.add_parser(
        "plan", help="KV-cache capacity of one vLLM rank (ice plan --help)", add_help=False
    )
    sub.add_parser(
        "prefix-report",
        help="where recorded requests' prompts diverge and break prefix caching",
        add_help=False,
    )
    sub.add_parser(
        "calibrate",
        help="propose pressure weights/thresholds from a pool's history (ice calibrate --help)",
        add_help=False,
    )
    sub.add_parser(
        "doctor",
        help="check a running deployment (Envoy, ICE, backends) against the production checklist",
        add_help=False,
    )
    sub.add_parser(
        "envoy-config",
        help="write the Envoy, Istio and Envoy Gateway configs from envoy/mesh.yaml",
        add_help=False,
    )
    sub.add_parser(
        "signals",
        help="the normalised signals ICE derives from a /metrics URL or saved page",
        add_help=False,
    )

    sub.add_parser(
        "truncate",
        help="the body semantic truncation would send, and what it drops (ice truncate --help)",
        add_help=False,
    )
    b = sub.add_parser("dev-backend", help="run the local OpenAI/Anthropic test backend")
    b.add_argument("--host", default="127.0.0.1")
    b.add_argument("--port", type=int, default=8000)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plan"]:  # stdlib-only path: `ice plan` answers in well under 300 ms
        from ext_proc.kv.cli import main as plan_main

        return plan_main(argv[1:])
    if argv[:1] == ["signals"]:
        from ext_proc.signals.cli import main as signals_main

        return signals_main(argv[1:])
    if argv[:1] == ["prefix-report"]:
        from ext_proc.prefix.cli import main as prefix_report_main

        return prefix_report_main(argv[1:])
    if argv[:1] == ["calibrate"]:
        from ext_proc.tools.calibrate.cli import main as calibrate_main

        return calibrate_main(argv[1:])
    if argv[:1] == ["doctor"]:
        from ext_proc.tools.doctor import main as doctor_main

        return doctor_main(argv[1:])
    if argv[:1] == ["envoy-config"]:
        from ext_proc.tools.envoygen.cli import main as envoy_config_main

        return envoy_config_main(argv[1:])
    if argv[:1] == ["truncate"]:
        from ext_proc.truncate.cli import main as truncate_main

        return truncate_main(argv[1:])
    args = _parser().parse_args(argv)
    from ext_proc.placement.ledger_redis import LedgerURLError
    from ext_proc.policy.load import PolicyError

    try:
        if args.command == "serve":
            from ext_proc.placement.ledger_redis import check_ledger_url
            from ext_proc.serve.server import ServeOptions, serve

            if args.leader_elect:
                from ext_proc.serve import lease

                if args.workers > 1:
                    print("ice: --leader-elect needs --workers 1 (one vote a pod)", file=sys.stderr)
                    return 2
                try:
                    lease.load_kubernetes()
                except lease.LeaseError as e:
                    print(f"ice: {e}", file=sys.stderr)
                    return 2
            return serve(
                ServeOptions(
                    address=args.address,
                    policy_path=args.policy,
                    workers=max(1, args.workers),
                    metrics_address=args.metrics_address,
                    max_body_bytes=args.max_body_bytes,
                    shutdown_grace_s=args.shutdown_grace_s,
                    heavy_containers=args.heavy_containers,
                    max_inflight_bytes=args.max_inflight_bytes,
                    message_timeout_s=args.message_timeout_ms / 1000,
                    ledger_url=check_ledger_url(args.ledger) if args.ledger else None,
                    ledger_deadline_s=args.ledger_deadline_ms / 1000,
                    ledger_ttl_s=args.ledger_ttl_s,
                    leader_elect=args.leader_elect,
                    lease_name=args.lease_name,
                    lease_namespace=args.lease_namespace,
                )
            )
        if args.command == "evaluate":
            from ext_proc.tools.dryrun import dry_run

            request = (
                sys.stdin.buffer.read() if args.request == "-" else Path(args.request).read_bytes()
            )
            report = dry_run(
                policy_path=args.policy,
                metrics=args.metrics,
                request=request,
                route=args.route,
                path=args.path,
                priority=args.priority,
                profile=args.profile,
            )
            print(json.dumps(report, indent=2, ensure_ascii=False))
            return 0
        if args.command in ("demo", "dev-backend") and not _lab_installed():
            print(
                f"ice: {args.command} is a lab command: it needs a source checkout "
                "(the container image leaves ext_proc/lab out)",
                file=sys.stderr,
            )
            return 2
        if args.command == "demo":
            from ext_proc.lab.demo import run_demo

            return int(run_demo(wait=not args.no_wait, backend=args.backend))
        if args.command == "dev-backend":
            from ext_proc.lab.devbackend import main as backend_main

            backend_main(["--host", args.host, "--port", str(args.port)])
            return 0
    except PolicyError as e:
        print(f"ice: invalid policy: {e}", file=sys.stderr)
        return 2
    except LedgerURLError as e:
        print(f"ice: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ice: {e}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
