"""One error hierarchy for rollplan.

Every error carries the values that caused it (``.values``) and, where the user can act, a ``fix`` hint that
``str()`` appends as "To fix: ...". The CLI prints ``str(err)`` on one line and exits with code 2 for
``UserInputError`` subclasses; library callers catch ``RollplanError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class RollplanError(Exception):
    """Base class of every error rollplan raises on purpose."""

    def __init__(self, message: str, *, fix: str | None = None, **values: Any) -> None:
        self.message = message
        self.fix = fix
        self.values = values
        super().__init__(self.__str__())

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take other constructor arguments; rebuild from the stored state so errors survive
        # pickling (Ray ships exceptions raised inside actors back to the caller this way).
        return (_rebuild, (type(self), self.__dict__.copy()))

    def __str__(self) -> str:
        text = self.message.rstrip(".") + "."
        if self.fix:
            text += " To fix: " + self.fix.rstrip(".") + "."
        return text


def _rebuild(cls: type[RollplanError], state: dict[str, Any]) -> RollplanError:
    err = cls.__new__(cls)
    err.__dict__.update(state)
    Exception.__init__(err, str(err))
    return err


class UserInputError(RollplanError):
    """Bad input from a user: unknown name, bad value, malformed file. CLI exit code 2, no traceback."""


class UnknownNameError(UserInputError):
    """An unknown GPU kind, model, backend or policy name."""

    def __init__(self, what: str, name: str, known: Sequence[str]) -> None:
        super().__init__(
            f"unknown {what} {name!r}",
            fix=f"use one of: {', '.join(sorted(known))}",
            what=what,
            name=name,
            known=tuple(known),
        )


class SchemaError(UserInputError):
    """A document (snapshot, plan, query, config) does not match its schema. ``where`` names file/line/field."""

    def __init__(self, where: str, problem: str, *, fix: str | None = None) -> None:
        super().__init__(f"{where}: {problem}", fix=fix, where=where, problem=problem)


class TraceError(UserInputError):
    """A malformed availability trace or workload file; the message names file:line."""

    def __init__(self, path: str, line: int | None, problem: str, *, fix: str | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}", fix=fix, path=path, line=line, problem=problem)


class InfeasiblePlanError(RollplanError):
    """No plan satisfies the hard constraints. ``reasons`` lists why, each with its own fix."""

    def __init__(self, reasons: Sequence[str], *, fix: str | None = None) -> None:
        self.reasons = tuple(reasons)
        super().__init__(
            "no feasible plan: " + "; ".join(self.reasons),
            fix=fix or "add capacity (slots with more KV memory), shorten contexts, or relax deadlines",
            reasons=self.reasons,
        )


class PlanValidationError(RollplanError):
    """``validate_plan`` found violations: a planner bug, never a user error."""

    def __init__(self, violations: Sequence[str]) -> None:
        self.violations = tuple(violations)
        super().__init__("plan failed validation: " + "; ".join(self.violations[:10]), violations=self.violations)


class SolverError(RollplanError):
    """A solver backend failed in a way that no fallback could absorb."""


class ExecutorError(RollplanError):
    """Base of executor errors (engines, controller, actions)."""


class EngineLostError(ExecutorError):
    """An engine can serve no more requests (its vLLM core died); raised by the engine actor on every
    request from then on. Callers treat it like a lost actor: retry the request elsewhere."""


class IllegalTransitionError(ExecutorError):
    """A lifecycle state machine was asked for a transition it does not allow."""

    def __init__(self, machine: str, state: str, event: str) -> None:
        super().__init__(
            f"{machine}: illegal transition {event!r} from state {state!r}", machine=machine, state=state, event=event
        )


class ActionFailures(ExecutorError):
    """Fan-out of several actions where some failed: every failure is collected, none is lost."""

    def __init__(self, failures: Sequence[tuple[str, BaseException]]) -> None:
        self.failures = tuple(failures)
        parts = [f"{name}: {type(exc).__name__}: {exc}" for name, exc in self.failures]
        super().__init__(f"{len(self.failures)} action(s) failed: " + " | ".join(parts), failures=self.failures)
