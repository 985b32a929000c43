"""Speculative decoding on the CPU engines (issue 17, docs/seer.md).

Invariants (hypothesis):
- ``draft_from`` returns a slice of the source that directly follows an occurrence of the tail's last
  ``>= min_n`` tokens, at most ``k`` long, never reaching past the source's end;
- a sibling that wrote the same text as the request and is further ahead drafts exactly the request's true
  next tokens; one exactly as far drafts nothing (its next tokens do not exist yet).

Bad input: an unknown method, a draft length <= 0, the suffix method without its package, and inverted
lookup sizes each give one line with "To fix:" (also through the CLI, exit code 2).

Real engines (marked ray/vllm/slow, ~1 min): a plain and a group-ngram engine under Ray decode the same
greedy grouped workload; the output is token-identical, siblings draft from the lead's output (acceptance
well above zero), and every speculative result carries vLLM's per-request drafted/accepted counts.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollplan.executor.config import EngineConfig, KVConnectorConfig, SpeculativeConfig
from rollplan.executor.spec import draft_from, group_of, group_request_id
from rollplan.models.errors import SchemaError, UnknownNameError, UserInputError


def _cfg(**kw) -> EngineConfig:
    return EngineConfig(model="m", connector=KVConnectorConfig(kind="none"), **kw)


# -- configuration ------------------------------------------------------------------------------------------
def test_engine_kwargs_carry_speculative_config() -> None:
    assert "speculative_config" not in _cfg().engine_kwargs(sleep_mode_available=False)
    kw = _cfg(speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=3)).engine_kwargs(
        sleep_mode_available=False
    )
    assert kw["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
    }
    assert kw["per_request_spec_decode_metrics"] == "summary"
    group = _cfg(speculative=SpeculativeConfig())
    kw = group.engine_kwargs(sleep_mode_available=False)
    assert kw["speculative_config"]["method"] == "custom_class"
    assert kw["speculative_config"]["model"] == "rollplan.executor.spec.GroupNgramProposer"
    assert group.env_vars()["ROLLPLAN_GROUP_NGRAM"] == "2,4,8"


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"method": "eagle9"}, UnknownNameError, "unknown speculative method 'eagle9'"),
        ({"num_speculative_tokens": 0}, SchemaError, "num_speculative_tokens: must be a positive integer"),
        ({"num_speculative_tokens": -2}, SchemaError, "got -2"),
        ({"prompt_lookup_min": 5, "prompt_lookup_max": 3}, SchemaError, "above prompt_lookup_max"),
    ],
)
def test_bad_speculative_config_is_one_line_with_a_fix(kwargs: dict, error: type, text: str) -> None:
    with pytest.raises(error) as exc:
        SpeculativeConfig(**kwargs)
    msg = str(exc.value)
    assert text in msg and "To fix:" in msg and "\n" not in msg


@pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is not None, reason="arctic-inference installed")
def test_suffix_without_its_package_says_how_to_install_it() -> None:
    with pytest.raises(UserInputError, match=r"arctic-inference.*To fix: pip install"):
        SpeculativeConfig(method="suffix")


def test_cli_refuses_bad_spec_options_before_starting_engines(capsys: pytest.CaptureFixture[str]) -> None:
    from rollplan.solver.cli import main

    for bad in (["--spec-tokens", "0"], ["--spec-method", "nope"]):
        assert main(["bench", "executor", "--spec", "--spec-only", *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "To fix:" in err


# -- drafting ----------------------------------------------------------------------------------------------
def test_group_of_reads_the_tag_else_the_prompt() -> None:
    prompt = np.array([1, 2, 3], dtype=np.int32)
    assert group_of(group_request_id("req-7", "g@1") + "-abcd1234", prompt) == "g_1"
    assert group_of("req-7-abcd1234", prompt) == prompt.tobytes()


tokens = st.lists(st.integers(0, 20), min_size=0, max_size=60)


@settings(max_examples=200, deadline=None)
@given(src=tokens, tail=st.lists(st.integers(0, 20), min_size=1, max_size=5), k=st.integers(1, 8),
       min_n=st.integers(1, 3), near=st.integers(0, 60))
def test_draft_follows_a_match_inside_the_source(src: list[int], tail: list[int], k: int, min_n: int,
                                                 near: int) -> None:
    s, t = np.array(src, dtype=np.int32), np.array(tail, dtype=np.int32)
    d = draft_from(s, t, min_n, k, near).tolist()
    assert len(d) <= k
    if d:
        ok = False
        for end in range(len(src) - 1):
            m = 0
            while m < len(tail) and end - m >= 0 and src[end - m] == tail[-1 - m]:
                m += 1
            if m >= min_n and src[end + 1 : end + 1 + k] == d:
                ok = True
        assert ok


@settings(max_examples=100, deadline=None)
@given(text=st.lists(st.integers(0, 1000), min_size=12, max_size=80, unique=True), data=st.data())
def test_a_sibling_ahead_drafts_the_true_continuation(text: list[int], data: st.DataObject) -> None:
    here = data.draw(st.integers(4, len(text) - 1))
    k = data.draw(st.integers(1, 6))
    sib = np.array(text, dtype=np.int32)
    mine = sib[:here]
    assert draft_from(sib, mine[-4:], 2, k, here).tolist() == text[here : here + k]
    assert draft_from(mine.copy(), mine[-4:], 2, k, here).tolist() == []  # a sibling exactly as far


# -- real engines ------------------------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.vllm
@pytest.mark.slow
def test_group_ngram_engine_is_lossless_and_drafts_from_siblings(tiny_model) -> None:
    pytest.importorskip("vllm")
    from rollplan.executor.bench import run_spec_bench

    out = run_spec_bench(
        method="group-ngram", num_speculative_tokens=4, repeats=1, groups=2, samples=3, max_tokens=48,
        model=tiny_model,
    )
    assert out["lossless"] is True
    assert out["method"] == "group-ngram"
    # 4 of the 6 samples follow a finished sibling: their drafts are the sibling's (identical, greedy) text.
    assert out["acceptance_rate"] > 0.5
    assert out["mean_tokens_per_step"] > 1.5
    assert out["per_request_acceptance"]["requests"] >= 4
