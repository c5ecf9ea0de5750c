"""Every configuration of a discrete space once, in a seeded shuffled order: a budget smaller
than the grid then samples it evenly."""

from __future__ import annotations

import random
from typing import Any

from fleet.space import Space


class Grid:
    def __init__(self, space: Space, seed: int) -> None:
        cells = list(space.grid())
        random.Random(seed).shuffle(cells)
        self._cells = iter(cells)
        self._count = 0

    def ask(self) -> tuple[int, dict[str, Any]] | None:
        cell = next(self._cells, None)
        if cell is None:
            return None
        self._count += 1
        return self._count - 1, cell

    def tell(self, trial: int, loss: float | None) -> None:
        pass  # a grid learns nothing


def grid(space: Space, seed: int, startup: int | None, budget: int) -> Grid:
    return Grid(space, seed)
