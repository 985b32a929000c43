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
  stored again, then loaded;
- a prompt matches only the entry its load reads: one whose length is one past a whole block does not match
  a shorter prompt's entry (vLLM's base class matched one block fewer than it loads, and the engine died on a
  file never written);
- requests preempted under KV pressure resume from the entry they matched (vLLM's base class loaded one keyed
  by the prompt and the tokens generated so far, never stored: FileNotFoundError, the engine dead).
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



def test_prompt_one_past_a_block_does_not_match_a_shorter_prompts_entry(engine: ReferenceEngine, store: Path) -> None:
    short = list(range(700, 750))  # 50 tokens: its entry holds 1 whole block (32)
    run(engine, short)
    longer = list(range(700, 765))  # 65 tokens, the same first 50: its entry would hold 2 blocks (64)
    first, cached = run(engine, longer)
    assert cached == 0  # the short prompt's entry is not the 2 blocks a load would read
    again, cached = run(engine, longer)
    assert cached == 2 * BLOCK and again == first


@pytest.fixture(scope="module")
def small_engine(tiny_model: Path, store: Path) -> ReferenceEngine:
    """An engine with 2 MiB of KV (2,048 tokens of the tiny model: 64 blocks) on the same store: vLLM keeps one
    worker-side KV connector per process (the first engine's), so an in-process engine on another store would
    store its entries in the first engine's store and never match them."""
    from vllm.config import KVTransferConfig

    kv = KVConnectorConfig(storage_path=str(store)).vllm_kwargs()
    assert kv is not None
    return ReferenceEngine(tiny_model, kv_transfer_config=KVTransferConfig(**kv), kv_cache_memory_bytes=2 << 20,
                           disable_log_stats=False)


def test_requests_preempted_under_kv_pressure_resume_from_the_store(small_engine: ReferenceEngine) -> None:
    from vllm import SamplingParams

    llm = small_engine.llm
    prompts = [[(i * 37 + k) % 1000 + 8 for k in range(100)] for i in range(12)]
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=1, ignore_eos=True),
                 use_tqdm=False)  # every prompt's entry stored (3 blocks each)
    llm.reset_prefix_cache()
    before = _preemptions(llm)
    # 12 x 400 tokens (13 blocks each) in 64 blocks: the engine preempts, and the preempted requests resume
    # with the store matching their prompts.
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert _preemptions(llm) > before
    assert [len(o.outputs[0].token_ids) for o in outs] == [300] * 12
    assert [o.num_cached_tokens for o in outs] == [3 * BLOCK] * 12  # every prompt loaded from the store


def _preemptions(llm: object) -> float:
    metrics = llm.get_metrics()  # type: ignore[attr-defined]
    return sum(float(getattr(m, "value", 0.0)) for m in metrics if m.name == "vllm:num_preemptions")
