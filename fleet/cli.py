"""fleet's command line. Its commands (bench, tune, prices, plan, report) are not built yet."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    print(
        f"fleet: error: {command or 'no command'}: fleet bench/tune/prices/plan/report are not "
        "implemented yet (see the open issues)",
        file=sys.stderr,
    )
    return 2


def main_entry() -> None:
    sys.exit(main())
