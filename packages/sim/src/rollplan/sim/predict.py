"""The length predictor lives in the shared decision core: ``rollplan.policy.predict`` (re-exported here)."""

from rollplan.policy.predict import DEFAULT_PRIOR, SURVIVAL, Predictor, Remaining, SpreadCheck, Totals

__all__ = ["DEFAULT_PRIOR", "SURVIVAL", "Predictor", "Remaining", "SpreadCheck", "Totals"]
