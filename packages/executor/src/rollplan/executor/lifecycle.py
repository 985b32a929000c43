"""Engine lifecycle: an explicit state machine.

States: CREATED -> LOADING -> SERVING <-> SLEEPING, SERVING/SLEEPING -> DRAINING -> STOPPED; any state may
go to STOPPED (stop, or the engine died). DRAINING refuses new requests while in-flight ones finish or
are aborted; ``undrain`` returns it to SERVING (a cancelled return). STOPPED is final: a new engine is a
new actor. Every other transition raises ``IllegalTransitionError``.

Pure Python, no clock of its own: callers pass ``now`` so the history (used for latency measurement)
uses whatever clock they run on.
"""

from __future__ import annotations

from enum import StrEnum

from rollplan.models.errors import IllegalTransitionError


class EngineTransitionError(IllegalTransitionError):
    """``IllegalTransitionError`` that survives pickling (it crosses the Ray actor boundary)."""

    def __init__(self, machine: str, state: str, event: str) -> None:
        super().__init__(machine, state, event)
        self._args3 = (machine, state, event)

    def __reduce__(self):  # the base class's args are the message only; rebuild from the three parts
        return (type(self), self._args3)


class EngineStatus(StrEnum):
    CREATED = "created"
    LOADING = "loading"
    SERVING = "serving"
    SLEEPING = "sleeping"
    DRAINING = "draining"
    STOPPED = "stopped"

    @property
    def accepts_requests(self) -> bool:
        """New generate requests are admitted only while SERVING."""
        return self is EngineStatus.SERVING


S = EngineStatus

# event -> {from state: to state}
TRANSITIONS: dict[str, dict[EngineStatus, EngineStatus]] = {
    "load": {S.CREATED: S.LOADING},
    "ready": {S.LOADING: S.SERVING},
    "sleep": {S.SERVING: S.SLEEPING},
    "wake": {S.SLEEPING: S.SERVING},
    "drain": {S.SERVING: S.DRAINING, S.SLEEPING: S.DRAINING},
    "undrain": {S.DRAINING: S.SERVING},
    "stop": {s: S.STOPPED for s in EngineStatus if s is not S.STOPPED},
}


class Lifecycle:
    """The state of one engine. ``fire(event)`` moves it or raises ``IllegalTransitionError``.

    ``history`` lists (time, event, new state) for every accepted transition.
    """

    __slots__ = ("history", "name", "state")

    def __init__(self, name: str, state: EngineStatus = EngineStatus.CREATED) -> None:
        self.name = name
        self.state = state
        self.history: list[tuple[float, str, EngineStatus]] = []

    def can(self, event: str) -> bool:
        return self.state in TRANSITIONS.get(event, {})

    def fire(self, event: str, now: float = 0.0) -> EngineStatus:
        """Apply ``event``; return the new state. Unknown events and disallowed ones raise."""
        targets = TRANSITIONS.get(event)
        if targets is None or self.state not in targets:
            raise EngineTransitionError(f"engine {self.name}", self.state.value, event)
        self.state = targets[self.state]
        self.history.append((now, event, self.state))
        return self.state

    def require(self, *states: EngineStatus, action: str) -> None:
        """Raise ``IllegalTransitionError`` unless the state is one of ``states`` (``action`` names the call)."""
        if self.state not in states:
            raise EngineTransitionError(f"engine {self.name}", self.state.value, action)
