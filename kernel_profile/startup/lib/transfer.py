"""The kernel's end of the "dataref.transfer" comm: tables in, output files out, as binary
buffers over the kernel's own channel (used by kernels on a gateway, which have no route to the
server's files and need none).

Loaded by 00-dataref.py by path (like convert.py); runs as the kernel's uid, so the server
treats everything sent from here as untrusted and checks sizes itself.

Requests (comm_msg data; each answered before the kernel goes idle):
  {"op": "put", "ref", "offset", "total"} + one buffer   a chunk of an Arrow IPC file
  {"op": "commit", "refs": [...]}                        -> {"ok": true} or {"error"}
  {"op": "staged"}                                       -> {"refs": [...]} (tables held)
  {"op": "read", "cell", "file", "max", "chunk"}         -> {"size"}, then {"offset"} + buffer...
  {"op": "remove", "cell"}                               the cell's files are deleted; no reply
Each cell also starts by deleting the files of earlier cells (which the server has read).
"""

import os
import re
import shutil
import stat

import numpy as np
import pyarrow as pa

TARGET = "dataref.transfer"
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{1,64}\Z")
_FILE = re.compile(r"[A-Za-z0-9_\-]{1,64}\.(arrow|png)\Z")


def install(shell, staged, out_root):
    """Register the comm target. ``staged`` maps ref -> pyarrow.Buffer of a whole Arrow file;
    the profile's bind() reads from it before looking in the inputs dir."""
    transfer = Transfer(staged, out_root)
    shell.kernel.comm_manager.register_target(TARGET, transfer.open)
    shell.events.register("pre_run_cell", transfer.clear_earlier_outputs)


class Transfer:
    def __init__(self, staged, out_root):
        self.staged = staged
        self.out_root = out_root
        self.partial = {}  # ref -> [numpy uint8 array, bytes received]

    def open(self, comm, open_msg):
        comm.on_msg(lambda msg: self.on_msg(comm, msg))

    def on_msg(self, comm, msg):
        data = msg["content"]["data"]
        op = data.get("op")
        try:
            if op == "put":
                self.put(data, msg.get("buffers") or [])
                return
            if op == "remove":  # no reply: the server does not wait for it
                self.remove(data)
                return
            if op == "commit":
                reply = self.commit(data)
            elif op == "staged":  # a server attaching to this kernel asks what it holds
                reply = {"refs": sorted(self.staged)}
            elif op == "read":
                reply = self.read(comm, data)
            else:
                reply = {"error": f"unknown op {op!r}"}
        except FileNotFoundError:
            reply = {"error": "missing"}
        except Exception as exc:
            if op == "put":
                self.partial.pop(data.get("ref"), None)
            reply = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        comm.send(reply)

    def put(self, data, buffers):
        ref, total, offset = data["ref"], int(data["total"]), int(data["offset"])
        if not _TOKEN.match(ref) or total < 0 or not buffers:
            raise ValueError("bad put")
        if ref not in self.partial:  # not zeroed: every byte comes
            self.partial[ref] = [np.empty(total, dtype=np.uint8), 0]
        target, _ = self.partial[ref]
        chunk = np.frombuffer(buffers[0], dtype=np.uint8)
        if target.size != total or offset + chunk.size > total:
            raise ValueError(f"chunk of {ref} out of bounds")
        target[offset : offset + chunk.size] = chunk  # the one copy: frame -> assembled file
        self.partial[ref][1] += chunk.size

    def commit(self, data):
        for ref in data.get("refs", []):
            entry = self.partial.pop(ref, None)
            if entry is None or entry[1] != entry[0].size:
                raise ValueError(f"{ref} arrived incomplete")
            self.staged[ref] = pa.py_buffer(entry[0])  # zero-copy: Arrow reads the array
        return {"ok": True}

    def read(self, comm, data):
        cell, name = data["cell"], data["file"]
        limit, chunk = int(data["max"]), max(1 << 16, min(int(data["chunk"]), 4 << 20))
        if not _TOKEN.match(cell) or not _FILE.match(name):
            raise ValueError("bad output name")
        path = os.path.join(self.out_root, cell, name)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb", buffering=0) as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return {"error": "not a regular file"}
            if info.st_size > limit:
                return {"error": "too large", "size": info.st_size}
            comm.send({"size": info.st_size})
            offset = 0
            while block := f.read(chunk):
                comm.send({"offset": offset}, buffers=[block])
                offset += len(block)
        return {"done": offset}

    def remove(self, data):
        cell = data["cell"]
        if isinstance(cell, str) and _TOKEN.match(cell):
            shutil.rmtree(os.path.join(self.out_root, cell), ignore_errors=True)

    def clear_earlier_outputs(self, info):
        """The server has read the last cell's files before it sends the next cell: remote
        servers need no round trip to delete them (a local server deletes them itself)."""
        try:
            entries = list(os.scandir(self.out_root))
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
