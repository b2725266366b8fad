"""``dataref view`` and ``dataref lab``: the page and JupyterLab over a local state dir.

``view`` serves the page's routes over the state dir a stdio server writes, on 127.0.0.1,
for the local owner, like ``jupyter lab``: a fresh token in the printed URL signs the browser
in (a session cookie), and any request without the token or that session is refused. The
live feed notices the stdio server's writes by polling (it is another process).

``lab`` exports a notebook (data-free) and opens JupyterLab on it, ready to run top to bottom.
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from ..config import Settings, local_user

TOKEN_BYTES = 24


def view_app(settings: Settings, token: str) -> object:
    """The Starlette app of ``dataref view`` (the workspace opened without kernels)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    from ..workspace import Workspace
    from .page import Page
    from .views import routes

    owner = settings.owner or local_user()
    holder: dict[str, Workspace] = {}

    async def check(sent: str) -> str | None:
        return owner if hmac.compare_digest(sent.encode(), token.encode()) else None

    def workspace() -> Workspace:
        return holder["ws"]

    @asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[None]:
        holder["ws"] = Workspace(settings)
        try:
            yield
        finally:
            await holder.pop("ws").close()

    page = Page(settings, workspace, check, mode="view")
    # DNS rebinding: only requests addressed to the loopback names reach the routes.
    hosts = Middleware(TrustedHostMiddleware, allowed_hosts=["127.0.0.1", "localhost", "[::1]"])
    return Starlette(routes=routes(page), middleware=[hosts], lifespan=lifespan)


def run_view(settings: Settings, port: int, *, open_browser: bool = False) -> int:
    import uvicorn

    token = secrets.token_urlsafe(TOKEN_BYTES)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(128)  # a browser opening the URL at once waits in the backlog
    except OSError as exc:
        print(f"dataref: cannot listen on 127.0.0.1:{port}: {exc.strerror}", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/?token={token}"
    print(f"dataref view of {settings.state_dir}\n    {url}\n(Ctrl-C to stop)", flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(view_app(settings, token), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def lab_command(
    settings: Settings, notebook: str | None, directory: Path, extra: Sequence[str]
) -> tuple[Path, list[str]]:
    """Export the notebook into ``directory``; the ``jupyter lab`` command that opens it."""
    from ..notebook_export import export_notebook, write_notebook
    from ..transcript import Transcripts

    owner = settings.owner or local_user()
    if not (settings.state_dir / "notebooks" / "notebooks.sqlite").is_file():
        raise LookupError(f"no notebooks under {settings.state_dir}")
    transcripts = Transcripts(settings.state_dir / "notebooks")
    try:
        if notebook in (None, "", "default"):
            handle = transcripts.default(owner, create=False)
        else:
            handle = transcripts.resolve(owner, notebook)
        exported = export_notebook(transcripts, owner, handle)
        path = write_notebook(exported, directory / f"{handle}.ipynb")
    finally:
        transcripts.close()
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or shutil.which(
        "jupyter"
    )
    if jupyter is None:
        raise LookupError("JupyterLab is not installed here - pip install jupyterlab")
    argv = [jupyter, "lab", f"--ServerApp.root_dir={directory}", *extra, path.name]
    return path, argv


def run_lab(settings: Settings, notebook: str | None, directory: str, extra: Sequence[str]) -> int:
    from ..errors import DatarefError

    try:
        path, argv = lab_command(settings, notebook, Path(directory).resolve(), extra)
    except (LookupError, DatarefError) as exc:
        print(f"dataref: {exc}", file=sys.stderr)
        return 1
    print(
        f"dataref: exported {path} (no data); opening JupyterLab: Run > Run All Cells replays it",
        flush=True,
    )
    os.chdir(path.parent)
    os.execv(argv[0], argv)  # JupyterLab takes this process over: stopping it stops JupyterLab
    return 0  # not reached
