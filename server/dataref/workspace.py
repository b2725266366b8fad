"""The core the MCP tools stand on: settings, store, transcripts, producers and kernels.

It knows nothing of MCP: tools in ``app.py`` resolve the owner and call these methods, and
``replay``/``cli`` use the same core. Resources are opened in ``open`` and closed in
``close`` (the app's lifespan does both).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from .artifact import frame_to_table
from .config import Settings
from .describe import describe, describe_columns
from .downloads import Downloads
from .errors import ComputeError
from .exposure import Exposure
from .ledger import SQLiteLedger
from .producers import Batches, ProducerContext, ProducerRegistry, load_producers
from .shown import Shown
from .state import open_state
from .store import ArtifactStore
from .transcript import Transcripts, record_producer


class Workspace:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.state = state = open_state(settings)
        self.store = ArtifactStore(
            settings.state_dir / "store",
            settings.store,
            db=state.artifacts_db,
            blob_store=state.artifact_blobs,
            shared=state.shared,
        )
        self.transcripts = Transcripts(
            settings.state_dir / "notebooks",
            db=state.notebooks_db,
            shared_kernels=bool(settings.kernels.gateway_url),  # the kernel map says where
        )
        self.downloads = Downloads(
            settings.state_dir / "exports", db=state.links_db, blobs=state.export_blobs
        )
        self.shown = Shown(state.page_db)  # what calls showed, for the page
        self.ledger = SQLiteLedger(settings.state_dir / "ledger")
        self.exposure = Exposure(settings, self.ledger, self.store)
        self.producers: ProducerRegistry = load_producers(settings)
        self.pool: Any = None  # KernelPool, started by start()
        self.kernel_problem: str | None = None  # why the pool did not start, if it did not
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, *, kernels: bool = True) -> None:
        if await self.is_leader():
            await asyncio.to_thread(self.store.sweep)
        self._sweeper = asyncio.create_task(self._sweep_forever())
        if kernels:
            from .kernels import KernelPool

            pool = KernelPool(self.settings, state=self.state)
            try:
                await pool.start()
            except ComputeError as exc:
                # Fetching, describing and exporting still work; run_python says why it can't.
                self.kernel_problem = str(exc)
                print(f"dataref: run_python is unavailable: {exc}", file=sys.stderr)
                await pool.close()
                return
            self.pool = pool

    async def close(self) -> None:
        try:
            if self._sweeper is not None:
                self._sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sweeper
            if self.pool is not None:
                await self.pool.close()
        finally:
            try:
                self.ledger.close()
                self.transcripts.close()  # materialises the documents behind their journal
            finally:
                self.state.close()

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.store.sweep_interval_seconds)
            if not await self.is_leader():
                continue  # one server sweeps at a time; another takes over if the leader dies
            with contextlib.suppress(Exception):  # a failed sweep must not stop the next one
                await asyncio.to_thread(self.store.sweep)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.sweep_exports)

    async def is_leader(self) -> bool:
        try:
            return await asyncio.to_thread(self.state.leadership.is_leader)
        except Exception:  # the state is unreachable: someone else sweeps, or nobody can
            return False

    def notebook_lock(self, handle: str) -> contextlib.AbstractAsyncContextManager[None]:
        """One call at a time per notebook, across every server sharing the state."""
        return self.state.notebook_locks.hold(f"notebook:{handle}")

    def sweep_exports(self) -> int:
        """Expired exports and download links go; returns how many links expired."""
        return self.downloads.sweep(grace=self.settings.server.download_ttl_seconds)

    # -- producers -------------------------------------------------------------

    def produce(
        self, owner: str, name: str, arguments: dict[str, Any], notebook: str | None
    ) -> dict[str, Any]:
        """Run producer ``name``, store its frame, record the cell, return the Description."""
        producer = self.producers.get(name)
        handle = self.transcripts.resolve(owner, notebook)
        arguments = producer.explicit(arguments)
        ctx = ProducerContext(owner=owner, settings=self.settings, guard=self.exposure.touch)
        started = time.perf_counter()
        result = producer.run(ctx, arguments)
        if ctx.source is None:  # a producer naming no source counts under its tool name
            ctx.use_source(name)
        lineage = {"tool": name, "args": arguments, "parents": [], "notebook": handle}
        lineage["source"] = ctx.source
        if isinstance(result, Batches):  # streamed: the store enforces its cap as it writes
            with contextlib.closing(result):
                art = self.store.put_batches(
                    owner, result.schema, result, lineage=lineage, sensitive=ctx.sensitive
                )
            table = self.store.read_table(owner, art.ref)
        else:
            table = frame_to_table(result)
            art = self.store.put_table(owner, table, lineage=lineage, sensitive=ctx.sensitive)
        elapsed = time.perf_counter() - started
        record_producer(
            self.transcripts,
            owner,
            handle,
            tool=name,
            arguments=arguments,
            ref=art.ref,
            elapsed_s=elapsed,
        )
        return describe(
            art.ref, table, sample_rows=self.settings.describe.sample_rows, sensitive=art.sensitive
        )

    # -- artifacts -------------------------------------------------------------

    def describe_data(self, owner: str, ref: str) -> dict[str, Any]:
        art = self.store.get(owner, ref, kind="table")
        stats = describe_columns(self.store.read_table(owner, ref), sensitive=art.sensitive)
        return {"dataRef": ref, **stats}

    def list_artifacts(self, owner: str) -> dict[str, Any]:
        return {"artifacts": [a.summary() for a in self.store.list(owner)]}

    def drop_artifact(self, owner: str, ref: str) -> dict[str, Any]:
        art = self.store.drop(owner, ref)
        return {"dropped": art.ref, "freed_bytes": art.bytes}
