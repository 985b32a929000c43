"""The decision core around ``plan()``: what the simulator's policies and the executor's controller decide
alike (length prediction today; dispatch order and admission next). Pure: no I/O, no clock of its own, no
ray/vllm/torch. The simulator (``rollplan.sim.policies``) and the executor (``rollplan.executor.controller``)
are its two adapters."""

from rollplan.policy.predict import DEFAULT_PRIOR, SURVIVAL, Predictor, Remaining, SpreadCheck, Totals

__all__ = ["DEFAULT_PRIOR", "SURVIVAL", "Predictor", "Remaining", "SpreadCheck", "Totals"]
