"""Where artifact and export bytes live: a local or shared directory, or S3.

``store.blobs`` names it: unset (the state dir), ``file:///shared/dataref`` (NFS, EFS,
CephFS: every replica mounts the same directory) or ``s3://bucket/prefix`` (pyarrow's
S3FileSystem; endpoint and credentials from settings or the usual AWS environment).

Every writer writes a complete local file first and then ``put``s it: a rename into place on
a directory, one upload on S3 (an S3 object appears whole or not at all). Kernels read their
inputs through hard links, which need a local file: ``local_path`` is the file itself on a
directory and a copy in the replica's local cache (``<state_dir>/cache``) on S3, downloaded
once and then reused (blobs never change after they are written).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from ..files import fsync_dir, part_name


class BlobStore(Protocol):
    url: str

    def put(self, key: str, part: Path) -> None: ...
    def local_path(self, key: str) -> Path: ...
    def exists(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def keys_older_than(self, prefix: str, seconds: float) -> list[str]: ...
    def ping(self) -> None: ...


class FileBlobs:
    """A directory: local disk, or one every replica mounts."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def path(self, key: str) -> Path:
        return self.root / key

    def put(self, key: str, part: Path) -> None:
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(part, final)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # another filesystem (a shared mount): copy next to the final name, then rename
            near = final.parent / part_name(final.name)
            try:
                shutil.copyfile(part, near)
                os.chmod(near, 0o644)
                os.replace(near, final)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    near.unlink()
        fsync_dir(final.parent)

    def local_path(self, key: str) -> Path:
        return self.path(key)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()

    def keys_older_than(self, prefix: str, seconds: float) -> list[str]:
        base = self.root / prefix if prefix else self.root
        cutoff = time.time() - seconds
        found = []
        for path in base.rglob("*") if base.is_dir() else []:
            with contextlib.suppress(FileNotFoundError):
                if path.is_file() and path.stat().st_mtime < cutoff:
                    found.append(str(path.relative_to(self.root)))
        return found

    def ping(self) -> None:
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise OSError(f"blob directory {self.root} is not writable")


class S3Blobs:
    """An S3 bucket (or any S3 API) with a local read cache for kernels' hard links."""

    def __init__(
        self,
        url: str,
        cache: Path,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        from pyarrow import fs

        parsed = urlparse(url)
        self.url = url
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        options: dict[str, object] = {}
        if endpoint:
            options["endpoint_override"] = endpoint
            options["scheme"] = urlparse(endpoint).scheme or "https"
        if region:
            options["region"] = region
        if access_key and secret_key:
            options["access_key"], options["secret_key"] = access_key, secret_key
        self.fs = fs.S3FileSystem(**options)  # otherwise AWS_* environment / instance role
        self.cache = Path(cache)
        self.cache.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _object(self, key: str) -> str:
        return "/".join(p for p in (self.bucket, self.prefix, key) if p)

    def put(self, key: str, part: Path) -> None:
        with open(part, "rb") as src, self.fs.open_output_stream(self._object(key)) as out:
            shutil.copyfileobj(src, out, 8 << 20)
        cached = self.cache / key  # the writer keeps its copy: its kernels read it next
        cached.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, cached)

    def local_path(self, key: str) -> Path:
        cached = self.cache / key
        if cached.is_file():
            return cached
        cached.parent.mkdir(parents=True, exist_ok=True)
        part = cached.parent / part_name(cached.name)
        try:
            with self.fs.open_input_stream(self._object(key)) as src, open(part, "wb") as out:
                shutil.copyfileobj(src, out, 8 << 20)
            os.chmod(part, 0o644)
            os.replace(part, cached)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if "NoSuchKey" in str(exc) or "does not exist" in str(exc):
                raise FileNotFoundError(key) from exc
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                part.unlink()
        return cached

    def exists(self, key: str) -> bool:
        from pyarrow import fs

        return self.fs.get_file_info(self._object(key)).type == fs.FileType.File

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.cache / key).unlink()
        with contextlib.suppress(FileNotFoundError, OSError):
            self.fs.delete_file(self._object(key))

    def keys_older_than(self, prefix: str, seconds: float) -> list[str]:
        from pyarrow import fs

        base = self._object(prefix)
        selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
        cutoff = time.time() - seconds
        start = len(self._object("")) + 1 if self._object("") else 0
        return [
            info.path[start:]
            for info in self.fs.get_file_info(selector)
            if info.type == fs.FileType.File
            and info.mtime is not None
            and info.mtime.timestamp() < cutoff
        ]

    def ping(self) -> None:
        from pyarrow import fs

        if self.fs.get_file_info(self.bucket).type != fs.FileType.Directory:
            raise OSError(f"S3 bucket {self.bucket!r} is not reachable")


def open_blobs(
    url: str | None,
    default_root: Path,
    cache: Path,
    *,
    endpoint: str | None = None,
    region: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
) -> BlobStore:
    if not url:
        return FileBlobs(default_root)
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return FileBlobs(Path(unquote(parsed.path)))
    if parsed.scheme == "s3":
        return S3Blobs(
            url,
            cache,
            endpoint=endpoint,
            region=region,
            access_key=access_key,
            secret_key=secret_key,
        )
    raise ValueError(f"store.blobs must be file:///path or s3://bucket/prefix, not {url!r}")
