"""The executor's file KV store (``AtomicFileConnector``) in a real vLLM CPU engine (in-process, no Ray).

Invariants checked:
- a stored entry is complete (``COMPLETE`` marker, one whole file per layer, no temporary files left);
- a complete entry loads back (the engine's cached tokens are the prompt's whole blocks) and gives the
  tokens a recompute gives;
- an incomplete entry (marker missing, a layer file cut short: an engine killed mid-write) never matches:
  the engine recomputes instead of dying, gives the same tokens, and the entry is rewritten complete.
  vLLM's plain ``ExampleConnector`` matches such an entry and its EngineCore dies (EngineDeadError), which
  is what failed CI after a node removal;
- a complete entry that lost a layer file (its marker lists the files) is not matched either: recomputed,
  stored again, then loaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from executor_helpers import ReferenceEngine

from rollplan.executor.config import KVConnectorConfig

pytestmark = [pytest.mark.vllm]

BLOCK = 32


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-store")


@pytest.fixture(scope="module")
def engine(tiny_model: Path, store: Path) -> ReferenceEngine:
    from vllm.config import KVTransferConfig

    kv = KVConnectorConfig(storage_path=str(store)).vllm_kwargs()
    assert kv is not None
    return ReferenceEngine(tiny_model, kv_transfer_config=KVTransferConfig(**kv))


def run(engine: ReferenceEngine, prompt: list[int]) -> tuple[list[int], int]:
    """Greedy generation after dropping the prefix cache (so only the store can supply KV)."""
    from vllm import SamplingParams

    engine.llm.reset_prefix_cache()
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    out = engine.llm.generate([{"prompt_token_ids": prompt}], sp, use_tqdm=False)[0]
    return list(out.outputs[0].token_ids), int(out.num_cached_tokens or 0)


def entries(store: Path) -> set[Path]:
    return {p for p in store.iterdir() if p.is_dir()}


def test_stored_entry_is_complete_and_loads_back(engine: ReferenceEngine, store: Path) -> None:
    prompt = list(range(100, 200))  # 100 tokens: the entry holds 3 whole blocks (96 tokens)
    before = entries(store)
    first, cached_first = run(engine, prompt)
    new = entries(store) - before
    assert len(new) == 1 and cached_first == 0
    entry = new.pop()
    layers = sorted(p.name for p in entry.glob("*.safetensors"))
    assert (entry / "COMPLETE").exists() and len(layers) == 2, sorted(p.name for p in entry.iterdir())
    assert not list(store.rglob("*.tmp"))

    again, cached = run(engine, prompt)
    assert cached == 3 * BLOCK  # loaded through the connector, not recomputed
    assert again == first


def test_incomplete_entry_is_recomputed_not_loaded(engine: ReferenceEngine, store: Path) -> None:
    prompt = list(range(300, 370))  # 70 tokens: 2 whole blocks
    before = entries(store)
    first, _ = run(engine, prompt)
    (entry,) = entries(store) - before
    # An engine killed while writing: no marker, one layer file cut short.
    (entry / "COMPLETE").unlink()
    layer = sorted(entry.glob("*.safetensors"))[-1]
    layer.write_bytes(layer.read_bytes()[:40])

    again, cached = run(engine, prompt)
    assert cached == 0 and again == first
    assert (entry / "COMPLETE").exists()  # stored again, whole
    third, cached = run(engine, prompt)
    assert cached == 2 * BLOCK and third == first


def test_complete_entry_missing_a_layer_file_is_recomputed_not_loaded(engine: ReferenceEngine, store: Path) -> None:
    prompt = list(range(500, 570))  # 70 tokens: 2 whole blocks
    before = entries(store)
    first, _ = run(engine, prompt)
    (entry,) = entries(store) - before
    # A complete entry whose layer file went missing (seen in ``rollplan bench fidelity``: every engine
    # restarted on the store matched it and died, in a loop): the marker stays, a layer file does not.
    assert (entry / "COMPLETE").read_text().splitlines() == sorted(p.name for p in entry.glob("*.safetensors"))
    sorted(entry.glob("*.safetensors"))[0].unlink()

    again, cached = run(engine, prompt)
    assert cached == 0 and again == first  # recomputed, the engine alive
    third, cached = run(engine, prompt)
    assert cached == 2 * BLOCK and third == first  # stored again, whole, and loaded

