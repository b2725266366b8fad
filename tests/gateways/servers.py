"""Real Jupyter Kernel Gateway and Enterprise Gateway processes for the tests and the bench.

``tests/gateways/setup.sh`` installs them into venvs of their own (.gateways/kg, .gateways/eg);
``start_gateway`` installs the ``dataref`` kernelspec (through dataref's own CLI) into a temp
dir, starts the gateway on 127.0.0.1 with a token and waits until it answers.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
VENVS = ROOT / ".gateways"
KINDS = ("kg", "eg")
# Owners the tests use; Enterprise Gateway refuses every other KERNEL_USERNAME (and root).
SESSIONS = ("article", "chain", "failed-then-fixed", "reset", "restart")  # test_transcript's
USERS = ("dataref", "analyst", "alice", "bob", *(f"owner-{name}" for name in SESSIONS))


@dataclass
class Gateway:
    kind: str
    url: str
    token: str
    process: subprocess.Popen
    log: Path
    state_dir: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def kernels_settings(self, **extra: object) -> dict[str, object]:
        return {"gateway_url": self.url, "gateway_token": self.token, **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(kind: str) -> Path:
    name = "jupyter-kernelgateway" if kind == "kg" else "jupyter-enterprisegateway"
    path = VENVS / kind / "bin" / name
    if not path.exists():
        raise RuntimeError(f"{path} is missing - run tests/gateways/setup.sh (make gateways)")
    return path


def install_kernelspec(base: Path, uid_base: int) -> Path:
    """dataref's kernelspec under ``base`` (a JUPYTER_PATH entry); its kernels keep their
    directories in ``base/state`` and use uids from ``uid_base``."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "dataref.cli",
            "kernelspec",
            "install",
            "--prefix",
            str(base),
            "--uid-base",
            str(uid_base),
            "--state-dir",
            str(base / "state"),
        ],
        check=True,
        capture_output=True,
    )
    return base / "share" / "jupyter"


def command(kind: str, port: int) -> list[str]:
    if kind == "kg":
        return [
            str(_binary(kind)),
            "--KernelGatewayApp.ip=127.0.0.1",
            f"--KernelGatewayApp.port={port}",
            "--KernelGatewayApp.max_kernels=12",
            "--JupyterWebsocketPersonality.list_kernels=True",  # tests count what is left
            "--KernelGatewayApp.default_kernel_name=dataref",
            "--KernelGatewayApp.kernel_websocket_connection_class=kg_nodelay.NoDelayConnection",
            "--ZMQChannelsWebsocketConnection.iopub_data_rate_limit=0",
            "--ZMQChannelsWebsocketConnection.iopub_msg_rate_limit=0",
            "--MappingKernelManager.cull_idle_timeout=3600",
        ]
    return [
        str(_binary(kind)),
        "--EnterpriseGatewayApp.ip=127.0.0.1",
        f"--EnterpriseGatewayApp.port={port}",
        "--EnterpriseGatewayApp.max_kernels=12",
        "--EnterpriseGatewayApp.max_kernels_per_user=6",
        "--EnterpriseGatewayApp.default_kernel_name=dataref",
        "--RemoteMappingKernelManager.cull_idle_timeout=3600",
    ]


def start_gateway(kind: str, workdir: Path, *, uid_base: int = 64000) -> Gateway:
    workdir.mkdir(parents=True, exist_ok=True)
    jupyter_path = install_kernelspec(workdir / "spec", uid_base)
    token, port = secrets.token_hex(16), _free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
        "JUPYTER_PATH": str(jupyter_path),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_DATA_DIR": str(workdir / "data"),
        "PYTHONPATH": str(Path(__file__).parent),
        "KG_AUTH_TOKEN" if kind == "kg" else "EG_AUTH_TOKEN": token,
        "EG_AUTHORIZED_USERS": ",".join(USERS),
    }
    log = workdir / f"{kind}.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command(kind, port), env=env, stdout=out, stderr=subprocess.STDOUT, cwd=workdir
        )
    gateway = Gateway(kind, f"http://127.0.0.1:{port}", token, process, log, workdir)
    _wait(gateway)
    return gateway


def _wait(gateway: Gateway, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    headers = {"Authorization": f"token {gateway.token}"}
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None:
            raise RuntimeError(f"{gateway.kind} exited: {gateway.log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{gateway.url}/api/kernelspecs", headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    gateway.stop()
    raise RuntimeError(f"{gateway.kind} did not answer: {gateway.log.read_text()[-2000:]}")


UID_BASES = {"kg": 65000, "eg": 67000}  # the gateways' kernels' uids: apart from the tests'


class GatewaySet:
    """Each kind started at most once, on first use."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: dict[str, Gateway] = {}

    def get(self, kind: str) -> Gateway:
        if kind not in self.running:
            self.running[kind] = start_gateway(kind, self.workdir / kind, uid_base=UID_BASES[kind])
        return self.running[kind]

    def stop_all(self) -> None:
        for gateway in self.running.values():
            gateway.stop()
        self.running.clear()
