"""Adapters that plug ``RolloutExecutor`` into RL frameworks (docs/integration.md).

- ``rollplan.executor.integrations.trl``: ``RollplanRollout``, a ``rollout_func`` for TRL's ``GRPOTrainer``.

Importing this package imports no framework: each adapter module loads its framework lazily, so
``rollplan.executor`` works without any of them installed.
"""
