"""``dataref serve | doctor | export | exposure | demo``: the command line."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .config import Settings, load_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dataref",
        description="dataref: an MCP server that lets an AI agent analyse data by reference "
        "(rows stay on the server; the model gets shapes and small results).",
    )
    parser.add_argument("--config", help="TOML config file (default: $DATAREF_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the MCP server (stdio unless --http)")
    serve.add_argument("--http", action="store_true", help="streamable HTTP at /mcp")
    serve.add_argument("--host", help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8000)")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="HTTP server processes sharing the port and the state (default 1)",
    )

    sub.add_parser("doctor", help="check the kernel sandbox and that every SQL source is reachable")

    export = sub.add_parser("export", help="write a notebook's data-free .ipynb")
    export.add_argument("notebook", help="notebook handle (nb_...), or 'default'")
    export.add_argument("--out", help="file to write (default: ./<handle>.ipynb; '-': stdout)")
    export.add_argument("--owner", help="whose notebook (operators; default: the local user)")

    spec = sub.add_parser("kernelspec", help="the sandboxed kernel for a Jupyter gateway host")
    spec_sub = spec.add_subparsers(dest="spec_command", required=True)
    spec_install = spec_sub.add_parser("install", help="install the 'dataref' kernelspec")
    where = spec_install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="into the user's Jupyter data dir")
    where.add_argument("--prefix", help="into PREFIX/share/jupyter/kernels (e.g. a venv)")
    spec_install.add_argument("--name", default="dataref", help="kernelspec name")
    spec_install.add_argument("--uid-base", type=int, help="first host uid of its kernels")
    spec_install.add_argument("--state-dir", help="where its kernels' directories go")
    exposure = sub.add_parser(
        "exposure", help="what of each source reached the model, per owner (exposure ledger)"
    )
    exposure.add_argument("--owner", help="only this owner")
    exposure.add_argument("--source", help="only this source ('-': replies of no source)")
    exposure.add_argument("--since", help="only replies from this ISO date/time (UTC) on")
    exposure.add_argument("--json", action="store_true", help="print JSON instead of a table")
    exposure.add_argument(
        "--check", action="store_true", help="exit 1 when an owner has spent a daily budget"
    )

    demo = sub.add_parser("demo", help="run the article's session through a real MCP client")
    demo.add_argument("--out", default="demo-output", help="where the notebook and chart go")
    demo.add_argument("--state-dir", help="server state dir (default: a new temporary one)")
    demo.add_argument("--json", action="store_true", help="print a JSON summary instead")

    view = sub.add_parser("view", help="the page for people over a stdio server's state dir")
    view.add_argument("--state-dir", help="the server's state dir (default: from the config)")
    view.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    view.add_argument("--open", action="store_true", help="open the URL in a browser")

    lab = sub.add_parser("lab", help="open a notebook's data-free export in JupyterLab")
    lab.add_argument("notebook", nargs="?", help="notebook handle (default: your default one)")
    lab.add_argument("--state-dir", help="the server's state dir (default: from the config)")
    lab.add_argument("--dir", default=".", help="where the .ipynb goes (default: here)")
    lab.epilog = "Arguments after -- go to jupyter lab (e.g. -- --no-browser --port 8890)."
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passed_on: list[str] = []  # `dataref lab ... -- ARGS`: ARGS are jupyter lab's
    if "--" in argv and "lab" in argv[: argv.index("--")]:
        argv, passed_on = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    args = build_parser().parse_args(argv)
    args.jupyter_args = passed_on
    try:
        own_state = args.command in ("view", "lab") and args.state_dir
        overrides = {"state_dir": args.state_dir} if own_state else {}
        settings = load_settings(args.config, **overrides)
    except (FileNotFoundError, ValueError) as exc:
        print(f"dataref: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        if args.workers != 1:
            return serve_workers(settings, http=args.http, host=args.host, port=args.port,
                                 workers=args.workers)  # fmt: skip
        return serve(settings, http=args.http, host=args.host, port=args.port)
    if args.command == "doctor":
        return doctor(settings)
    if args.command == "export":
        from .notebook_export import cli_export

        return cli_export(settings, args.notebook, args.out, args.owner)
    if args.command == "kernelspec":
        return kernelspec_install(args)
    if args.command == "exposure":
        from .exposure import cli_exposure

        return cli_exposure(settings, args)
    if args.command == "demo":
        from .walkthrough import run_demo

        return run_demo(args.config, args.out, args.state_dir, as_json=args.json)
    if args.command in ("view", "lab"):
        return page_command(settings, args)
    return 2


def page_command(settings: Settings, args: argparse.Namespace) -> int:
    from .web.standalone import run_lab, run_view

    if args.command == "view":
        return run_view(settings, args.port, open_browser=args.open)
    return run_lab(settings, args.notebook, args.dir, args.jupyter_args)


def serve(settings: Settings, *, http: bool, host: str | None, port: int | None) -> int:
    from .app import create_app
    from .logs import configure_logging

    configure_logging(settings)
    announce_sandbox(settings)
    if not http:
        create_app(settings, "stdio").run(show_banner=False)
        return 0
    if not (settings.auth.tokens or settings.auth.jwks_uri or settings.auth.public_key):
        print(
            "dataref: refusing to serve HTTP without authentication - set [auth] tokens "
            "or jwks_uri/issuer/audience (see README)",
            file=sys.stderr,
        )
        return 2
    if settings.state.url and not settings.store.blobs:
        print(
            "dataref: note: state.url is shared but store.blobs is not set - artifact bytes stay "
            "in this server's state_dir, so other replicas cannot read them",
            file=sys.stderr,
        )
    mcp = create_app(settings, "http")
    # uvicorn re-raises a SIGTERM once it has stopped serving, before the app's lifespan
    # ends: unwinding from here closes the workspace (kernels, transcripts) first.
    signal.signal(signal.SIGTERM, _unwind)
    with contextlib.suppress(KeyboardInterrupt):
        _run_http(mcp, settings, host, port)
    return 0


def _unwind(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_http(mcp: Any, settings: Settings, host: str | None, port: int | None) -> None:
    from .edge import http_middleware

    mcp.run(
        transport="http",
        host=host or settings.server.host,
        port=port if port is not None else settings.server.port,
        path="/mcp",
        show_banner=False,
        host_origin_protection="auto",  # DNS rebinding: refuse foreign Host/Origin on loopback
        middleware=http_middleware(mcp),  # 401/403 become audit events
        uvicorn_config={"log_config": None},  # its log lines go through our JSON handler
        # Shared state (replicas): no call may need the process that answered the last one.
        stateless_http=settings.state.url is not None or None,
    )


def kernelspec_install(args: argparse.Namespace) -> int:
    from .kernels.kernelspec import install

    path = install(
        user=args.user,
        prefix=args.prefix,
        name=args.name,
        config=args.config,
        uid_base=args.uid_base,
        state_dir=args.state_dir,
    )
    print(f"installed kernelspec {args.name!r} in {path}")
    return 0


def serve_workers(
    settings: Settings, *, http: bool, host: str | None, port: int | None, workers: int
) -> int:
    """``serve --http --workers N``: N processes on one socket, sharing the state."""
    from .workers import serve_workers as run

    if not http or workers < 1:
        print("dataref: --workers N needs --http and N >= 1", file=sys.stderr)
        return 2
    if not (settings.auth.tokens or settings.auth.jwks_uri or settings.auth.public_key):
        print(
            "dataref: refusing to serve HTTP without authentication (see README)", file=sys.stderr
        )
        return 2
    announce_sandbox(settings)
    port = port if port is not None else settings.server.port
    return run(settings, host or settings.server.host, port, workers)


def announce_sandbox(settings: Settings) -> None:
    if settings.kernels.sandbox == "unsandboxed":
        print(
            "dataref: WARNING: kernels run UNSANDBOXED (kernels.sandbox = 'unsandboxed'): "
            "agent code runs as this user with network and file access. "
            "Use only for trusted, single-user development.",
            file=sys.stderr,
        )


def doctor(settings: Settings) -> int:
    if settings.kernels.gateway_url:
        return doctor_gateway(settings)
    from .kernels import check_sandbox

    report = check_sandbox(settings)
    print(f"sandbox mode: {report.mode}")
    for line in report.details:
        print(f"  ok: {line}")
    for line in report.problems:
        print(f"  PROBLEM: {line}")
    print("sandbox works" if report.ok else "sandbox does NOT work here")
    from .producers.health import check_sources

    print("sources:")
    sources_ok = check_sources(settings)
    return 0 if report.ok and sources_ok else 1


def doctor_gateway(settings: Settings) -> int:
    """Kernels run on a gateway: check it (the gateway host checks its own sandbox with
    `dataref doctor` there)."""
    from .kernels.gwkernel import check_gateway

    problem = check_gateway(settings)
    print(f"kernels: on the gateway {settings.kernels.gateway_url}")
    print(f"  PROBLEM: {problem}" if problem else "  ok: it answers and has the kernelspec")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
