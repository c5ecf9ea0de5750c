"""A cloud tune's recommended build, written where `amibake bake --from-tune RUN` reads it
(results/tunes/RUN.json). amibake does not read fleet's database (fleet is built on amibake, not
the other way round): this file is the hand-over, plain data a person can read too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from amibake import saved
from fleet.tune_spec import TuneSpec


def path(results_dir: Path, run_id: str) -> Path:
    return results_dir / "tunes" / f"{run_id}.json"


def write(
    results_dir: Path,
    run_id: str,
    spec: TuneSpec,
    params: dict[str, Any],
    gains: list[str] | None = None,
) -> Path | None:
    """The recommendation's build (recipe, the type's family, the flags added to the family's)
    and how to run it; None for a replayed search, which has no build."""
    if spec.replay is not None or not spec.recipe:
        return None
    instance_type = spec.instance_type(params)
    record = {
        "run_id": run_id,
        "recipe": spec.recipe,
        "instance_type": instance_type,
        "family": instance_type.split(".")[0],
        "cflags": spec.space.cflags(params),
        "args": spec.space.args(params),
        "params": params,
        "gains": gains or [],
    }
    out = path(results_dir, run_id)
    text = json.dumps(record, indent=2) + "\n"
    if out.exists() and out.read_text() == text:
        # Unchanged: not rewritten, so that `bake --from-tune last` (the newest file) means
        # the newest recommendation, not the run last reported.
        return out
    saved.write_whole(out, text)  # bake reads it, maybe while a report rewrites it
    return out
