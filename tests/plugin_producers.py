"""A third-party producer module, loaded through settings.producers.plugins in tests."""

from __future__ import annotations

import pandas as pd

from dataref.producers import ProducerContext, producer


@producer
def fetch_squares(ctx: ProducerContext, n: int, label: str = "sq") -> pd.DataFrame:
    """The first n squares (a test plugin)."""
    return pd.DataFrame({"i": range(n), label: [i * i for i in range(n)], "owner": ctx.owner})


@producer(sensitive=True)
def fetch_secrets(ctx: ProducerContext, n: int = 3) -> pd.DataFrame:
    """Rows from a sensitive system (a test plugin)."""
    return pd.DataFrame({"secret": [f"s{i}" for i in range(n)]})
