"""Shared fixtures. ``shared_data``: the ../shared/data folder, or skip with the reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("ROLLPLAN_SHARED_DATA", REPO.parent / "shared" / "data"))

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data folder {SHARED_DATA} (present in CI, absent in a fresh clone)")
    return SHARED_DATA
