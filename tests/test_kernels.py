"""The kernel pool: state, timeouts, crashes, concurrency, caps, spares, cleanup."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dataref.errors import ComputeError, LimitExceeded
from dataref.kernels import KernelPool, NotebookKernel, check_sandbox

from .kernel_support import (
    header,
    kernel_processes,
    kernel_settings,
    manifest,
    ok,
    probe,
    require_bwrap,
    run,
    started_pool,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[KernelPool]:
    require_bwrap()
    config = kernel_settings(
        tmp_path_factory.mktemp("krn"),
        uid_base=62100,
        uid_count=50,
        warm_spares=1,
        max_per_owner=2,
        compute={"interrupt_grace_seconds": 1, "progress_interval_seconds": 0.3},
    )
    the_pool = await started_pool(config)
    yield the_pool
    await the_pool.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(pool: KernelPool) -> NotebookKernel:
    """One kernel for the tests that do not break it (kernel starts are what costs time)."""
    return await pool.kernel("shared", "nb")


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _reset_after_each_test(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Other tests bring their own kernels; stop them afterwards to keep memory low."""
    yield
    if "pool" in request.fixturenames:
        the_pool: KernelPool = request.getfixturevalue("pool")
        for owner, notebook in the_pool.live():
            if owner != "shared":
                await the_pool.reset(owner, notebook)


async def test_state_persists_across_calls(pool: KernelPool, shared: NotebookKernel) -> None:
    await ok(shared, "x = 41")
    assert (await ok(shared, "x += 1\nprint(x)")).strip() == "42"
    assert (await pool.kernel("shared", "nb")) is shared


async def test_a_warm_spare_serves_the_first_call_of_a_new_notebook(pool: KernelPool) -> None:
    assert await pool.wait_for_spares() == 1
    kernel = await pool.kernel("sam", "nb_new")
    assert kernel.from_spare and (kernel.owner, kernel.notebook) == ("sam", "nb_new")
    assert (await ok(kernel, "print('ready')")).strip() == "ready"


async def test_a_timeout_interrupts_the_cell_and_keeps_the_variables(pool: KernelPool) -> None:
    kernel = await pool.kernel("tim", "nb")
    await ok(kernel, "kept = 'yes'")
    started = time.monotonic()
    result = await run(kernel, "while True: pass", timeout=2)
    assert result.status == "timeout" and not result.restarted
    assert time.monotonic() - started < 5
    assert (await ok(kernel, "print(kept)")).strip() == "yes"


async def test_a_cell_that_ignores_the_interrupt_is_restarted_after_the_grace(
    pool: KernelPool,
) -> None:
    kernel = await pool.kernel("tim", "nb_stubborn")
    await ok(kernel, "lost = 1")
    started = time.monotonic()
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
    result = await run(kernel, code, timeout=1)
    assert result.status == "timeout" and result.restarted
    assert time.monotonic() - started < 4
    after = await run(kernel, "print(lost)")
    assert after.status == "error" and after.error and after.error["ename"] == "NameError"


async def test_a_crash_gives_died_promptly_and_the_next_call_works(pool: KernelPool) -> None:
    kernel = await pool.kernel("cid", "nb")
    for crash in ("import os; os._exit(1)", "import ctypes; ctypes.string_at(0)"):  # exit, segv
        await ok(kernel, "before = 1")
        started = time.monotonic()
        result = await run(kernel, crash)
        assert result.status == "died" and result.restarted, crash
        assert time.monotonic() - started < 2
        assert (await ok(kernel, "print('back')")).strip() == "back"
        assert (await run(kernel, "before")).status == "error"  # variables are gone


async def test_a_kernel_killed_from_outside_fails_the_call_promptly(pool: KernelPool) -> None:
    kernel = await pool.kernel("kim", "nb")
    await ok(kernel, "pass")
    call = asyncio.create_task(run(kernel, "import time; time.sleep(60)"))
    await asyncio.sleep(0.5)
    for pid in kernel_processes(kernel.box.root):
        os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    result = await asyncio.wait_for(call, 10)
    assert result.status == "died"
    assert time.monotonic() - started < 2
    assert (await ok(kernel, "print('back')")).strip() == "back"


async def test_a_reset_during_a_call_ends_it_and_gives_a_fresh_kernel(pool: KernelPool) -> None:
    kernel = await pool.kernel("ray", "nb")
    await ok(kernel, "x = 1")
    call = asyncio.create_task(run(kernel, "import time; time.sleep(60)"))
    await asyncio.sleep(0.3)
    await pool.reset("ray", "nb")
    result = await asyncio.wait_for(call, 5)
    assert result.status == "died"
    assert ("ray", "nb") not in pool.live()
    fresh = await pool.kernel("ray", "nb")
    assert fresh is not kernel and fresh.kernel_id != kernel.kernel_id
    assert (await run(fresh, "x")).status == "error"
    with pytest.raises(ComputeError, match="stopped"):
        await run(kernel, "1")


async def test_two_notebooks_execute_concurrently(pool: KernelPool, shared: NotebookKernel) -> None:
    one, two = shared, await pool.kernel("cat", "nb2")
    await asyncio.gather(ok(one, "import time"), ok(two, "import time"))
    started = time.monotonic()
    await asyncio.gather(ok(one, "time.sleep(1)"), ok(two, "time.sleep(1)"))
    assert time.monotonic() - started < 1.7


async def test_calls_on_one_notebook_run_one_at_a_time_in_order(shared: NotebookKernel) -> None:
    kernel = shared
    await ok(kernel, "import time\nlog = []")

    async def call(n: int) -> None:
        async with kernel.lock:
            await ok(kernel, f"log.append('start {n}'); time.sleep(0.2); log.append('end {n}')")

    await asyncio.gather(*(call(n) for n in range(3)))
    # execute() also serialises by itself, without the caller's lock
    await asyncio.gather(*(ok(kernel, f"log.append('bare {n}')") for n in range(3)))
    log = (await ok(kernel, "print('|'.join(log))")).strip().split("|")
    assert log[:6] == ["start 0", "end 0", "start 1", "end 1", "start 2", "end 2"]
    assert sorted(log[6:]) == ["bare 0", "bare 1", "bare 2"]


async def test_the_per_owner_cap_gives_limit_exceeded_with_a_way_out(pool: KernelPool) -> None:
    await pool.kernel("cap", "nb1")
    await pool.kernel("cap", "nb2")
    with pytest.raises(LimitExceeded, match="reset_kernel"):
        await pool.kernel("cap", "nb3")
    await pool.kernel("someone_else", "nb3")  # the cap is per owner
    await pool.reset("cap", "nb1")
    assert (await pool.kernel("cap", "nb3")).owner == "cap"


async def test_a_kernel_belongs_to_one_owner_and_notebook(pool: KernelPool) -> None:
    mine, theirs = await pool.kernel("own_a", "shared"), await pool.kernel("own_b", "shared")
    assert mine is not theirs and mine.kernel_id != theirs.kernel_id
    assert mine.uid is None or mine.uid != theirs.uid
    assert (mine.owner, theirs.owner) == ("own_a", "own_b")
    assert ("own_a", "shared") in pool.live() and ("own_b", "shared") in pool.live()


async def test_progress_is_reported_while_a_cell_runs(shared: NotebookKernel) -> None:
    kernel = shared
    seen: list[float] = []

    async def progress(elapsed: float) -> None:
        seen.append(elapsed)

    result = await kernel.execute(
        "import time; time.sleep(1.2)", timeout_s=10, on_progress=progress
    )
    assert result.status == "ok"
    assert len(seen) >= 2 and seen == sorted(seen) and 0 < seen[0] < 1


async def test_outputs_are_read_without_following_the_kernels_symlinks(
    pool: KernelPool, shared: NotebookKernel
) -> None:
    kernel = shared
    secret = pool.settings.state_dir / "host-secret.txt"
    secret.write_text("host data")
    how = await probe(
        kernel,
        "import os\nos.makedirs('/sandbox/.dataref/out/c1', exist_ok=True)\n"
        "open('/sandbox/.dataref/out/c1/ok.arrow', 'w').write('fine')\n"
        f"try:\n    os.symlink({str(secret)!r}, '/sandbox/.dataref/out/c1/x.arrow')\n"
        "    os.symlink('/', '/sandbox/.dataref/out/c2')\n    out = 'planted'\n"
        "except PermissionError:\n    out = 'refused'",
    )
    if how == "refused":  # Landlock (userns mode): plant them from outside, as an escape would
        assert pool.backend.mode == "userns"
        os.symlink(secret, kernel.outputs_dir / "c1" / "x.arrow")
        os.symlink("/", kernel.outputs_dir / "c2")
    with kernel.open_output("c1", "ok.arrow", 100) as f:
        assert f.read() == b"fine"
    for cell, name in (("c1", "x.arrow"), ("c2", "etc")):
        with pytest.raises(OSError):
            kernel.open_output(cell, name, 100)
    with pytest.raises(ValueError, match="too large"):
        kernel.open_output("c1", "ok.arrow", 2)
    kernel.remove_outputs("c2")
    kernel.remove_outputs("c1")
    assert secret.read_text() == "host data" and Path("/etc/passwd").exists()
    assert not (kernel.outputs_dir / "c1").exists() and not (kernel.outputs_dir / "c2").exists()


async def test_a_second_server_on_the_same_state_dir_leaves_live_kernels_alone(
    pool: KernelPool, shared: NotebookKernel
) -> None:
    from dataref.kernels.sandbox import remove_stale_boxes

    kernel = shared
    stale = pool.backend.root / "0123456789"
    (stale / "work").mkdir(parents=True)
    (stale / "lock").touch()  # a crashed server's kernel: its lock is not held
    assert remove_stale_boxes(pool.backend.root) == 1
    assert not stale.exists() and kernel.box.root.is_dir()
    assert (await ok(kernel, "print('fine')")).strip() == "fine"


async def test_the_sandbox_check_passes_here(pool: KernelPool) -> None:
    report = await asyncio.to_thread(check_sandbox, pool.settings)
    assert report.ok, report.problems
    assert any(f"{pool.backend.mode} sandbox works: a probe ran" in line for line in report.details)


async def test_the_pool_refuses_to_start_without_bubblewrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dataref.kernels.check.BWRAP", "/nonexistent/bwrap")
    report = check_sandbox(kernel_settings(tmp_path))
    assert not report.ok and any("apt-get install bubblewrap" in p for p in report.problems)
    with pytest.raises(ComputeError, match="apt-get install bubblewrap"):
        await KernelPool(kernel_settings(tmp_path)).start()


async def test_unsandboxed_mode_runs_the_same_profile(tmp_path: Path) -> None:
    unsandboxed = await started_pool(kernel_settings(tmp_path, sandbox="unsandboxed"))
    try:
        kernel = await unsandboxed.kernel("dev", "nb")
        assert kernel.uid is None
        result = await run(
            kernel,
            header("c1")
            + "\noutputs['t'] = __import__('pandas').DataFrame({'a': [1]})\nresult = 1",
        )
        assert manifest(result)["outputs"] == ["t"] and manifest(result)["result"] == "1"
        assert (kernel.outputs_dir / "c1" / "t.arrow").is_file()
    finally:
        await unsandboxed.close()


async def test_idle_kernels_are_reaped_and_closing_leaves_no_process(tmp_path: Path) -> None:
    kernels_dir = tmp_path / "kernels"
    own = await started_pool(
        kernel_settings(
            tmp_path, uid_base=62500, uid_count=10, warm_spares=1, idle_timeout_seconds=1
        )
    )
    try:
        kernel = await own.kernel("idle", "nb")
        await ok(kernel, "pass")
        assert await own.wait_for_spares() == 1
        assert len(kernel_processes(kernels_dir)) >= 2
        deadline = time.monotonic() + 10
        while own.live() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert own.live() == [] and kernel.closed
    finally:
        await own.close()
    assert kernel_processes(kernels_dir) == []
    assert list((tmp_path / "kernels").iterdir()) == [tmp_path / "kernels" / "seccomp.bpf"]
