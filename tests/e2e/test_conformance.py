"""The MCP conformance suite (0.2.0-alpha.12) against `dataref serve --http`, both eras.

The suite cannot send a bearer token, so it talks to the server through auth_proxy.mjs, which
adds one and changes nothing else: the real auth middleware stays in the path. Expected
failures are in conformance-baseline.txt (scenario + reason, one a line); the suite fails on
any other failure and on a baseline entry that passes now.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import HttpServer
from .conftest import NODE_BIN, TOKEN
from .node import AuthProxy

BASELINE = Path(__file__).with_name("conformance-baseline.txt")


def baseline_entries() -> list[tuple[str, str]]:
    entries = []
    for line in BASELINE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, reason = line.strip().partition(" ")
            assert reason.strip(), f"baseline entry without a reason: {line!r}"
            entries.append((name, reason.strip()))
    return entries


def baseline_yaml(path: Path) -> Path:
    """The suite's --expected-failures format: server: [scenario or scenario:check]."""
    lines = ["server:", *(f"  - {name}" for name, _ in baseline_entries())]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def proxy(http_server: HttpServer, node_env) -> Iterator[AuthProxy]:
    p = AuthProxy(http_server.url, f"Bearer {TOKEN}", node_env)
    yield p
    p.stop()


def test_the_baseline_names_only_fixture_needs_and_gives_each_a_reason() -> None:
    entries = baseline_entries()
    assert entries and len({n for n, _ in entries}) == len(entries)
    protocol = {"dns-rebinding-protection", "tools-list", "server-initialize", "ping", "caching"}
    assert not protocol & {n.split(":")[0] for n, _ in entries}, "protocol scenarios must pass"


@pytest.mark.parametrize("era", ["2026-07-28", "2025-11-25"])
def test_the_conformance_suite_passes_but_for_the_baseline(
    proxy: AuthProxy, node_env, tmp_path: Path, output_dir: Path, era: str
) -> None:
    cmd = [
        str(NODE_BIN / "conformance"),
        "server",
        "--url", f"{proxy.url}/mcp",
        "--requirements", era,
        "--expected-failures", str(baseline_yaml(tmp_path / "baseline.yml")),
        "-o", str(tmp_path / "results"),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=node_env, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    (output_dir / f"conformance-{era}.log").write_text(log)
    total = re.search(r"Total: (\d+) passed, (\d+) failed", log)
    tail = "\n".join(log.splitlines()[-60:])
    assert total, tail
    assert done.returncode == 0, f"unexpected failures or stale baseline entries:\n{tail}"
    assert "Baseline check passed" in log, tail
    print(f"\nconformance {era}: {total[1]} checks passed, {total[2]} failed (all in the baseline)")
