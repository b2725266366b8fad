"""userns mode, probed from inside: what an ordinary user's kernel must not reach.

Run as an ordinary account (``make test-user``). As root these tests FAIL (userns mode is for
an ordinary user; root's mode is tested by tests/test_sandbox.py), they never skip.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dataref.kernels import KernelPool, NotebookKernel
from dataref.kernels.userns import landlock_abi

from ..kernel_support import (
    kernel_processes,
    kernel_settings,
    ok,
    probe,
    require_bwrap,
    run,
    started_pool,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parents[2]
SECRET = "dataref-userns-secret-" + secrets.token_hex(8)
MiB = 1 << 20


@pytest.fixture(scope="module")
def planted_home() -> dict[str, str]:
    """Secrets in the account's home, as a real user has them (planted where missing)."""
    home = Path.home()
    files = {
        home / ".ssh" / "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n" + SECRET,
        home / ".config" / "dataref-test" / "token": SECRET,
        home / ".bash_history": "export API_KEY=" + SECRET,
    }
    for path, text in files.items():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(text)
            path.chmod(0o600)
    return {str(path): text for path, text in files.items()}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KernelPool]:
    require_bwrap("userns")
    os.environ["DATAREF_TEST_SERVER_SECRET"] = SECRET
    config = kernel_settings(tmp_path_factory.mktemp("uns"), sandbox="userns", work_bytes=64 * MiB)
    the_pool = await started_pool(config)
    assert the_pool.backend.mode == "userns"
    yield the_pool
    await the_pool.close()
    os.environ.pop("DATAREF_TEST_SERVER_SECRET", None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def alice(pool: KernelPool) -> NotebookKernel:
    return await pool.kernel("alice", "nb")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def other(pool: KernelPool) -> NotebookKernel:
    """Another kernel of the same user (the same host uid)."""
    return await pool.kernel("alice", "nb_other")


async def _attempts(kernel: NotebookKernel, actions: dict[str, str]) -> dict[str, str]:
    """Run each action (an expression) in the kernel: 'done' or the exception's name."""
    code = "out = {}\n"
    for name, action in actions.items():
        code += (
            f"try:\n    {action}\n    out[{name!r}] = 'done'\n"
            f"except Exception as e:\n    out[{name!r}] = type(e).__name__\n"
        )
    return await probe(kernel, "import os, socket, ctypes, subprocess\n" + code)


async def test_the_users_home_files_are_not_there(
    alice: NotebookKernel, planted_home: dict[str, str]
) -> None:
    actions = {path: f"open({path!r}).read()" for path in planted_home}
    actions["bashrc"] = f"open({str(Path.home() / '.bashrc')!r}).read()"
    actions["list_home"] = f"assert os.listdir({str(Path.home())!r}) != []"
    out = await _attempts(alice, actions)
    for path in planted_home:
        assert out[path] == "FileNotFoundError", path
    assert out["bashrc"] == "FileNotFoundError"
    assert out["list_home"] in ("FileNotFoundError", "AssertionError"), out


async def test_the_venv_and_the_repo_cannot_be_written(alice: NotebookKernel) -> None:
    venv = Path(sys.prefix)
    out = await _attempts(
        alice,
        {
            "venv_inside": "open('/opt/venv/pwned.py', 'w')",
            "site_packages": "open('/opt/venv/lib/python3.11/site-packages/pwned.pth', 'w')",
            "venv_host_path": f"open({str(venv / 'pwned.py')!r}, 'w')",
            "repo": f"open({str(ROOT / 'server' / 'dataref' / 'pwned.py')!r}, 'w')",
            "repo_read": f"open({str(ROOT / 'pyproject.toml')!r}).read()",
            "launcher": "open('/opt/dataref/landlock.py', 'a')",
        },
    )
    assert out["venv_inside"] in ("OSError", "PermissionError")  # EROFS, or Landlock's EACCES
    assert out["site_packages"] in ("OSError", "PermissionError")
    assert out["launcher"] in ("OSError", "PermissionError")
    assert out["venv_host_path"] in ("FileNotFoundError", "PermissionError", "OSError")
    assert out["repo"] in ("FileNotFoundError", "PermissionError", "OSError")
    assert out["repo_read"] == "FileNotFoundError"
    assert not (venv / "pwned.py").exists()


async def test_the_server_and_another_kernel_of_the_same_user_cannot_be_seen_or_signalled(
    alice: NotebookKernel, other: NotebookKernel
) -> None:
    await ok(other, "pass")
    targets = {"server": os.getpid(), **{f"other_{p}": p for p in kernel_processes(other.box.root)}}
    assert len(targets) >= 3  # the server, the other kernel's bwrap and its init
    actions = {name: f"os.kill({pid}, 0)" for name, pid in targets.items()}
    actions["proc_pids"] = (
        "assert sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, 2]"
    )
    out = await _attempts(alice, actions)
    assert out.pop("proc_pids") == "done"
    assert set(out.values()) == {"ProcessLookupError"}, out
    assert (await ok(other, "print('unharmed')")).strip() == "unharmed"


async def test_ptrace_is_refused(alice: NotebookKernel) -> None:
    out = await probe(
        alice,
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nout = {}\n"
        "for name, request, pid in (('attach_init', 16, 1), ('traceme', 0, 0)):\n"
        "    rc = libc.ptrace(request, pid, 0, 0)\n"
        "    out[name] = [rc, ctypes.get_errno()]",
    )
    assert out == {"attach_init": [-1, errno.EPERM], "traceme": [-1, errno.EPERM]}


async def test_a_tcp_service_on_the_host_loopback_and_dns_are_unreachable(
    alice: NotebookKernel,
) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        out = await _attempts(
            alice,
            {
                "tcp": f"socket.create_connection(('127.0.0.1', {port}), timeout=3)",
                "dns": "socket.getaddrinfo('example.com', 443)",
                "udp_dns": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                ".sendto(b'x', ('8.8.8.8', 53))",
            },
        )
    finally:
        server.close()
    assert out == {"tcp": "ConnectionRefusedError", "dns": "gaierror", "udp_dns": "OSError"}


async def test_creating_a_user_namespace_is_refused(alice: NotebookKernel) -> None:
    out = await probe(
        alice,
        "import ctypes, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.unshare(0x10000000)\n"  # CLONE_NEWUSER
        "out = [rc, ctypes.get_errno(),\n"
        "       subprocess.run(['unshare', '-U', 'true'], capture_output=True).returncode]",
    )
    assert out[:2] == [-1, errno.EPERM]
    assert out[2] != 0


async def test_the_servers_environment_is_not_readable_through_proc(
    alice: NotebookKernel,
) -> None:
    out = await probe(
        alice,
        "import os\nout = {'env': dict(os.environ)}\n"
        f"for pid in ('1', '2', 'self', '{os.getpid()}', '{os.getppid()}'):\n"
        "    try:\n        out[pid] = open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1')\n"
        "    except OSError as e:\n        out[pid] = type(e).__name__",
    )
    assert SECRET not in str(out)
    assert "DATAREF_TEST_SERVER_SECRET" not in str(out)
    assert out[str(os.getpid())] == "FileNotFoundError"


async def test_landlock_forbids_symlinks_and_running_what_the_kernel_wrote(
    alice: NotebookKernel,
) -> None:
    assert landlock_abi()[0] > 0, f"Landlock is not available here: {landlock_abi()[1]}"
    out = await _attempts(
        alice,
        {
            "symlink": "os.symlink('/etc/passwd', '/sandbox/link')",
            "exec_written": "open('/tmp/x.sh', 'w').write('#!/bin/sh\\necho hi\\n'); "
            "os.chmod('/tmp/x.sh', 0o755); subprocess.run(['/tmp/x.sh'], check=True)",
            "socket_dir_file": "open('/run/dataref/planted', 'w')",
            "socket_dir_rename": "os.rename('/run/dataref/conn.json', '/run/dataref/c')",
            "list_root": "os.listdir('/')",
        },
    )
    assert out["symlink"] == out["exec_written"] == "PermissionError", out
    assert out["socket_dir_file"] == out["socket_dir_rename"] == "PermissionError", out
    assert out["list_root"] == "PermissionError", out


async def test_the_kernel_is_unprivileged_in_its_own_user_namespace(
    alice: NotebookKernel, other: NotebookKernel
) -> None:
    code = (
        "import os\nstatus = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "out = [os.getuid(), status['CapEff'].strip(), status['NoNewPrivs'].strip(),\n"
        "       os.readlink('/proc/self/ns/user'), status['Seccomp'].strip()]"
    )
    a, b = await probe(alice, code), await probe(other, code)
    assert a[:3] == [1000, "0000000000000000", "1"]
    assert a[3] != b[3] != os.readlink("/proc/self/ns/user")
    assert a[4] == "2"  # the seccomp filter is loaded
    died = await run(alice, "import os; os._exit(1)")
    assert died.status == "died"
    assert (await ok(alice, "print('back')")).strip() == "back"


async def test_doctor_as_this_account_reports_the_userns_mode_working(tmp_path: Path) -> None:
    import subprocess

    from ..conftest import DATAREF, child_env

    done = await asyncio.to_thread(
        subprocess.run,
        [DATAREF, "doctor"],
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sandbox mode: userns" in done.stdout
    assert "userns sandbox works" in done.stdout and "Landlock: used" in done.stdout
    assert "cgroup v2" in done.stdout and "memory budget" in done.stdout
