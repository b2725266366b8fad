"""Hypothesis strategies of hostile tool arguments, built from each tool's input schema.

Every argument is, at random, either plausible for its parameter (a live ref, a date, a column
name, a small SELECT) or hostile: the wrong type, a huge or NUL-laden string, unicode tricks,
path-like names, refs and notebooks of another owner, extreme numbers, deep nesting. Whole
calls may also miss required arguments or carry unknown ones.

Lone surrogates ("\ud800") are only in the deterministic corpus, which runs in memory: both
wire transports refuse such JSON before any tool runs (HTTP answers 400, stdio drops the line),
so only in-process clients can send them, and a random HTTP example would fail in the client.

Generated text never contains the markers a leak check looks for (``LEAK_MARKERS``), so a
marker in an error message always comes from the server, never from an echoed argument.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

# What an error text must never contain: tracebacks, source locations, server paths.
CHECKOUT = str(Path(__file__).resolve().parents[1]).lower()
LEAK_MARKERS = ("traceback", 'file "', CHECKOUT, "site-packages", '.py", line', "/tmp/", "/root")
LEAK_PATTERNS = (re.compile(r"line \d+, in "), re.compile(r"\bat 0x[0-9a-f]{6,}"))


def leaks(text: str, extra: Sequence[str] = ()) -> list[str]:
    """The leak markers (and ``extra`` paths) found in ``text``."""
    lowered = text.lower()
    found = [m for m in (*LEAK_MARKERS, *(e.lower() for e in extra)) if m in lowered]
    found += [p.pattern for p in LEAK_PATTERNS if p.search(text)]
    return found


def harmless(value: str) -> bool:
    return not leaks(value)


@dataclass
class Pools:
    """Values that mean something to this server: refs and handles, own and foreign."""

    own_refs: list[str] = field(default_factory=list)
    foreign_refs: list[str] = field(default_factory=list)
    own_notebooks: list[str] = field(default_factory=list)
    foreign_notebooks: list[str] = field(default_factory=list)

    @property
    def foreign(self) -> set[str]:
        return set(self.foreign_refs) | set(self.foreign_notebooks)


NEVER_ISSUED = ["data_AAAAAAAAAAAAAAAAAAAAAA", "chart_AAAAAAAAAAAAAAAAAAAAAA", "nb_AAAAAAAAAAAA"]

PATHS = [
    "../../etc/passwd",
    "/etc/passwd",
    "..\\..\\windows\\system32",
    "data_../../store/meta.sqlite",
    "nb_../../notebooks/notebooks.sqlite",
    "./meta.sqlite",
    "~/.ssh/id_rsa",
    "file:///etc/shadow",
    "\\\\server\\share",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "blobs/",
    "*",
    "data_*",
    "%",
]
WEIRD = [
    "",
    " ",
    "\x00",
    "data_\x00",
    "a\x00b",
    "\u202egnp.exe",
    "\u200b\u200d\ufeff",
    "日本語のデータ",
    "🙂" * 50,
    "Ω≈ç√∫",
    "\r\n\r\n",
    "\t",
    "'; DROP TABLE artifacts; --",
    '" OR 1=1 --',
    "${jndi:ldap://x}",
    "{{7*7}}",
    "%s%s%s%n",
    "<script>alert(1)</script>",
    "\\",
    "None",
    "null",
    "NaN",
    "-1",
    "1e309",
]
DATES = ["2025-12-30", "2025-12-01", "2025-06-30", "2026-01-01", "0001-01-01", "9999-12-31"]
DATES_BAD = ["2025-13-01", "2025-02-30", "yesterday", "2025/01/01", "20250101", "-2025-01-01"]
REGIONS = ["North", "South", "East", "West", "Central", "Online", "north", "Atlantis"]
COLUMNS = ["date", "line", "region", "units", "price", "revenue", "nope", "1", "sales.units"]
KINDS = ["bar", "line", "scatter", "hist", "area", "pie", "BAR"]
FORMATS = ["csv", "parquet", "xlsx", "../csv"]
SQL = [
    "SELECT 1 AS one",
    "select count(*) AS n from sales",
    "SELECT region, sum(revenue) AS r FROM sales GROUP BY region",
    "SELECT * FROM sales WHERE date >= '2025-12-30'",
    "SELECT * FROM sales LIMIT 0",
    "SELECT name, sql FROM sqlite_master",
    "SELECT 1 AS a, 2 AS a",
    "SELECT x'00ff' AS b",
    "SELECT 1e999 AS inf",
    "SELECT 9223372036854775807 + 1 AS big",
    "SELECT zeroblob(10) AS z",
    "SELECT char(0) AS nul",
    'SELECT 1 AS "\x00"',
    "SELECT * FROM nope",
    "DELETE FROM sales",
    "SELECT 1; DROP TABLE sales",
    "ATTACH DATABASE '/etc/passwd' AS p",
    "PRAGMA table_info(sales)",
    "SELECT load_extension('/opt/x.so')",
    "SELECT readfile('/etc/passwd')",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 500) SELECT x FROM c",
    "SELECT",
    "SELECT 'unterminated",
    "/* comment */ SELECT 2 AS two -- trailing",
    ";;;",
]
CODE = ["result = 1", "x = 1", "", "   ", "import os", "\x00", "result = outputs"]
INPUT_NAMES = [
    "sales",
    "df",
    "2x",
    "outputs",
    "result",
    "_hidden",
    "__import__",
    "class",
    "a b",
    "a" * 300,
    "дані",
    "",
    "\x00",
]

# Large, but within what one test may throw thousands of times in a minute.
HUGE = st.sampled_from([10_000, 100_000, 600_000]).map(lambda n: "A" * n)
NUMBERS = st.one_of(
    st.sampled_from([0, -1, 1, -(2**63), 2**63, 2**64, 10**30, -(10**30)]),
    st.sampled_from([0.0, -0.0, 1e-300, 1e308, -1e308, math.inf, -math.inf, math.nan]),
    st.integers(),
    st.floats(),
)
SAFE_TEXT = st.text(max_size=40).filter(harmless)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, SAFE_TEXT)
# Nesting beyond ~250 levels is refused by the client's own serializer, before any server.
DEEP = st.integers(50, 200).map(lambda depth: _nest(depth))
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(SAFE_TEXT, inner, max_size=4)
    ),
    max_leaves=12,
)


def _nest(depth: int) -> Any:
    value: Any = "bottom"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def hostile_text(pools: Pools) -> st.SearchStrategy[str]:
    meaningful = [*pools.own_refs, *pools.foreign_refs, *pools.own_notebooks]
    meaningful += [*pools.foreign_notebooks, *NEVER_ISSUED]
    return st.one_of(
        st.sampled_from(PATHS + WEIRD),
        st.sampled_from(meaningful),
        st.sampled_from(meaningful).map(lambda r: r + "\x00"),
        st.sampled_from(meaningful).map(lambda r: r.upper()),
        st.sampled_from(meaningful).map(lambda r: r[:-1]),
        SAFE_TEXT,
        HUGE,
    )


def hostile_value(pools: Pools) -> st.SearchStrategy[Any]:
    """Anything at all: the wrong type as often as a strange value of the right one."""
    return st.one_of(hostile_text(pools), SCALARS, JSON, DEEP, st.just([]), st.just({}))


def known_values(name: str, pools: Pools) -> list[Any] | None:
    """The fixed values worth trying for a parameter this server knows, first the valid one."""
    lowered = name.lower()
    refs = pools.own_refs + pools.foreign_refs + NEVER_ISSUED
    if "ref" in lowered:
        return refs
    table: dict[str, list[Any]] = {
        "notebook": [None, *pools.own_notebooks, *pools.foreign_notebooks],
        "since": DATES + DATES_BAD,
        "until": DATES + DATES_BAD,
        "region": REGIONS,
        "x": COLUMNS[1:] + COLUMNS[:1],
        "y": COLUMNS[4:] + COLUMNS[:4],
        "kind": KINDS,
        "format": FORMATS,
        "query": SQL,
        "source": ["demo", "other", "DEMO", "../demo"],
        "code": CODE,
        "inputs": [{}, *({n: pools.own_refs[0]} for n in INPUT_NAMES if pools.own_refs)],
        "timeout_s": [None, 1, 0, -1, 1e-300, 1e308, math.inf, math.nan, 2**64],
    }
    return table.get(lowered)


def plausible(name: str, schema: dict[str, Any], pools: Pools) -> st.SearchStrategy[Any]:
    """A value that might be accepted for parameter ``name``."""
    lowered = name.lower()
    if lowered == "inputs":
        refs = pools.own_refs + pools.foreign_refs + NEVER_ISSUED
        return st.dictionaries(
            st.sampled_from(INPUT_NAMES) | SAFE_TEXT, st.sampled_from(refs) | SAFE_TEXT, max_size=3
        )
    if "timeout" in lowered:
        return NUMBERS
    known = known_values(name, pools)
    if known:
        return st.sampled_from(known)
    types = _types(schema)
    if "string" in types:
        return SAFE_TEXT
    if "number" in types or "integer" in types:
        return NUMBERS
    if "boolean" in types:
        return st.booleans()
    return JSON


IN_PROCESS_ONLY = ["\ud800", "a\udfffb", "SELECT '\ud800' AS s"]
WRONG_TYPES: list[Any] = [None, True, 0, -1, 2**64, 1e308, [], {}, ["a"], {"a": 1}, _nest(120)]


def corpus(schema: dict[str, Any], pools: Pools) -> list[dict[str, Any]]:
    """Deterministic calls: for each parameter, every fixed hostile value, the rest valid.

    Random search finds combinations; this makes sure each listed value is tried at least once
    for every parameter of every tool, in every run.
    """
    properties: dict[str, Any] = schema.get("properties", {})
    required = schema.get("required", [])
    base = {}
    for name in required:
        known = known_values(name, pools)
        base[name] = known[0] if known else "x"
    meaningful = [*pools.own_refs, *pools.foreign_refs, *pools.own_notebooks]
    meaningful += [*pools.foreign_notebooks, *NEVER_ISSUED]
    calls = [dict(base), {}, {**base, "unexpected": 1}]
    for name in properties:
        values = [*(known_values(name, pools) or []), *WRONG_TYPES, *IN_PROCESS_ONLY]
        values += ["A" * 600_000]
        if "ref" in name.lower() or name in ("notebook", "source", "query", "since", "region"):
            values += [*PATHS, *WEIRD, *meaningful]  # looked up: where traversal would bite
        else:  # free text that is drawn or echoed (a title): a few of each kind
            values += [*PATHS[:3], *WEIRD[:6], *WEIRD[-12::3], "$\\foo$", "$x^{$"]
        calls += [{**base, name: value} for value in values]
    return calls


def _types(schema: dict[str, Any]) -> set[str]:
    found = set()
    for option in [schema, *schema.get("anyOf", []), *schema.get("oneOf", [])]:
        kind = option.get("type")
        if isinstance(kind, str):
            found.add(kind)
        elif isinstance(kind, list):
            found.update(kind)
        if "enum" in option:
            found.add("enum")
    return found


@st.composite
def arguments_for(draw: st.DrawFn, schema: dict[str, Any], pools: Pools) -> dict[str, Any]:
    """Arguments for a tool with input schema ``schema``: mostly shaped, often hostile."""
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    args: dict[str, Any] = {}
    for name, prop in properties.items():
        present = draw(st.integers(0, 9)) < (9 if name in required else 5)
        if not present:
            continue
        if draw(st.integers(0, 2)) == 0:
            args[name] = draw(hostile_value(pools))
        else:
            args[name] = draw(plausible(name, prop, pools))
    if draw(st.integers(0, 15)) == 0:
        args[draw(st.sampled_from(["__proto__", "extra", "dataref", "\x00", "owner"]))] = draw(
            SCALARS
        )
    return args
