"""docs/schema.md embeds the generated JSON Schemas: they must match the code (no drift)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rollplan.models.io import json_schema, snapshot_from_json
from rollplan.models.types import ClusterSnapshot, Plan

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"


def _blocks() -> list[str]:
    return re.findall(r"```json\n(.*?)\n```", DOC.read_text(), flags=re.S)


def test_embedded_schemas_match_the_code() -> None:
    blocks = [json.loads(b) for b in _blocks()]
    assert json_schema(ClusterSnapshot) in blocks, "regenerate the ClusterSnapshot schema in docs/schema.md"
    assert json_schema(Plan) in blocks, "regenerate the Plan schema in docs/schema.md"


def test_example_snapshot_parses() -> None:
    snap = snapshot_from_json(_blocks()[0])
    assert snap.slots and snap.trajectories
