"""The types a trial's result travels in, from an evaluator to the search and the record."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# What an infeasible or failed trial tells a search that needs a number: worse than anything
# real, so TPE puts it among the bad trials (it ranks losses; the magnitude does not matter).
PENALTY = 1e18


@dataclass(frozen=True)
class Evaluation:
    state: str  # ok | infeasible | failed
    loss: float | None = None
    metric: float | None = None
    seconds: float | None = None  # per unit of work, as cost_per_unit
    cost_per_unit: float | None = None
    usd: float = 0.0  # what the trial cost to run
    reason: str = ""
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def ok_loss(self) -> float | None:
        """The loss the search learns from: None for a trial that failed or broke a target."""
        return self.loss if self.state == "ok" else None


Evaluator = Callable[[int, dict[str, Any]], Evaluation]
