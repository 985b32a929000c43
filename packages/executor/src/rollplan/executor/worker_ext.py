"""vLLM worker extension: in-place weight sync, called through ``collective_rpc``.

vLLM mixes this class into its worker (``worker_extension_cls``), so ``self`` is the worker. On CPU the
weights are repacked after loading, so plain ``load_weights`` fails; ``reload_weights(...,
is_checkpoint_format=True)`` takes checkpoint-format tensors and repeats the repacking. Weights travel as
safetensors bytes (or a path): raw tensors through Ray are much slower (see the CPU notes).

Import-safe without vLLM: only ``torch``/``safetensors`` are needed, and only when a method runs.
"""

from __future__ import annotations

from typing import Any


class WeightSyncExtension:
    """Methods added to the vLLM worker. Names are prefixed to avoid clashing with worker attributes."""

    def rollplan_reload_weights(self, data: bytes | None = None, path: str | None = None) -> int:
        """Load new weights from safetensors ``data`` (bytes) or a safetensors file ``path``.

        Returns the number of tensors loaded. Exactly one of ``data``/``path`` must be given.
        """
        from safetensors.torch import load, load_file

        if data is not None and path is None:
            tensors = load(data)
        elif path is not None and data is None:
            tensors = load_file(path)
        else:
            raise ValueError("give exactly one of data (safetensors bytes) or path")
        worker: Any = self
        worker.reload_weights(weights_iterator=iter(sorted(tensors.items())), is_checkpoint_format=True)
        return len(tensors)
