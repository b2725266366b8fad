"""``dataref serve | doctor | export | demo``: the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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

    sub.add_parser("doctor", help="check the kernel sandbox and that every SQL source is reachable")

    export = sub.add_parser("export", help="write a notebook's data-free .ipynb")
    export.add_argument("notebook", help="notebook handle (nb_...), or 'default'")
    export.add_argument("--out", help="file to write (default: ./<handle>.ipynb; '-': stdout)")
    export.add_argument("--owner", help="whose notebook (operators; default: the local user)")

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
        return serve(settings, http=args.http, host=args.host, port=args.port)
    if args.command == "doctor":
        return doctor(settings)
    if args.command == "export":
        from .notebook_export import cli_export

        return cli_export(settings, args.notebook, args.out, args.owner)
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
    mcp = create_app(settings, "http")
    mcp.run(
        transport="http",
        host=host or settings.server.host,
        port=port if port is not None else settings.server.port,
        path="/mcp",
        show_banner=False,
        host_origin_protection="auto",  # DNS rebinding: refuse foreign Host/Origin on loopback
    )
    return 0


def announce_sandbox(settings: Settings) -> None:
    if settings.kernels.sandbox == "unsandboxed":
        print(
            "dataref: WARNING: kernels run UNSANDBOXED (kernels.sandbox = 'unsandboxed'): "
            "agent code runs as this user with network and file access. "
            "Use only for trusted, single-user development.",
            file=sys.stderr,
        )


def doctor(settings: Settings) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
