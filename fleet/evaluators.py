"""How a search's trials are evaluated: looked up in a replay table (fleet/replay.py), or built
and run on the cloud (fleet/trial.py). Chosen here, above the search, so fleet/tune.py imports
neither evaluator (ARCHITECTURE.md: the CLI picks the evaluator)."""

from __future__ import annotations

import logging
from typing import Any

from amibake import recipes
from amibake.errors import UserError
from fleet.search.evaluation import Evaluator
from fleet.tune_spec import TuneSpec

log = logging.getLogger("amibake")


def evaluator(spec: TuneSpec, config: Any) -> Evaluator:
    """How trials are evaluated: looked up in a replay table, or built and run on the cloud."""
    if spec.replay is not None:
        from fleet.replay import ReplayEvaluator

        table = ReplayEvaluator(spec.replay, spec)
        # The search runs what the table holds: a configuration it lacks cannot be looked up
        held = table.configurations()
        if not held:  # every search failed on an empty space (a traceback, a run recorded)
            raise UserError(
                f"{spec.replay}: none of its {len(table.table)} rows is a configuration of the "
                "tune file's space (each names a value the file does not list, or leaves a "
                "parameter empty): check the table's values against the file's"
            )
        if len(held) < len(table.table):
            log.warning(
                "%s: %d of its %d rows are not configurations of the tune file's space "
                "(a value it does not list, or a parameter left empty): the search leaves them out",
                spec.replay,
                len(table.table) - len(held),
                len(table.table),
            )
        if spec.trials > len(held):
            # A lookup repeated is the same number: pooled as replicates, it made a "95%
            # interval 10 .. 10" of no noise measured.
            log.warning(
                "%s holds %d configurations: %d trials, not %d (a lookup repeated measures no "
                "noise)",
                spec.replay,
                len(held),
                len(held),
                spec.trials,
            )
            spec.trials = len(held)
        spec.space = spec.space.holding(held, table.prices())
        return table
    from fleet.trial import CloudEvaluator

    # What the workload takes, before anything else is asked of the cloud or the prices (an
    # image's command is checked by the tune spec: its run parameters go through {args}).
    if not spec.image:
        spec.space.check_workload(recipes.load(spec.recipe, config.recipes_dir))
    return CloudEvaluator(spec, config)
