"""How a search's trials are evaluated: looked up in a replay table (fleet/replay.py), or built
and run on the cloud (fleet/trial.py). Chosen here, above the search, so fleet/tune.py imports
neither evaluator (ARCHITECTURE.md: the CLI picks the evaluator)."""

from __future__ import annotations

from typing import Any

from amibake import recipes
from fleet.search.evaluation import Evaluator
from fleet.tune_spec import TuneSpec


def evaluator(spec: TuneSpec, config: Any) -> Evaluator:
    """How trials are evaluated: looked up in a replay table, or built and run on the cloud."""
    if spec.replay is not None:
        from fleet.replay import ReplayEvaluator

        table = ReplayEvaluator(spec.replay, spec)
        # The search runs what the table holds: a configuration it lacks cannot be looked up
        spec.space = spec.space.holding(table.configurations(), table.prices())
        return table
    from fleet.trial import CloudEvaluator

    # What the workload takes, before anything else is asked of the cloud or the prices (an
    # image's command is checked by the tune spec: its run parameters go through {args}).
    if not spec.image:
        spec.space.check_workload(recipes.load(spec.recipe, config.recipes_dir))
    return CloudEvaluator(spec, config)
