"""amibake's command line: argument parsing only; the work is done elsewhere.

``main(argv) -> int``: a user mistake prints one line (``amibake: error: ...``) and returns 2;
a failure in the cloud or on a host returns 1 with one line; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from amibake import config as config_module
from amibake.errors import AmibakeError, UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's own errors are user mistakes too: one line, exit 2, no usage dump.
        raise UserError(f"{message} (see `{self.prog} --help`)")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cloud", help="aws (default) or local: the embedded local cloud")
    parser.add_argument("--region", help="AWS region (default: from config, else us-east-1)")
    parser.add_argument("--profile", help="AWS profile name")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="amibake", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    local = commands.add_parser("local", help="the embedded local cloud (up, status, down)")
    local_commands = local.add_subparsers(dest="local_command", required=True, parser_class=_Parser)
    for name, text in (
        ("up", "start the local cloud (a background daemon) unless it is running"),
        ("status", "show the local cloud's endpoint, instances and images"),
        ("down", "stop the local cloud and remove every sandbox, mount and directory"),
    ):
        _common(local_commands.add_parser(name, help=text))
    interrupt = local_commands.add_parser(
        "interrupt", help="raise a spot interruption notice on an instance's IMDS"
    )
    interrupt.add_argument("instance_id")
    _common(interrupt)
    return parser


def _config(args: argparse.Namespace, **extra: Any) -> config_module.Config:
    flags = {"cloud": args.cloud, "region": args.region, "profile": args.profile, **extra}
    return config_module.load(flags)


def _print(args: argparse.Namespace, result: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(result, indent=2, default=str) if args.json else text(result))


def _local(args: argparse.Namespace) -> int:
    from amibake.local import control

    cfg = _config(args)
    if args.local_command == "up":
        daemon = control.up(cfg)
        _print(
            args,
            {"pid": daemon.pid, "endpoint": daemon.endpoint},
            lambda r: f"local cloud running at {r['endpoint']} (pid {r['pid']})",
        )
    elif args.local_command == "status":
        state = control.status(cfg)
        if state is None:
            _print(args, {"running": False}, lambda r: "local cloud is not running")
            return 3
        _print(args, state, _status_text)
    elif args.local_command == "down":
        done = control.down(cfg)
        _print(args, done, lambda r: "\n".join(r) if r else "local cloud was not running")
    elif args.local_command == "interrupt":
        notice = control.interrupt(cfg, args.instance_id)
        _print(
            args,
            notice,
            lambda r: f"{args.instance_id}: spot/instance-action {r['instance-action']}",
        )
    return 0


def _status_text(state: dict[str, Any]) -> str:
    lines = [f"local cloud running at {state['endpoint']} (pid {state['pid']})"]
    for instance_id, info in state["instances"].items():
        lines.append(f"  {instance_id}  ssh {info['address']}  imds {info['imds']}")
    lines.append(f"  images: {', '.join(state['images']) or 'none'}")
    return "\n".join(lines)


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {"local": _local}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return HANDLERS[args.command](args)
    except AmibakeError as exc:
        print(f"amibake: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("amibake: interrupted", file=sys.stderr)
        return 130


def main_entry() -> None:
    sys.exit(main())
