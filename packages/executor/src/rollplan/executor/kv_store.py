"""``AtomicFileConnector``: vLLM's file KV connector, safe when several engines share the store.

Who uses it: every engine the executor starts with ``KVConnectorConfig(kind="example")`` (vLLM loads
this class by module path in each engine process). It carries P/D hand-offs and KV migrations between
engines on one machine (CPU tests and development); GPU clusters use NIXL.

Why not vLLM's ``ExampleConnector`` as is: it counts a prompt's entry as present as soon as the entry's
folder exists, but creates that folder before it writes the per-layer files, and writes them in place.
With several engines on one store, an engine can match an entry another engine is still writing (the
engines of a group prefill the same prompt at the same moment) and load a missing or half-written file:
its EngineCore raises and the engine is dead (``EngineDeadError``). An engine killed while writing (a
node lost) leaves an entry that kills every later engine matching it. CI failed that way after a node
removal (``EngineDeadError`` on the surviving engines); loading a cut-short entry reproduces the crash
(``tests/executor/test_kv_store.py``, checked against the plain connector).

What this subclass changes (the file layout stays vLLM's):
- every layer file is written under a unique temporary name and renamed into place (readers see whole
  files, concurrent writers of one entry do not corrupt each other);
- an entry is complete once the engine that stored all its layers in one step writes ``COMPLETE`` into it,
  listing those layer files;
- a prompt matches only a complete entry whose listed layer files are all there, and a complete entry is not
  stored again. A marker whose files are not all there (seen in ``rollplan bench fidelity``: a layer file of a
  complete entry gone, every engine restarted on the store dying on it in turn) is removed, so the engine
  recomputes and the entry is stored again;
- a failed write (disk full, store cleared meanwhile) only leaves the entry incomplete: it is logged,
  never raised, because the engine can always recompute the KV instead;
- one key for storing, matching and loading (``_key_tokens``: the prompt's whole blocks, its last token left
  out). The base class matches one block fewer than it loads where a prompt's length is one past a whole
  block, and a request resumed after a preemption loads an entry keyed by its prompt and the tokens it had
  generated, which nobody stored; both kill the engine (``FileNotFoundError``) once its own prefix cache
  misses, i.e. under KV pressure or after a trajectory moved engines. That was the "missing layer file" of
  ``rollplan bench fidelity`` (docs/simulator.md, "Fidelity").
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

import safetensors.torch
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
    align_to_block_size,
)
from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

COMPLETE = "COMPLETE"  # marker file: every layer of the entry is in place


def _write_text(path: str, lines: list[str]) -> None:
    with open(path, "w") as f:
        f.write("\n".join(lines))


def entry_complete(folder: str) -> bool:
    """Whether the store entry ``folder`` may be loaded: its ``COMPLETE`` marker lists layer files that are all
    there. A marker whose files are not (or an empty one) is removed, best effort, and the entry is not
    matched: the engine recomputes the KV and stores the entry again."""
    marker = os.path.join(folder, COMPLETE)
    try:
        with open(marker) as f:
            names = [x for x in f.read().splitlines() if x]
    except OSError:
        return False
    if names and all(os.path.exists(os.path.join(folder, n)) for n in names):
        return True
    log.warning("KV store: %s is marked complete but lacks layer files; recomputing it", folder)
    with contextlib.suppress(OSError):
        os.unlink(marker)
    return False


def _write_atomically(path: str, write: Any) -> None:
    """``write(tmp_path)`` then rename onto ``path`` (atomic on one file system)."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class AtomicFileConnector(ExampleConnector):
    """``ExampleConnector`` with atomic layer files and a completion marker (see the module docstring).

    vLLM builds one instance per role (scheduler, worker) in each engine process; the worker instance
    remembers which entries it wrote in the current step and marks them complete in ``wait_for_save``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # entry folder -> the layer files written so far this step (None: a write failed)
        self._written: dict[str, list[str] | None] = {}

    # -- matching (scheduler) ------------------------------------------------------------------------------
    def _key_tokens(self, prompt_token_ids: list[int]) -> int:
        """How many of a prompt's tokens its entry holds: its whole blocks, at least its last token left out
        (vLLM computes that one). The one formula for storing, matching and loading (``ReqMeta.make_meta``'s
        cut of the token ids it is given)."""
        return align_to_block_size(len(prompt_token_ids), self._block_size)

    def _found_match_for_prompt(self, prompt_token_ids: list[int], mm_hashes: list[str]) -> bool:
        # The key the entry is stored and loaded under (``_key_tokens``), and the entry must be complete,
        # not merely exist. vLLM's base class matches the prompt minus its last token: where the prompt's
        # length is one past a whole block, that is one block fewer than the load reads, so a shorter
        # prompt's entry matched and the engine died loading a file that was never written.
        n = self._key_tokens(prompt_token_ids)
        if n <= 0:
            return False
        folder = self._generate_foldername_debug(torch.tensor(prompt_token_ids)[:n], mm_hashes, create_folder=False)
        return entry_complete(folder)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """KV tokens the store adds beyond what the engine computed or had cached: the matched entry's whole
        blocks, 0 when the engine's own prefix cache already covers them (the base class can return a
        negative count there)."""
        prompt = list(request.prompt_token_ids or [])
        if not self._found_match_for_request(request):
            return 0, False
        return max(0, self._key_tokens(prompt) - num_computed_tokens), False

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The base class's step metadata, except that a request resumed after a preemption loads the entry
        it matched (its prompt's key) instead of one keyed by its prompt and generated tokens so far, which
        was never stored (the engine died on the missing file under KV pressure: ``rollplan bench fidelity
        --kv-cache-mib 4``)."""
        meta = ExampleConnectorMetadata()
        for new_req in scheduler_output.scheduled_new_reqs:
            token_ids = list(new_req.prompt_token_ids or [])
            mm_hashes = [f.identifier for f in new_req.mm_features]
            if new_req.req_id in self._requests_need_load:
                meta.add_request(token_ids=token_ids, block_ids=new_req.block_ids[0], block_size=self._block_size,
                                 is_store=False, mm_hashes=mm_hashes)
            elif not self._found_match_for_prompt(token_ids, mm_hashes):
                meta.add_request(token_ids=token_ids, block_ids=new_req.block_ids[0], block_size=self._block_size,
                                 is_store=True, mm_hashes=mm_hashes)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if req_id not in cached.resumed_req_ids or req_id not in self._requests_need_load:
                continue
            request = self._requests_need_load[req_id]
            block_ids = cached.new_block_ids[i]
            assert block_ids is not None  # a resumed request's new blocks are all of its blocks
            meta.add_request(token_ids=list(request.prompt_token_ids or []), block_ids=block_ids[0],
                             block_size=self._block_size, is_store=False,
                             mm_hashes=[f.identifier for f in request.mm_features])
        self._requests_need_load.clear()
        return meta

    # -- storing (worker) ----------------------------------------------------------------------------------
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, ExampleConnectorMetadata)
        for request in meta.requests:
            if not request.is_store:
                continue
            folder = self._generate_foldername_debug(request.token_ids, request.mm_hashes, create_folder=False)
            if (folder in self._written and self._written[folder] is None) or os.path.exists(os.path.join(folder, COMPLETE)):
                continue  # a layer already failed this step, or another engine finished the entry
            try:
                os.makedirs(folder, exist_ok=True)
                kv = self._gather(kv_layer, request.slot_mapping, attn_metadata).detach().cpu()
                path = os.path.join(folder, f"{layer_name}.safetensors")
                _write_atomically(path, lambda tmp, kv=kv: safetensors.torch.save_file({"kv_cache": kv}, tmp))
            except OSError as exc:
                log.warning("KV store: could not write %s/%s: %s", folder, layer_name, exc)
                self._written[folder] = None
            else:
                names = self._written.setdefault(folder, [])
                if names is not None:
                    names.append(os.path.basename(path))

    def _gather(self, layer: torch.Tensor, slot_mapping: torch.Tensor, attn_metadata: Any) -> torch.Tensor:
        """The KV of ``slot_mapping``'s tokens from vLLM's paged layer view ([blocks, heads, block, dim]);
        MLA layers are one flat [slots, dim] view. The same layout the base class loads."""
        slot_mapping = slot_mapping.to(layer.device)
        if isinstance(attn_metadata, MLACommonMetadata):
            return layer.reshape(-1, layer.shape[-1])[slot_mapping, ...]
        return layer[slot_mapping // self._block_size, :, slot_mapping % self._block_size]

    def wait_for_save(self) -> None:
        """End of a forward step: every entry whose layers were all written this step is complete."""
        written, self._written = self._written, {}
        for folder, names in written.items():
            if not names:
                continue
            try:
                _write_atomically(os.path.join(folder, COMPLETE), lambda tmp, names=names: _write_text(tmp, names))
            except OSError as exc:
                log.warning("KV store: could not complete %s: %s", folder, exc)
