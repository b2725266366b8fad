"""Consumers: charts and exports by reference, straight from the store to a person.

Nothing here knows MCP. ``app.py`` resolves the owner and the base URL of download links
(``None`` off HTTP: then a local ``path`` is returned instead of a ``url``) and turns the
results into content blocks. Drawing lives in ``charts.py``, the link index in
``downloads.py``.
"""

from __future__ import annotations

import errno
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from . import charts
from .artifact import Artifact
from .describe import describe
from .downloads import Link
from .errors import InvalidRequest, StorageError, unknown_ref
from .png import PNG_MAGIC, shrink_png
from .transcript import record_chart

if TYPE_CHECKING:
    from .workspace import Workspace

MAX_KERNEL_FIGURE_BYTES = 2 * 1024 * 1024
FORMATS = {
    "csv": ("text/csv", ".csv"),
    "parquet": ("application/vnd.apache.parquet", ".parquet"),
}


# A chart of sensitive data is a picture of that data: it goes to the person, not the model.
SENSITIVE_NOTE = "sensitive data: the image is not sent to the model; open the url/path"


@dataclass(frozen=True)
class Chart:
    info: dict[str, Any]  # {chartRef, url | path, bytes, note?}: what the agent reads
    png: bytes  # what the person sees, and the agent unless the data is sensitive
    sensitive: bool = False


# -- charts ----------------------------------------------------------------------


def render_chart(
    ws: Workspace,
    owner: str,
    *,
    data_ref: str,
    x: str,
    y: str | None,
    kind: str,
    title: str | None = None,
    notebook: str | None = None,
    base_url: str | None = None,
) -> Chart:
    """Draw a chart of an artifact, store it as an owner-scoped chart artifact, record it."""
    charts.check_kind(kind)
    title = charts.clean_text(title)
    handle = ws.transcripts.resolve(owner, notebook)
    source = ws.store.get(owner, data_ref, kind="table")
    table = ws.store.read_table(owner, data_ref)
    columns = {name: str(table.schema.field(name).type) for name in table.column_names}
    y, notes = charts.check_request(columns, x, y, kind)
    # Only the charted columns leave Arrow: a wide table costs no more than a narrow one.
    frame = table.select(list(dict.fromkeys(c for c in (x, y) if c))).to_pandas()
    png, drawn = charts.render_png(frame, x, y, kind, title, ws.settings.charts)
    notes += drawn
    args = {"dataRef": data_ref, "x": x, "y": y, "kind": kind, "title": title}
    lineage = {"tool": "render_chart", "args": args, "parents": [data_ref], "notebook": handle}
    art = store_chart(ws, owner, png, lineage, source.sensitive)
    info: dict[str, Any] = {"chartRef": art.ref, **chart_link(ws, art, base_url)}
    info["bytes"] = art.bytes
    if notes:
        info["note"] = "; ".join(notes)
    record_chart(
        ws.transcripts,
        owner,
        handle,
        data_ref=data_ref,
        x=x,
        y=y,
        kind=kind,
        title=title,
        chart_ref=art.ref,
    )
    if source.sensitive:
        info["note"] = "; ".join([*notes, SENSITIVE_NOTE])
    return Chart(info=info, png=png, sensitive=source.sensitive)


def chart_link(ws: Workspace, art: Artifact, base_url: str | None) -> dict[str, str]:
    """{url} of a download link over HTTP; {path} of the stored PNG for a local person."""
    if base_url is None:
        return {"path": str(art.path)}
    ttl = min(ws.settings.server.download_ttl_seconds, max(art.expires - time.time(), 1))
    link = ws.downloads.add(
        art.owner,
        kind="chart",
        target=art.ref,
        media_type="image/png",
        filename=f"{art.ref}.png",
        ttl=ttl,
    )
    return {"url": download_url(base_url, link)}


def download_url(base_url: str, link: Link) -> str:
    return f"{base_url.rstrip('/')}/download/{link.token}"


def kernel_charts(
    ws: Workspace, owner: str, entries: list[dict[str, Any]], base_url: str | None, limit: int
) -> list[tuple[str, bytes]]:
    """Figures run_python stored: add each one's url/path, return the first ``limit`` PNGs.

    The PNGs are bounded by ``charts.max_png_bytes`` (a kernel figure may be larger: the
    stored artifact keeps the original, the agent sees a smaller copy).
    """
    images = []
    for entry in entries:
        art = ws.store.get(owner, entry["chartRef"], kind="chart")
        entry.update(chart_link(ws, art, base_url))
        if art.sensitive:
            entry["note"] = SENSITIVE_NOTE
        elif len(images) < limit:
            png = shrink_png(art.path.read_bytes(), ws.settings.charts.max_png_bytes)
            images.append((art.ref, png))
    return images


def store_chart(
    ws: Workspace, owner: str, png: bytes, lineage: dict[str, Any], sensitive: bool
) -> Artifact:
    return ws.store.put_bytes(
        owner,
        png,
        kind="chart",
        media_type="image/png",
        suffix=".png",
        lineage=lineage,
        sensitive=sensitive,
    )


def store_kernel_figure(
    ws: Workspace, owner: str, data: bytes, name: str, lineage: dict[str, Any], sensitive: bool
) -> dict[str, Any] | None:
    """Store a PNG a kernel saved (read by the caller without following links) as a chart."""
    if len(data) > MAX_KERNEL_FIGURE_BYTES or not data.startswith(PNG_MAGIC):
        return None
    art = store_chart(ws, owner, data, {**lineage, "figure": name}, sensitive)
    return {"chartRef": art.ref, "bytes": art.bytes}


# -- exports ---------------------------------------------------------------------


def export_data(
    ws: Workspace, owner: str, *, data_ref: str, fmt: str, base_url: str | None = None
) -> dict[str, Any]:
    """Write an artifact as CSV or Parquet for a person; returns where, never the rows."""
    if fmt not in FORMATS:
        raise InvalidRequest(f"unknown export format {fmt!r}; formats are: {', '.join(FORMATS)}")
    table = ws.store.read_table(owner, data_ref)  # memory-mapped: streamed, not loaded
    media_type, suffix = FORMATS[fmt]
    writer = _write_csv if fmt == "csv" else _write_parquet
    try:
        link = ws.downloads.publish(
            owner,
            name=f"{data_ref}-{secrets.token_hex(4)}{suffix}",
            media_type=media_type,
            filename=f"{data_ref}{suffix}",
            ttl=ws.settings.server.download_ttl_seconds,
            write=lambda path: writer(table, path),
        )
    except OSError as exc:
        raise _export_error(exc) from exc
    path = ws.downloads.file_of(link)
    where = {"url": download_url(base_url, link)} if base_url else {"path": str(path)}
    return {
        **where,
        "rows": table.num_rows,
        "bytes": path.stat().st_size,
        "format": fmt,
        "expires": _iso(link.expires),
    }


def _write_csv(table: pa.Table, path: Path) -> None:
    table = _csv_ready(table)
    with pacsv.CSVWriter(str(path), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=65536):
            writer.write_batch(batch)


def _csv_ready(table: pa.Table) -> pa.Table:
    """Dictionary (categorical) columns decoded; nested columns refused with a way out."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            decoded = table.column(i).cast(field.type.value_type)
            table = table.set_column(i, field.name, decoded)
        elif pa.types.is_timestamp(field.type) and field.type.tz is None:
            table = table.set_column(i, field.name, _plain_times(table.column(i)))
        elif pa.types.is_nested(field.type):
            raise InvalidRequest(
                f"column {field.name!r} holds {field.type} values, which CSV cannot hold - "
                "export as parquet, or flatten it in run_python first"
            )
    return table


def _plain_times(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Times as a spreadsheet reads them: '2025-01-01' at midnight, else whole seconds.

    Arrow writes every digit of the unit ('2025-01-01 00:00:00.000000000'); only exact
    conversions are made, so the file still holds the same instants.
    """
    try:
        seconds = column.cast(pa.timestamp("s"))  # a safe cast refuses to drop fractions
    except pa.ArrowInvalid:
        return column
    at_midnight = pc.all(pc.equal(pc.floor_temporal(seconds, unit="day"), seconds)).as_py()
    return seconds.cast(pa.date32()) if at_midnight is not False else seconds


def _write_parquet(table: pa.Table, path: Path) -> None:
    # The pandas metadata travels along, so pandas.read_parquet gives back the same frame.
    pq.write_table(table, str(path), compression="zstd", row_group_size=1 << 20)


def _export_error(exc: OSError) -> StorageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageError("the server's disk is full - nothing was exported; try again later")
    return StorageError("the export could not be written - try again")


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# -- downloads and resources -----------------------------------------------------


def open_download(ws: Workspace, owner: str, token: str) -> tuple[Path, Link]:
    """The file behind a download token, for its owner only (else NotFound / LinkExpired)."""
    link = ws.downloads.lookup(token, owner)
    if link.kind == "chart":
        return ws.store.get(owner, link.target, kind="chart").path, link
    return ws.downloads.file_of(link), link


def artifact_description(ws: Workspace, owner: str, ref: str) -> dict[str, Any]:
    """The Description of a table artifact; a short summary of a chart."""
    art = ws.store.get(owner, ref)
    if art.kind == "table":
        table = ws.store.read_table(owner, ref)
        return describe(
            ref, table, sample_rows=ws.settings.describe.sample_rows, sensitive=art.sensitive
        )
    return {"chartRef": ref, **art.summary(), "bytes": art.bytes}


def chart_png(ws: Workspace, owner: str, ref: str) -> bytes:
    if not ref.startswith("chart_"):
        raise unknown_ref(ref)
    return ws.store.get(owner, ref, kind="chart").path.read_bytes()
