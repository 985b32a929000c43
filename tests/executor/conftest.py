"""Fixtures for the executor tests: the tiny model (built once per run, two weight seeds) and the
single-engine greedy references (vLLM in-process, no Ray). Helpers live in ``executor_helpers``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama (weights seed 0) and its tokenizer, built once per test run."""
    from rollplan.executor.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-s0"), seed=0)


@pytest.fixture(scope="session")
def tiny_model_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model with weights seed 1 (same tokenizer): the 'new weights' of weight-sync tests."""
    from rollplan.executor.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-s1"), seed=1)


@pytest.fixture(scope="session")
def reference_engine(tiny_model: Path):
    from executor_helpers import ReferenceEngine

    return ReferenceEngine(tiny_model)


@pytest.fixture(scope="session")
def reference_engine_v1(tiny_model_v1: Path, reference_engine):
    from executor_helpers import ReferenceEngine

    return ReferenceEngine(tiny_model_v1)
