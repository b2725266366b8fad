"""A kernel's inputs: stored tables bound as the agent's DataFrames without copying them.

Loaded by 00-dataref.py by path (like convert.py).
"""

import os
import re
import weakref

import pyarrow as pa
import pyarrow.ipc

TOKEN = re.compile(r"[A-Za-z0-9_\-]{1,64}\Z")


class Inputs:
    """The tables this kernel can bind, and what is bound. ``staged`` maps ref -> a whole
    Arrow file as a pyarrow.Buffer (sent over the kernel's channel, lib/transfer.py); any
    other ref is read from ``inputs_dir``."""

    def __init__(self, ns, inputs_dir, frames):
        self.ns = ns
        self.inputs_dir = inputs_dir
        self.frames = frames  # lib/frames.py
        self.bound = {}  # name -> (ref, weakref to the frame the agent got)
        self.staged = {}  # ref -> pyarrow.Buffer
        self.pinned = {}  # ref -> its pristine frame, while any frame made from it lives

    def load(self, source):
        """The input as a DataFrame without copying it: memory-mapped (or the buffer a gateway
        kernel received), one block per column (``split_blocks``), so numeric columns without
        nulls of a one-batch file (the store writes a frame as one batch) stay read-only views
        of the mapping and strings stay Arrow-backed; a float column with nulls is a view too
        when NaN already sits under its nulls (lib/frames.py), any other column with nulls is
        copied (NaN fills them), and a file of several batches (a streamed SQL result) has each
        numeric column joined once into one array. Same dtypes and values as a plain
        ``to_pandas()``, but binding 5M rows of the benchmark's table adds a quarter of its
        Arrow size to the kernel, not twice it. The agent only ever gets shallow copies of this
        pristine frame, and it stays alive (``pinned``) as long as any frame sharing its data
        does, so pandas' copy-on-write always sees a reference and copies a column before the
        agent's code writes to it: writes never hit the read-only mapping, even in a frame kept
        after its name was bound to something else."""
        if isinstance(source, pa.Buffer):
            source = pa.BufferReader(source)
        table = self.frames.nulls_as_nan(pa.ipc.open_file(source).read_all())
        return table.to_pandas(split_blocks=True)

    def bind(self, name, ref):
        """Bind input ``ref`` as DataFrame ``name``; a name already bound to ref is kept."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"input name {name!r} must be a Python identifier")
        if not isinstance(ref, str) or not TOKEN.match(ref):
            raise ValueError(f"bad dataRef {ref!r}")
        known = self.bound.get(name)
        if known is not None and known[0] == ref and self.ns.get(name) is known[1]():
            return
        path = os.path.join(self.inputs_dir, ref + ".arrow")
        source = self.staged.get(ref)
        if source is None and not os.path.isfile(path):
            raise FileNotFoundError(f"input {name!r} ({ref}) is not staged in this kernel")
        pristine = self.pinned.get(ref)
        if pristine is None:
            mapped = pa.memory_map(path) if source is None else source
            pristine = self.pinned[ref] = self.load(mapped)
        frame = pristine.copy(deep=False)
        self.bound[name] = (ref, weakref.ref(frame))  # pinned keeps its pristine frame
        self.ns[name] = frame

    def release(self):
        """Unpin the inputs no name is bound to and no frame of the agent shares data with
        (their mappings then close): a kernel's memory and address space follow what the
        agent's code still uses, not every input it ever bound."""
        current = {entry[0] for entry in self.bound.values()}
        for ref in [r for r in self.pinned if r not in current]:
            try:
                shared = any(b.refs.has_reference() for b in self.pinned[ref]._mgr.blocks)
            except AttributeError:  # another pandas: keep it pinned, never risk a write
                continue
            if not shared:
                del self.pinned[ref]
