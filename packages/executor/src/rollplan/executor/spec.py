"""Group-shared drafting for speculative decoding (Seer's idea) as a vLLM ``custom_class`` proposer.

The samples of one prompt (a GRPO group) produce similar text, so a sample can draft its next tokens from
what its siblings already wrote. vLLM's built-in ``ngram`` proposer cannot do this: it looks up n-grams in
the request's own prompt and output only (``token_ids_cpu[row, :num_tokens]``, see
``vllm/v1/spec_decode/ngram_proposer.py``). ``GroupNgramProposer`` runs the same n-gram match (vLLM's own
``_find_longest_matched_ngram_and_propose_tokens``) over

1. the request's own context (what ``ngram`` does), then
2. the outputs of its running siblings on the same engine (rows of the same group in this step's batch), and
3. the outputs of up to ``group_pool`` finished siblings on the same engine,

and keeps the longest draft (ties: the first source in that order). Verification is vLLM's, so under greedy
decoding the output is token-identical to plain decoding whatever is drafted; only speed changes.

Groups: a request id containing ``@g:<group>@`` (``group_request_id``; the engine actor adds it when the
request's params name a ``group``) belongs to ``<group>``; any other request's group is its prompt (siblings'
first turns share the prompt exactly). Siblings must run on the same engine to share drafts: that is a routing
decision (docs/seer.md).

Contract with vLLM 0.32's model runner (pinned by the ``cpu`` extra): ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu, slot_mappings=None)`` is called from ``propose_draft_token_ids`` of the
runner, whose ``input_batch`` maps rows to request ids and prompt lengths; the proposer reads it from the
calling frame (vLLM passes no request ids to custom proposers). Without it (another vLLM), drafting falls back
to the request's own context: still lossless, just no sharing.

Configuration travels in ``ROLLPLAN_GROUP_NGRAM="min_n,max_n,pool"`` (vLLM resets the prompt lookup sizes
of custom proposers); the draft length is vLLM's ``num_speculative_tokens``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections import deque
from typing import Any

import numpy as np

from rollplan.executor.config import GROUP_NGRAM_ENV

log = logging.getLogger(__name__)

_GROUP_RE = re.compile(r"@g:([^@]*)@")


def group_request_id(request_id: str, group: str) -> str:
    """The vLLM request id that puts ``request_id`` into ``group`` for group-ngram drafting."""
    return f"{request_id}@g:{group.replace('@', '_')}@"


def group_of(request_id: str, prompt: np.ndarray) -> str | bytes:
    """A request's drafting group: the ``@g:...@`` tag of its id, else its prompt's bytes."""
    m = _GROUP_RE.search(request_id)
    return m.group(1) if m else prompt.tobytes()


def draft_from(src: np.ndarray, tail: np.ndarray, min_n: int, k: int, near: int) -> np.ndarray:
    """Up to ``k`` tokens of ``src`` that follow the longest match (>= ``min_n`` tokens, at most
    ``len(tail)``) of ``tail``'s end inside ``src``; ties go to the match closest to position ``near`` (siblings
    write similar text at similar positions). Empty when nothing matches. The draft lies wholly inside ``src``:
    a sibling that is exactly as far as the request drafts nothing (its next tokens do not exist yet)."""
    size = len(src)
    if size < min_n + 1 or len(tail) < min_n:
        return src[:0]
    ends = np.flatnonzero(src[: size - 1] == tail[-1])  # match ends with a token after them
    best_n, best_end = 0, -1
    for end in ends[-256:].tolist():  # bounded work per source on repetitive text
        m = 1
        while m < len(tail) and end - m >= 0 and src[end - m] == tail[-1 - m]:
            m += 1
        if m > best_n or (m == best_n and abs(end - near) < abs(best_end - near)):
            best_n, best_end = m, end
    if best_n < min_n:
        return src[:0]
    return src[best_end + 1 : best_end + 1 + k]


class GroupNgramProposer:
    """vLLM custom proposer: n-gram lookup over the request's own context and its group siblings' outputs."""

    def __init__(self, vllm_config: Any) -> None:
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        self._find = _find_longest_matched_ngram_and_propose_tokens
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        raw = os.environ.get(GROUP_NGRAM_ENV, "2,4,8")
        self.min_n, self.max_n, self.pool = (int(x) for x in raw.split(","))
        self._group: dict[str, str | bytes] = {}  # request id -> group, for requests seen running
        self._prompt_len: dict[str, int] = {}
        self._last_output: dict[str, np.ndarray] = {}  # request id -> its output so far (copied each step)
        self._finished: dict[str | bytes, deque[np.ndarray]] = {}  # group -> finished siblings' outputs
        self._warned = False
        # Compile the numba matcher now, not inside the first decode step.
        self._find(np.arange(8, dtype=np.int32), self.min_n, self.max_n, self.max_model_len, self.k)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model: drafts come from text already generated."""

    def _input_batch(self) -> Any:
        # The runner calls propose() from its own method; vLLM hands custom proposers no request ids.
        frame = sys._getframe(1)
        batch = None
        for _ in range(4):  # propose() <- the runner's propose_draft_token_ids (or a wrapper in between)
            frame = frame.f_back
            if frame is None:
                break
            batch = getattr(frame.f_locals.get("self"), "input_batch", None)
            if batch is not None:
                break
        if batch is None and not self._warned:
            self._warned = True
            log.warning("group-ngram: no input batch in the caller; drafting from own context only")
        return batch

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        batch = self._input_batch()
        n_rows = len(sampled_token_ids)
        req_ids: list[str] = []
        index: dict[str, int] = {}
        prompt_lens: Any = None
        if batch is not None:
            req_ids, index, prompt_lens = list(batch.req_ids[:n_rows]), batch.req_id_to_index, batch.num_prompt_tokens
        live = set(req_ids)
        # Requests gone from the batch finished (or were preempted: a stale partial output is still a
        # valid draft source, and a resumed request simply re-registers).
        for rid in [r for r in self._group if r not in live]:
            out = self._last_output.pop(rid, None)
            group = self._group.pop(rid)
            self._prompt_len.pop(rid, None)
            if out is not None and len(out):
                self._finished.setdefault(group, deque(maxlen=self.pool)).append(out)
        rows_of: dict[str | bytes, list[int]] = {}
        for i, rid in enumerate(req_ids):
            if rid not in self._group:
                p = int(prompt_lens[index[rid]])
                self._prompt_len[rid] = p
                self._group[rid] = group_of(rid, token_ids_cpu[i, :p])
            n = int(num_tokens_no_spec[i])
            self._last_output[rid] = token_ids_cpu[i, self._prompt_len[rid] : n].copy()
            rows_of.setdefault(self._group[rid], []).append(i)

        drafts: list[list[int]] = []
        for i in range(n_rows):
            n = int(num_tokens_no_spec[i])
            k = min(self.k, self.max_model_len - n - 1)
            if not sampled_token_ids[i] or k <= 0:
                drafts.append([])
                continue
            ctx = token_ids_cpu[i, :n]
            best = self._find(ctx, self.min_n, self.max_n, self.max_model_len, k)
            if len(best) < k and req_ids:
                rid = req_ids[i]
                group = self._group[rid]
                tail = ctx[-self.max_n :]
                here = n - self._prompt_len[rid]
                sources = [self._last_output[req_ids[j]] for j in rows_of.get(group, ()) if j != i]
                sources += list(self._finished.get(group, ()))
                for src in sources:
                    cand = draft_from(src, tail, self.min_n, k, here)
                    if len(cand) > len(best):
                        best = cand
                        if len(best) >= k:
                            break
            drafts.append(best.tolist())
        return drafts
