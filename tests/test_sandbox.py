"""The attack corpus, run as agent code inside real sandboxed kernels: every probe is blocked.

These tests need bubblewrap and root; where either is missing they FAIL (never skip).
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dataref.kernels import KernelPool, NotebookKernel

from .kernel_support import kernel_settings, ok, probe, require_bwrap, run, started_pool

pytestmark = pytest.mark.asyncio(loop_scope="module")

SECRET = "dataref-test-secret-" + secrets.token_hex(8)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KernelPool]:
    require_bwrap()
    # A secret in the server's environment, set before any kernel starts.
    os.environ["DATAREF_TEST_SERVER_SECRET"] = SECRET
    state = tmp_path_factory.mktemp("sbx")
    (state / "store").mkdir()
    (state / "store" / "secret.arrow").write_text(SECRET)
    the_pool = await started_pool(kernel_settings(state, uid_base=62000, uid_count=50))
    yield the_pool
    await the_pool.close()
    os.environ.pop("DATAREF_TEST_SERVER_SECRET", None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def alice(pool: KernelPool) -> NotebookKernel:
    return await pool.kernel("alice", "nb_attacks")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bob(pool: KernelPool) -> NotebookKernel:
    return await pool.kernel("bob", "nb_sibling")


async def test_the_kernel_runs_as_its_own_unprivileged_uid_and_two_kernels_differ(
    alice: NotebookKernel, bob: NotebookKernel, pool: KernelPool
) -> None:
    code = (
        "import os\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "out = [os.getuid(), os.geteuid(), os.getgid(), os.getgroups(),\n"
        "       status['CapEff'].strip(), status['CapBnd'].strip(), status['NoNewPrivs'].strip(),\n"
        "       os.readlink('/proc/self/ns/user')]"
    )
    a, b = await probe(alice, code), await probe(bob, code)
    if pool.backend.mode == "uid":  # a host uid of its own
        assert a[0] == a[1] == a[2] == alice.uid and 62000 <= a[0] < 62050
        assert b[0] == bob.uid and a[0] != b[0]
        assert a[3] == []
    else:  # uid 1000 of a user namespace of its own (the server's is not theirs)
        assert pool.backend.mode == "userns"
        assert a[0] == a[1] == a[2] == b[0] == 1000
        assert a[7] != b[7] and a[7] != os.readlink("/proc/self/ns/user")
    assert a[4] == a[5] == "0000000000000000"
    assert a[6] == "1"


async def test_a_tcp_listener_on_the_host_loopback_is_unreachable(alice: NotebookKernel) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # reachable from the host
        writer.close()
        out = await probe(
            alice,
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3); out = 'open'\n"
            "except OSError as e:\n    out = e.__class__.__name__",
        )
    finally:
        server.close()
    assert out == "ConnectionRefusedError"


async def test_dns_and_the_internet_are_unreachable(alice: NotebookKernel) -> None:
    out = await probe(
        alice,
        "import socket\nout = {}\n"
        "try:\n    socket.getaddrinfo('example.com', 443); out['dns'] = 'resolved'\n"
        "except OSError as e:\n    out['dns'] = type(e).__name__\n"
        "try:\n    socket.create_connection(('1.1.1.1', 443), timeout=3); out['tcp'] = 'open'\n"
        "except OSError as e:\n    out['tcp'] = e.errno\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n    u.sendto(b'x', ('8.8.8.8', 53)); out['udp'] = 'sent'\n"
        "except OSError as e:\n    out['udp'] = e.errno",
    )
    assert out["dns"] == "gaierror"
    assert out["tcp"] == errno.ENETUNREACH
    assert out["udp"] == errno.ENETUNREACH


async def test_host_unix_sockets_are_unreachable(alice: NotebookKernel, pool: KernelPool) -> None:
    path = pool.settings.state_dir / "host.sock"
    abstract = "\0dataref-test-" + secrets.token_hex(4)
    listeners = []
    for address in (str(path), abstract):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(1)
        listeners.append(listener)
    try:
        out = await probe(
            alice,
            "import socket\nout = {}\n"
            f"for name, address in (('path', {str(path)!r}), ('abstract', {abstract!r})):\n"
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "    try:\n        s.connect(address); out[name] = 'open'\n"
            "    except OSError as e:\n        out[name] = type(e).__name__",
        )
    finally:
        for listener in listeners:
            listener.close()
    assert out == {"path": "FileNotFoundError", "abstract": "ConnectionRefusedError"}


async def test_host_files_the_store_and_a_sibling_kernel_are_invisible(
    alice: NotebookKernel, bob: NotebookKernel, pool: KernelPool
) -> None:
    await ok(bob, "open('/sandbox/bobs_notes.txt', 'w').write('private')")
    targets = [
        "/etc/shadow",
        str(pool.settings.state_dir / "store" / "secret.arrow"),
        str(bob.box.view / "sandbox" / "bobs_notes.txt"),
        str(bob.inputs_dir),
        str(Path(__file__).resolve().parents[1] / "pyproject.toml"),  # the project checkout
        str(Path.home() / ".bashrc"),
    ]
    out = await probe(
        alice,
        f"out = {{}}\nfor path in {targets!r}:\n"
        "    try:\n        open(path).read(); out[path] = 'read'\n"
        "    except OSError as e:\n        out[path] = type(e).__name__\n"
        "import os\nout['pids'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "out['root_home'] = os.listdir('/root') if os.path.isdir('/root') else []",
    )
    for path in targets:
        assert out[path] == "FileNotFoundError", path  # not even there
    assert out["pids"] == [1, 2]  # bwrap's init and the kernel: no host processes
    assert set(out["root_home"]) <= {".pyenv"}  # only the Python install, read-only


async def test_the_servers_environment_does_not_reach_the_kernel(alice: NotebookKernel) -> None:
    out = await probe(
        alice,
        "import os\nout = dict(os.environ)\n"
        "for pid in ('1', '2', 'self'):\n"
        "    try:\n        out['proc' + pid] = open(f'/proc/{pid}/environ').read()\n"
        "    except OSError:\n        pass",
    )
    assert "DATAREF_TEST_SERVER_SECRET" not in out
    assert not any(SECRET in str(value) for value in out.values())
    assert out["HOME"] == "/sandbox" and out["MALLOC_ARENA_MAX"] == "2"


async def test_nothing_outside_the_sandbox_dir_is_writable(alice: NotebookKernel) -> None:
    base = sys.base_prefix
    targets = [
        "/x",
        "/etc/x",
        "/usr/x",
        "/opt/venv/x",
        "/opt/venv/lib/python3.11/site-packages/x.pth",
        f"{base}/lib/python3.11/x.py",
        "/sandbox/inputs/x.arrow",
        "/dev/x",
        "/tmp/.ipython/profile_default/startup/01-mine.py",
        "/tmp/.ipython/profile_default/startup/00-dataref.py",
    ]
    out = await probe(
        alice,
        f"out = {{}}\nfor path in {targets!r}:\n"
        "    try:\n        open(path, 'a').close(); out[path] = 'written'\n"
        "    except OSError as e:\n        out[path] = type(e).__name__\n"
        "for ok in ('/sandbox/mine.txt', '/tmp/mine.txt', '/dev/shm/mine'):\n"
        "    open(ok, 'w').write('x'); out[ok] = 'written'",
    )
    for path in targets:
        assert out[path] in ("OSError", "PermissionError", "FileNotFoundError"), (path, out[path])
    assert out["/sandbox/mine.txt"] == out["/tmp/mine.txt"] == "written"


async def test_the_run_dir_cannot_be_tampered_with(alice: NotebookKernel) -> None:
    run_dir = alice.box.run_inside
    out = await probe(
        alice,
        f"import os\nrun = {str(run_dir)!r}\nout = {{}}\n"
        "for name, action in [\n"
        "    ('create', lambda: open(run + '/planted', 'w')),\n"
        "    ('symlink', lambda: os.symlink('/var/run/docker.sock', run + '/k-9')),\n"
        "    ('rename', lambda: os.rename(run + '/k-1', run + '/k-x')),\n"
        "    ('unlink', lambda: os.unlink(run + '/k-1')),\n"
        "    ('overwrite', lambda: open(run + '/conn.json', 'w')),\n"
        "]:\n"
        "    try:\n        action(); out[name] = 'done'\n"
        "    except OSError as e:\n        out[name] = type(e).__name__",
    )
    assert set(out.values()) == {"PermissionError"}, out


async def test_the_kernel_cannot_signal_the_server_or_gain_privileges(
    alice: NotebookKernel,
) -> None:
    out = await probe(
        alice,
        "import os\nout = {}\n"
        f"for name, action in [('kill', lambda: os.kill({os.getpid()}, 0)),\n"
        "                     ('setuid', lambda: os.setuid(0)),\n"
        "                     ('chroot', lambda: os.chroot('/tmp'))]:\n"
        "    try:\n        action(); out[name] = 'done'\n"
        "    except OSError as e:\n        out[name] = type(e).__name__",
    )
    assert out["kill"] in ("ProcessLookupError", "PermissionError")
    assert out["chroot"] == "PermissionError"
    # EPERM for a host uid; EINVAL in a user namespace, where uid 0 is not even mapped
    assert out["setuid"] in ("PermissionError", "OSError")


async def test_nested_user_namespaces_are_refused(alice: NotebookKernel) -> None:
    out = await probe(
        alice,
        "import ctypes, os, subprocess\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.unshare(0x10000000)\n"  # CLONE_NEWUSER
        "out = {'unshare': [rc, ctypes.get_errno()]}\n"
        "p = subprocess.run(['unshare', '-Urn', 'true'], capture_output=True)\n"
        "out['unshare_cmd'] = p.returncode",
    )
    assert out["unshare"] == [-1, 1]  # EPERM
    assert out["unshare_cmd"] != 0


async def test_a_fork_bomb_is_stopped_and_the_kernel_survives(alice: NotebookKernel) -> None:
    out = await probe(
        alice,
        "import os, time\nforked, err, pids = 0, None, []\n"
        "for _ in range(400):\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError as e:\n        err = e.errno; break\n"
        "    if pid == 0:\n        time.sleep(1); os._exit(0)\n"
        "    pids.append(pid); forked += 1\n"
        "for pid in pids:\n    os.waitpid(pid, 0)\n"
        "out = [forked, err]",
    )
    assert out[1] == errno.EAGAIN
    assert 0 < out[0] < 64
    assert (await ok(alice, "print('alive')")).strip() == "alive"


async def test_a_4_gib_allocation_fails_with_memory_error_and_the_kernel_survives(
    alice: NotebookKernel,
) -> None:
    await ok(alice, "kept = 'still here'")
    result = await run(alice, "big = bytearray(4 * 2**30)")
    assert result.status == "error" and result.error is not None
    assert result.error["ename"] == "MemoryError"
    assert not result.restarted
    assert (await ok(alice, "b = bytearray(256 * 2**20); print(kept, len(b))")).startswith(
        "still here"
    )


async def test_a_planted_startup_file_does_not_run_after_a_restart_or_a_reset(
    pool: KernelPool,
) -> None:
    kernel = await pool.kernel("mallory", "nb_persist")
    plant = (
        "import os, pathlib\n"
        "code = 'import pathlib; pathlib.Path(\"/sandbox/PWNED\").write_text(__file__)\\n'\n"
        "places = ['/sandbox/.ipython/profile_default/startup/00-evil.py',\n"
        "          '/tmp/.ipython/profile_default/startup/00-evil.py',\n"
        "          '/tmp/.ipython/profile_default/ipython_config.py',\n"
        "          '/tmp/.ipython/profile_default/ipython_kernel_config.py',\n"
        "          '/sandbox/.jupyter/jupyter_config.py',\n"
        "          '/sandbox/.jupyter/ipython_kernel_config.py',\n"
        "          '/sandbox/.config/ipython/profile_default/startup/00-evil.py',\n"
        "          '/sandbox/.local/lib/python3.11/site-packages/evil.pth',\n"
        "          '/sandbox/sitecustomize.py', '/sandbox/usercustomize.py',\n"
        "          '/sandbox/ipykernel_launcher.py', '/sandbox/pandas.py',\n"
        "          '/sandbox/.dataref/startup.py']\n"
        "planted = []\n"
        "for place in places:\n"
        "    body = code if not place.endswith('.pth') else 'import pathlib; ' + code\n"
        "    if place.endswith('config.py'):\n"
        "        body = 'c.InteractiveShellApp.exec_lines = [' + repr(code) + ']\\n'\n"
        "    try:\n"
        "        pathlib.Path(place).parent.mkdir(parents=True, exist_ok=True)\n"
        "        pathlib.Path(place).write_text(body); planted.append(place)\n"
        "    except OSError:\n        pass\n"
        "out = planted"
    )
    planted = await probe(kernel, plant)
    assert "/sandbox/.ipython/profile_default/startup/00-evil.py" in planted
    assert "/tmp/.ipython/profile_default/startup/00-evil.py" not in planted  # read-only

    died = await run(kernel, "import os; os._exit(0)")
    assert died.status == "died"
    after_restart = await probe(
        kernel, "import os\nout = [os.path.exists('/sandbox/PWNED'), 'pandas' in dir()]"
    )
    assert after_restart == [False, False]
    assert (await ok(kernel, "import pandas; print(pandas.__file__)")).startswith("/opt/venv")

    await pool.reset("mallory", "nb_persist")
    fresh = await pool.kernel("mallory", "nb_persist")
    assert fresh.kernel_id != kernel.kernel_id
    assert await probe(fresh, "import os\nout = sorted(os.listdir('/sandbox'))") == [
        ".dataref",
        "inputs",
    ]


async def test_ordinary_analysis_work_still_runs_in_the_sandbox(alice: NotebookKernel) -> None:
    out = await probe(
        alice,
        "import multiprocessing, subprocess, threading, socket, zoneinfo\n"
        "import pandas as pd\n"
        "with multiprocessing.get_context('fork').Pool(2) as workers:\n"
        "    squares = workers.map(abs, [-1, -2, -3])\n"
        "echo = subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout.strip()\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "client = socket.create_connection(server.getsockname())\n"
        "when = pd.Timestamp('2025-06-01 12:00', tz='Europe/Paris').tz_convert('UTC')\n"
        "out = [squares, echo, str(when), str(zoneinfo.ZoneInfo('America/New_York'))]",
    )
    assert out == [[1, 2, 3], "hi", "2025-06-01 10:00:00+00:00", "America/New_York"]


async def test_a_disk_filler_meets_its_own_limit_not_the_stores_disk(
    alice: NotebookKernel, pool: KernelPool
) -> None:
    free_before = shutil.disk_usage(pool.settings.state_dir).free
    out = await probe(
        alice,
        "import errno\nwritten, err = 0, None\nchunk = b'x' * 2**20\n"
        "try:\n"
        "    for i in range(4096):\n"
        "        with open(f'/sandbox/fill-{i}', 'wb') as f:\n"  # many files: FSIZE is per file
        "            for _ in range(64):\n                f.write(chunk); written += 1\n"
        "except OSError as e:\n    err = e.errno\n"
        "import os, glob\nfor p in glob.glob('/sandbox/fill-*'):\n    os.unlink(p)\n"
        "out = [written, err]",
    )
    work = pool.settings.kernels.work_bytes >> 20
    assert out[1] == errno.ENOSPC
    assert work - 8 <= out[0] <= work  # MiB written before the tmpfs was full
    assert shutil.disk_usage(pool.settings.state_dir).free > free_before - 64 * 2**20
    assert (await ok(alice, "open('/sandbox/after', 'w').write('ok'); print('fine')")) == "fine\n"


async def test_a_fork_bomb_in_one_kernel_leaves_another_kernel_working(
    alice: NotebookKernel, bob: NotebookKernel
) -> None:
    await ok(
        alice,
        "import os, time\nheld = []\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(30); os._exit(0)\n"
        "    held.append(pid)\n",
    )
    try:
        out = await probe(
            bob,
            "import subprocess\nout = subprocess.run(['echo', 'hi'], capture_output=True, "
            "text=True).stdout.strip()",
        )
        assert out == "hi"
    finally:
        await ok(
            alice,
            "import signal\nfor p in held:\n    os.kill(p, signal.SIGKILL)\n"
            "for p in held:\n    os.waitpid(p, 0)",
        )


async def test_the_memory_budget_admits_kernels_only_while_their_limits_fit(
    tmp_path: Path,
) -> None:
    from dataref.errors import LimitExceeded
    from dataref.kernels.budget import kernel_footprint

    config = kernel_settings(tmp_path, uid_base=62900, uid_count=10)
    each = kernel_footprint(config.kernels)
    config.kernels.memory_budget_bytes = 2 * each + each // 2  # room for two, not three
    small = await started_pool(config)
    try:
        assert small.backend.budget.capacity == 2
        await small.kernel("a", "nb1")
        await small.kernel("b", "nb1")
        with pytest.raises(LimitExceeded, match="memory budget"):
            await small.kernel("c", "nb1")
        await small.reset("a", "nb1")
        assert (await ok(await small.kernel("c", "nb1"), "print(1)")).strip() == "1"
    finally:
        await small.close()
