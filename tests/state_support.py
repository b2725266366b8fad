"""What a server process holds of the shared state, for the state and blob tests."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dataref.config import load_settings
from dataref.downloads import Downloads
from dataref.state import open_state
from dataref.store import ArtifactStore
from dataref.transcript import Transcripts

FRAME = pd.DataFrame({"x": range(1000), "y": [1.5] * 1000})


def settings_for(state_dir: Path, url: str | None, blobs: str | None = None, **store):
    return load_settings(
        state_dir=state_dir, state={"url": url, "pool_size": 4}, store={"blobs": blobs, **store}
    )


class Replica:
    """What a server process holds of the state: the seam and the three indexes on it."""

    def __init__(self, settings) -> None:
        self.state = state = open_state(settings)
        root = settings.state_dir
        self.store = ArtifactStore(
            root / "store",
            settings.store,
            db=state.artifacts_db,
            blob_store=state.artifact_blobs,
            shared=state.shared,
        )
        self.transcripts = Transcripts(root / "notebooks", db=state.notebooks_db)
        self.downloads = Downloads(root / "exports", db=state.links_db, blobs=state.export_blobs)

    def close(self) -> None:
        self.state.close()
