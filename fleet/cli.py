"""fleet's command line. `fleet prices` works; bench, tune, plan, report and kill are not built
yet and say so."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

NOT_YET = ("bench", "tune", "plan", "report", "status", "kill")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SystemExit(_fail(f"{message} (see `{self.prog} --help`)"))


def _fail(message: str) -> int:
    print(f"fleet: error: {message}", file=sys.stderr)
    return 2


def _prices(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from fleet import prices

    snapshot = prices.snapshot()
    if args.type:
        try:
            chosen = [prices.lookup(t) for t in args.type]
        except prices.PriceError as exc:
            return _fail(str(exc))
    else:
        chosen = [prices.lookup(t) for t in snapshot["prices"]]
    if args.family:
        chosen = [p for p in chosen if p.instance_type.split(".")[0] in args.family.split(",")]
        if not chosen:
            return _fail(f"no instance type of family {args.family} in the snapshot")
    rows: list[dict[str, Any]] = [
        {
            "type": p.instance_type,
            "vcpus": int(p.vcpus),
            "memory_gib": p.memory_gib,
            "on_demand": p.on_demand,
            "spot_min": min(p.spot.values()),
            "spot_median": round(p.spot_median, 4),
            "spot_by_zone": p.spot,
        }
        for p in chosen
    ]
    if args.json:
        print(
            json.dumps(
                {
                    "date": snapshot["date"],
                    "source": snapshot["source"],
                    "region": snapshot["region"],
                    "prices": rows,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"EC2 Linux prices, {snapshot['region']}, USD/hour, snapshot of {snapshot['date']} "
        f"({snapshot['source']}); spot prices move hourly"
    )
    print(
        tabulate(
            [{k: v for k, v in r.items() if k != "spot_by_zone"} for r in rows],
            headers="keys",
            floatfmt=".4f",
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="fleet", description="rank EC2 instance types by cost per unit of work")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    price = commands.add_parser("prices", help="the price table in use (on-demand, spot per AZ)")
    price.add_argument("--type", nargs="+", help="instance types, e.g. c7i.large")
    price.add_argument("--family", help="families, e.g. c7i,c7g")
    price.add_argument("--json", action="store_true")
    for name in NOT_YET:
        commands.add_parser(name, help="not built yet")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command in NOT_YET:
        return _fail(f"`fleet {args.command}` is not built yet (see the open issues)")
    return _prices(args)


def main_entry() -> None:
    sys.exit(main())
