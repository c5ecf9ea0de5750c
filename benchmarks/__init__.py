"""`make bench`: performance figures, measured side by side in one run, reported as ratios."""

from amibake import cpu


def host_family() -> str:
    """This machine's best family, asked at run time (the CPU changes between sessions)."""
    family = cpu.best_family(cpu.this_machine())
    if family is None:
        raise RuntimeError("no family's build runs on this machine: amibake families --host")
    return family
