"""amibake: family-tuned builds on EC2 spot instances, baked into AMIs, run by AWS Batch.

The first line above is `amibake --help`'s description. This module is argument parsing only;
the work is done elsewhere.

``main(argv) -> int``: a user mistake prints one line (``amibake: error: ...``) and returns 2;
a failure in the cloud or on a host returns 1 with one line; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import botocore.exceptions

from amibake import checks, cliutil, logs
from amibake import config as config_module
from amibake.cliutil import Parser
from amibake.errors import AmibakeError, UserError

# EC2's ids: 8 hex digits (older) or 17.
AMI_ID = re.compile(r"ami-[0-9a-f]{8}([0-9a-f]{9})?")
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8}([0-9a-f]{9})?")
# The most memory any EC2 type has per vCPU is 32 GiB: a reserve above it leaves /shared nothing.
MAX_RESERVE_MB_PER_VCPU = 32768
# gc --older-than: amibake's tags expire in hours; ten years is a typo for something shorter.
MAX_AGE = timedelta(days=3653)


def count(low: int, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer flag within [low, high], refused on one line otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        problem = checks.integer(value, low, high, why)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


def common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cloud", help="aws (default) or local: the embedded local cloud")
    parser.add_argument("--region", help="AWS region (default: from config, else us-east-1)")
    parser.add_argument("--profile", help="AWS profile name")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def network_options(parser: argparse.ArgumentParser) -> None:
    """For commands that launch: the subnets to launch in (accounts without a default VPC)."""
    parser.add_argument(
        "--subnet",
        action="append",
        metavar="SUBNET_ID",
        help="launch in this subnet (repeat, or comma-separated; default: subnet_ids in "
        "amibake.toml, else the default VPC's)",
    )


def yes_option(parser: argparse.ArgumentParser) -> None:
    """For commands that launch instances: what they will spend is said first, and asked."""
    parser.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="proceed without asking (needed above $1 when no terminal can be asked)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="amibake", description=__doc__.splitlines()[0])
    cliutil.add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    local = commands.add_parser(
        "local", help="the embedded local cloud (up, status, down, interrupt)"
    )
    local_commands = local.add_subparsers(dest="local_command", required=True, parser_class=Parser)
    for name, text in (
        ("up", "start the local cloud (a background daemon) unless it is running"),
        ("status", "show the local cloud's endpoint, instances and images"),
        ("down", "stop the local cloud and remove every sandbox, mount and directory"),
    ):
        sub = local_commands.add_parser(name, help=text)
        common_options(sub)
        if name == "up":  # the local_faults settings, as flags: the README names them so
            sub.add_argument(
                "--faults",
                help="behave as AWS does: aws, none, aws,-NAME or NAME,NAME "
                "(default: the local_faults setting, none)",
            )
            sub.add_argument(
                "--faults-seed", type=int, help="the seed the behaviours draw from (default 0)"
            )
        if name == "down":
            sub.add_argument(
                "--force",
                action="store_true",
                help="stop it even while other commands use it (they fail midway)",
            )
    build = commands.add_parser("build", help="build a recipe with flags tuned for EC2 families")
    build.add_argument("--family", required=True, help="family or comma-separated families")
    build.add_argument("--recipe", help="recipe name (default from amibake.toml: kernels)")
    build.add_argument("--size", help="instance size (default large)")
    market = build.add_mutually_exclusive_group()
    market.add_argument(
        "--spot", dest="spot", action="store_true", default=None, help="spot (the default)"
    )
    market.add_argument("--on-demand", dest="spot", action="store_false", help="on-demand")
    build.add_argument(
        "--on-demand-fallback", action="store_true", help="use on-demand if spot has no capacity"
    )
    build.add_argument(
        "--keep-on-error",
        action="store_true",
        help="on failure, leave the instance up and print how to SSH in (amibake gc removes it)",
    )
    build.add_argument(
        "--dry-run", action="store_true", help="validate and show the plan and its estimate"
    )
    common_options(build)
    network_options(build)
    yes_option(build)

    bake = commands.add_parser("bake", help="bake the built artifacts into ECS-optimized AMIs")
    bake.add_argument("--family", help="families whose artifacts to bake (default: all built)")
    bake.add_argument("--name", default="amibake", help="image name prefix")
    bake.add_argument(
        "--tmpfs-reserve-mb-per-vcpu",
        type=count(0, MAX_RESERVE_MB_PER_VCPU, "no EC2 type has more memory per vCPU"),
        default=700,
        help="memory left outside /shared per vCPU (default 700); /shared gets the rest",
    )
    bake.add_argument("--base-ami", help="bake from this image instead of the AL2023 ECS one")
    bake.add_argument("--allow-eol", action="store_true", help="accept an Amazon Linux 2 base")
    bake.add_argument("--build", action="store_true", help="build the families missing first")
    bake.add_argument("--recipe", help="with --build: the recipe (default from config)")
    bake.add_argument(
        "--from-tune",
        metavar="RUN",
        help="bake the build a `fleet tune` run recommends (its recipe with its flags, for its "
        "type's family; built first if need be); RUN: a tune run id, or last",
    )
    bake.add_argument(
        "--keep-on-error",
        action="store_true",
        help="on failure, leave the instance up and print how to SSH in (amibake gc removes it)",
    )
    bake.add_argument(
        "--keep",
        type=count(1),
        metavar="N",
        help="after a successful bake, retire (deregister, with their snapshots) the older images "
        "of the same recipe and architecture beyond the newest N",
    )
    bake.add_argument("--dry-run", action="store_true", help="render, verify, show the plan")
    common_options(bake)
    network_options(bake)
    yes_option(bake)

    batch = commands.add_parser("batch", help="AWS Batch environments on the baked images")
    batch_commands = batch.add_subparsers(dest="batch_command", required=True, parser_class=Parser)
    batch_up = batch_commands.add_parser("up", help="create or update environments and queues")
    source_of_ami = batch_up.add_mutually_exclusive_group(required=True)
    source_of_ami.add_argument("--ami", help="a baked image id")
    source_of_ami.add_argument(
        "--from-bake",
        action="store_true",
        help="the newest baked image of each architecture; each family it leaves out is named",
    )
    batch_up.add_argument("--on-demand", action="store_true", help="EC2 instead of spot")
    common_options(batch_up)
    network_options(batch_up)
    for name, text in (
        ("down", "delete queues, then environments (safe to re-run)"),
        ("status", "what amibake has registered in Batch"),
    ):
        common_options(batch_commands.add_parser(name, help=text))

    families = commands.add_parser("families", help="known EC2 families, targets and flags")
    families.add_argument(
        "--compiler", default="gcc@11.4.1", help="e.g. gcc@12.2 (default AL2023's)"
    )
    families.add_argument(
        "--host",
        action="store_true",
        help="the families whose tuned build this machine runs (natively or under QEMU), best "
        "first: what the local cloud can smoke-test and benchmark",
    )
    families.add_argument(
        "--recipe",
        help="with --host: judge a family by this recipe's built artifact where one exists "
        "(default kernels), else by its target",
    )
    families.add_argument(
        "--first", action="store_true", help="with --host: print only the best family's name"
    )
    families.add_argument(
        "--architecture",
        choices=("x86_64", "arm64"),
        help="with --host: only families of this architecture (the other one's run under QEMU)",
    )
    common_options(families)

    policy = commands.add_parser("iam-policy", help="print the least-privilege IAM policy")
    policy.add_argument(
        "--for", dest="commands", help="build,bake,batch,fleet,ls,gc (default: all)"
    )

    ls = commands.add_parser(
        "ls", help="every resource amibake owns in the region: age, size, cost an hour or month"
    )
    common_options(ls)

    gc = commands.add_parser("gc", help="delete what amibake created that is still alive")
    gc.add_argument(
        "--dry-run",
        action="store_true",
        help="list what is alive, each marked delete or keep and why; delete nothing",
    )
    gc.add_argument("--older-than", help="only what is older than this, e.g. 2h or 30m")
    gc.add_argument("--run-id", help="only this run's resources")
    common_options(gc)

    source = commands.add_parser("source", help="the source cache")
    source_commands = source.add_subparsers(
        dest="source_command", required=True, parser_class=Parser
    )
    add = source_commands.add_parser("add", help="check a source archive's sha256 and cache it")
    add.add_argument("file", help="a source archive a recipe names by sha256")
    common_options(add)
    has = source_commands.add_parser("has", help="exit 0 if a recipe's source is in the cache")
    has.add_argument("recipe", help="recipe name")
    common_options(has)

    recipe = commands.add_parser("recipe", help="recipes for your own source trees")
    recipe_commands = recipe.add_subparsers(
        dest="recipe_command", required=True, parser_class=Parser
    )
    new = recipe_commands.add_parser(
        "new", help="write a recipe that builds a directory or a git commit with family flags"
    )
    new.add_argument("name", help="the recipe's name (a folder of the recipes directory)")
    new.add_argument(
        "--from",
        dest="origin",
        required=True,
        metavar="DIR|GIT_URL",
        help="a source directory (.gitignore respected) or a git URL (with --commit)",
    )
    new.add_argument("--commit", metavar="SHA", help="the full 40-hex commit of a git URL")
    new.add_argument(
        "--build",
        choices=("cmake", "make", "autotools", "custom"),
        help="the build system (default: told by CMakeLists.txt, configure(.ac), Makefile)",
    )
    new.add_argument(
        "--artifact",
        action="append",
        metavar="PATH",
        help="a file the build installs, under its prefix (repeat; default bin/NAME)",
    )
    common_options(new)

    interrupt = local_commands.add_parser(
        "interrupt", help="raise a spot interruption notice on an instance's IMDS"
    )
    interrupt.add_argument("instance_id", help="a local cloud instance, i-...")
    common_options(interrupt)

    cliutil.add_completion(commands, "amibake")
    cliutil.document(parser, EXAMPLES, cliutil.exit_codes_text(EXIT_CODES))
    cliutil.mark_completions(parser, "amibake")
    return parser


# What each subcommand's --help shows as its example(s): real commands, which the tests parse.
EXAMPLES = {
    "local": ["amibake local up --json"],
    "local up": ["amibake local up"],
    "local status": ["amibake local status --json"],
    "local down": ["amibake local down"],
    "local interrupt": ["amibake local interrupt i-0123456789abcdef0 --cloud local"],
    "build": [
        "amibake build --family c7i --recipe kernels",
        "amibake build --family c7i,c7g --on-demand-fallback --dry-run",
    ],
    "bake": [
        "amibake bake --family c7i,c7g",
        "amibake bake --build --family c7i --dry-run",
        "amibake bake --family c7i --keep 2",
        "amibake bake --from-tune last",
    ],
    "batch": ["amibake batch up --from-bake"],
    "batch up": ["amibake batch up --from-bake", "amibake batch up --ami ami-0123456789abcdef0"],
    "batch down": ["amibake batch down"],
    "batch status": ["amibake batch status --json"],
    "families": ["amibake families --compiler gcc@12.2", "amibake families --host --first"],
    "iam-policy": ["amibake iam-policy --for build,gc"],
    "ls": ["amibake ls", "amibake ls --json"],
    "gc": ["amibake gc --dry-run", "amibake gc --older-than 2h"],
    "source": ["amibake source add ~/Downloads/zstd-1.5.4.tar.gz"],
    "source add": ["amibake source add ~/Downloads/zstd-1.5.4.tar.gz"],
    "source has": ["amibake source has zstd"],
    "recipe": ["amibake recipe new mysim --from ~/src/mysim"],
    "recipe new": [
        "amibake recipe new mysim --from ~/src/mysim",
        "amibake recipe new mysim --from https://github.com/you/mysim.git "
        "--commit 0123456789abcdef0123456789abcdef01234567 --build cmake --artifact bin/sim",
    ],
    "completion": [
        "amibake completion bash > ~/.local/share/bash-completion/completions/amibake",
        "amibake completion zsh > ~/.zfunc/_amibake",
    ],
}
# amibake's own exit code beside the shared ones (cliutil.EXIT_CODES).
EXIT_CODES = ((3, "`amibake local status`: the local cloud is not running"),)


def config_from(args: argparse.Namespace, **extra: Any) -> config_module.Config:
    flags = {"cloud": args.cloud, "region": args.region, "profile": args.profile, **extra}
    if getattr(args, "subnet", None):
        flags.setdefault("subnet_ids", ",".join(args.subnet))
    return config_module.load(flags)


def print_result(args: argparse.Namespace, result: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(result, indent=2, default=str) if args.json else text(result))


def _local(args: argparse.Namespace) -> int:
    from amibake.local import control

    if args.local_command == "interrupt" and not INSTANCE_ID.fullmatch(args.instance_id):
        raise UserError(
            f"{args.instance_id!r} is not an instance id (i- and 8 or 17 hex digits; "
            "`amibake local status` lists them)"
        )
    settings = {"local_faults": getattr(args, "faults", None)}
    settings["local_faults_seed"] = getattr(args, "faults_seed", None)
    cfg = config_from(args, **settings)
    if args.local_command == "up":
        daemon = control.up(cfg)
        print_result(
            args,
            {"pid": daemon.pid, "endpoint": daemon.endpoint},
            lambda r: f"local cloud running at {r['endpoint']} (pid {r['pid']})",
        )
    elif args.local_command == "status":
        state = control.status(cfg)
        if state is None:
            print_result(args, {"running": False}, lambda r: "local cloud is not running")
            return 3
        print_result(args, state, _status_text)
    elif args.local_command == "down":
        _refuse_while_in_use(cfg, args.force)
        done = control.down(cfg)
        print_result(args, done, lambda r: "\n".join(r) if r else "local cloud was not running")
    elif args.local_command == "interrupt":
        notice = control.interrupt(cfg, args.instance_id)
        print_result(
            args,
            notice,
            lambda r: f"{args.instance_id}: spot/instance-action {r['instance-action']}",
        )
    return 0


def _refuse_while_in_use(cfg: config_module.Config, force: bool) -> None:
    """Stopping the cloud under a run fails it midway (its instances vanish, its cleanup finds
    nothing to call): a process still using it is named, and only --force stops it anyway."""
    from amibake.local import control

    users = [] if force else control.holders(cfg)
    if not users:
        return
    named = ", ".join(f"{command} (pid {pid})" for command, pid in users[:3])
    more = f" and {len(users) - 3} more" if len(users) > 3 else ""
    many = len(users) > 1
    raise UserError(
        f"{len(users)} process{'es' if many else ''} still use{'' if many else 's'} the local "
        f"cloud: {named}{more}; let {'them' if many else 'it'} finish or stop "
        f"{'them' if many else 'it'} (Ctrl-C, fleet kill), or `amibake local down --force`"
    )


def _status_text(state: dict[str, Any]) -> str:
    lines = [f"local cloud running at {state['endpoint']} (pid {state['pid']})"]
    for instance_id, info in state["instances"].items():
        line = f"  {instance_id}  ssh {info['address']}  imds {info['imds']}"
        if info.get("shutdown_at"):  # its guest's scheduled power-off (a deadline's)
            line += "  powers off " + time.strftime(
                "%H:%M:%S UTC", time.gmtime(info["shutdown_at"])
            )
        lines.append(line)
    lines.append(f"  images: {', '.join(state['images']) or 'none'}")
    return "\n".join(lines)


def _family_list(text: str) -> list[str]:
    """--family c7i,c7g,c7a: names, blanks dropped (an empty list is refused downstream)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _build(args: argparse.Namespace) -> int:
    from amibake import cost, pipelines
    from amibake.connect import connect

    cfg = config_from(args, recipe=args.recipe, size=args.size, spot=args.spot)
    if args.on_demand_fallback and not cfg.spot:  # it falls back from spot, which is not asked
        said = "--on-demand" if args.spot is False else "spot = false in the settings"
        raise UserError(f"--on-demand-fallback is for spot builds, and {said} asks on-demand: "
                        "drop one of them")  # fmt: skip
    request = pipelines.BuildRequest(
        families=cliutil.names(args.family),
        recipe=cfg.recipe,
        size=cfg.size,
        spot=cfg.spot,
        on_demand_fallback=args.on_demand_fallback,
        keep_on_error=args.keep_on_error,
        dry_run=args.dry_run,
        recipes_dir=cfg.recipes_dir,
    )
    states = pipelines.prepare(request, cfg.results_dir)  # bad input fails before any cloud call
    cloud = connect(cfg)
    pipelines.preflight_all(cloud, states)  # ... or here, before anything is created
    estimate = cost.build_estimate(states, cfg.results_dir, cfg.region)
    if not args.dry_run:
        cost.approve(estimate, f"amibake: {estimate.text()}", yes=args.yes)
    logs.to_terminal()
    outcomes = pipelines.build(cloud, request, states=states)
    summaries = [o.summary() for o in outcomes]
    if args.dry_run:
        for summary in summaries:  # each family's share; the text shows the whole
            summary["estimate"] = estimate.to_json()
    print_result(
        args,
        summaries,
        lambda s: _build_text(s) + (f"\n{estimate.text()}" if args.dry_run else ""),
    )
    return 0 if all(o.ok for o in outcomes) else 1


def _build_text(summaries: list[dict[str, Any]]) -> str:
    lines = []
    for s in summaries:
        if "build_script" in s:
            lines.append(f"{s['family']}: plan {' -> '.join(s['plan'])}")
            lines.append(f"  base AMI {s['base_ami']}, types {', '.join(s['instance_types'])}")
            lines.append(f"  {s['compiler']} flags: {s['flags']}")
            lines.append(f"  packages (dnf, before the build): {' '.join(s['packages'])}")
            lines.append(
                "  build script:\n    " + s["build_script"].rstrip().replace("\n", "\n    ")
            )
        elif s["ok"]:
            how = (
                "cache hit" if s["cache_hit"] else f"built on {s['instance_type']} ({s['market']})"
            )
            lines.append(f"{s['family']}: {s['artifact']} ({how}); smoke: {s['smoke']}")
        else:
            lines.append(f"{s['family']}: FAILED: {s['error']}")
    return "\n".join(lines)


def _bake(args: argparse.Namespace) -> int:
    from amibake import pipelines
    from amibake.connect import connect

    if args.recipe is not None and not args.build:
        raise UserError("--recipe goes with --build: amibake bake --build --recipe NAME")
    if args.from_tune and (args.family or args.build or args.base_ami):
        raise UserError(
            "--from-tune RUN bakes that run's recommended build for its type's family: leave "
            "out --family, --build and --base-ami"
        )
    cfg = config_from(args)
    request = pipelines.BakeRequest(
        build_recipe=(args.recipe or cfg.recipe) if args.build else None,
        families=cliutil.names(args.family) if args.family else None,
        name=args.name,
        reserve_mb_per_vcpu=args.tmpfs_reserve_mb_per_vcpu,
        base_ami=args.base_ami,
        allow_eol=args.allow_eol,
        keep_on_error=args.keep_on_error,
        dry_run=args.dry_run,
    )
    tuned: dict[str, Any] = {}
    if args.from_tune:
        from amibake import bake as bake_module
        from amibake.steps.state import Variant

        tuned = bake_module.from_tune(cfg.results_dir, args.from_tune)
        request = replace(
            request,
            build_recipe=tuned["recipe"],
            families=[tuned["family"]],
            variant=Variant.of_flags(tuned["cflags"]),
            tuned_by=tuned["run_id"],
        )
    pipelines.check_bake(request)  # before connecting: a flag's mistake is not a cloud's
    if request.build_recipe is not None:
        from amibake import recipes

        recipes.load(request.build_recipe, cfg.recipes_dir)
    cloud = connect(cfg)
    if request.build_recipe is not None:
        estimate = _bake_estimate(args, cfg, request, None)  # before the builds spend
        logs.to_terminal()
        planned = pipelines.build_missing(cloud, request)
        if request.dry_run and planned:
            # The bake's own plan needs the artifacts these builds would make: say both.
            plans = [o.summary() for o in planned]
            print_result(
                args,
                plans,
                lambda s: (
                    _build_text(s)
                    + "\nthen: bake these artifacts into one image per architecture, boot-tested"
                    + f"\n{estimate.text()}"
                ),
            )
            return 0
    states = pipelines.prepare_bake(cloud, request)  # bad input fails here, creating nothing
    if request.build_recipe is None:
        estimate = _bake_estimate(args, cfg, request, states)
    logs.to_terminal()
    outcomes = pipelines.bake(cloud, request, states=states)
    summaries = [o.summary() for o in outcomes]
    if args.keep is not None and not args.dry_run:
        from amibake import bake as bake_module

        amis_file = cfg.results_dir / "amis.json"
        launched = _batch_images(cloud) if any(s["ok"] for s in summaries) else {}
        for summary in summaries:
            if summary["ok"] and launched is not None:
                summary["retired"] = bake_module.retire_older(
                    cloud, amis_file, summary["image_id"], args.keep, launched
                )

    def text(rows: list[dict[str, Any]]) -> str:
        lines = []
        if tuned:
            lines.append(
                f"from tune run {tuned['run_id']}: {tuned['recipe']} for {tuned['family']} "
                f"with {tuned['cflags'] or 'its own flags'}"
                + (f"; run it with {tuned['args']}" if tuned["args"] else "")
            )
        for r in rows:
            if "plan" in r:
                lines.append(f"{r['family']}: plan {' -> '.join(r['plan'])}")
                lines += [f"  {path}" for path in r["files"]]
            elif r["ok"]:
                lines.append(
                    f"{r['architecture']}: {r['image_id']} from {r['base_ami']} "
                    f"({', '.join(r['artifacts'])}); boot test passed"
                )
                lines += [
                    f"  retired {old['image_id']} (baked {old['baked'] or '?'}) and its "
                    f"snapshots {', '.join(old['snapshots']) or '(none left)'}: older than the "
                    f"newest {args.keep} of {', '.join(old['apps'])} on {old['architecture']}"
                    for old in r.get("retired", [])
                ]
            else:
                lines.append(f"{r.get('architecture', r['family'])}: FAILED: {r['error']}")
        return "\n".join(lines)

    if args.dry_run:
        for summary in summaries:
            summary["estimate"] = estimate.to_json()
    print_result(
        args, summaries, lambda r: text(r) + (f"\n{estimate.text()}" if args.dry_run else "")
    )
    return 0 if all(o.ok for o in outcomes) else 1


def _bake_estimate(
    args: argparse.Namespace, cfg: config_module.Config, request: Any, states: Any
) -> Any:
    """What a bake will launch and spend, said (and asked) before it does: with --build, the
    builds of the families not built yet and a bake per architecture of the families asked;
    else a bake per prepared architecture."""
    from amibake import catalog, cost

    if states is not None:
        bakes = [(s.architecture, s.family.instance_type(s.size), s.spot) for s in states]
        estimate = cost.bake_estimate(bakes, cfg.results_dir, cfg.region)
    else:
        families = [catalog.family(f) for f in request.families or []]
        first = {f.architecture: f for f in reversed(families)}
        bakes = [(a, f.instance_type("large"), True) for a, f in sorted(first.items())]
        estimate = cost.bake_estimate(bakes, cfg.results_dir, cfg.region)
        artifacts = cfg.results_dir / "artifacts"
        missing = [
            f
            for f in families
            if not (artifacts / f"{request.build_recipe}_{f.name}.manifest.json").exists()
        ]
        each, basis = cost.build_seconds(cfg.results_dir, request.build_recipe)
        table = cost.price_table(cfg.results_dir, cfg.region)
        estimate.lines[:0] = [
            cost.Line(
                f"build {f.name}",
                f.instance_type("large"),
                1,
                each / 3600,
                cost.hourly(table, f.instance_type("large"), True),
            )
            for f in missing
        ]
        estimate.runs = f"{len(missing)} builds, then {estimate.runs}"
        estimate.basis.append(basis)
    if not args.dry_run:
        cost.approve(estimate, f"amibake: {estimate.text()}", yes=args.yes)
    return estimate


def _batch(args: argparse.Namespace) -> int:
    from amibake import batch
    from amibake.connect import connect

    if args.batch_command == "up" and args.ami is not None and not AMI_ID.fullmatch(args.ami):
        raise UserError(f"--ami {args.ami!r} is not an image id (ami- and 8 or 17 hex digits)")
    cfg = config_from(args)
    amis_file = cfg.results_dir / "amis.json"
    cloud = connect(cfg)
    if args.batch_command == "up":
        skipped: dict[str, str] = {}
        if args.from_bake:
            chosen = batch.from_bake(amis_file, cloud)
            if not chosen.images:
                raise UserError(
                    f"no image in {amis_file} to register here: "
                    + "; ".join(f"{f}: {why}" for f, why in chosen.skipped.items())
                )
            batch.check_alive(cloud, chosen.images, amis_file)  # before anything is made
            images, skipped = chosen.images, chosen.skipped
        else:
            images = [batch.image_by_id(cloud, args.ami, amis_file)]
        logs.to_terminal()
        try:
            result = batch.up(cloud, images, spot=not args.on_demand)
        except KeyboardInterrupt:
            from amibake.runner import Interrupted

            # What `batch up` makes is meant to last, and it converges: what it had registered
            # stays, said so (exit 130 promises cleanup; unsaid, it looked like a leak).
            raise Interrupted(
                "interrupted: what batch up had registered stays (environments, queues, job "
                "definitions, the job bucket and the hosts' security group): `amibake batch up` "
                "again completes it, `amibake batch down` removes it"
            ) from None
        if args.from_bake:
            result["skipped"] = skipped
        print_result(args, result, batch.up_text)
    elif args.batch_command == "down":
        done = batch.down(cloud)
        print_result(args, done, lambda r: "\n".join(r) or "nothing registered")
    else:
        print_result(args, batch.status(cloud), batch.status_text)
    return 0


def _iam_policy(args: argparse.Namespace) -> int:
    from amibake import iam_policy

    chosen = None if args.commands is None else _family_list(args.commands)
    if chosen == []:  # not "all": a policy for nothing was asked, by mistake
        raise UserError("--for needs at least one command, e.g. --for build,gc")
    print(iam_policy.render(chosen))
    return 0


def _families(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from amibake import catalog, flags

    compiler = flags.Compiler.parse(args.compiler)
    if args.host:
        return _host_families(args)
    if args.first or args.architecture or args.recipe:
        given = "--first" if args.first else "--architecture" if args.architecture else "--recipe"
        raise UserError(f"{given} goes with --host: amibake families --host {given} ...")
    rows = []
    for family in catalog.families().values():
        result = flags.for_family(family, compiler)
        rows.append(
            {
                "family": family.name,
                "arch": family.architecture,
                "generations": ", ".join(family.generations),
                "target": result.target,
                "flags": result.cflags
                + (f"  (fallback: {result.used})" if result.fell_back else ""),
            }
        )
    print_result(args, rows, lambda r: tabulate(r, headers="keys"))
    return 0


def _host_families(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from amibake import cpu, flags, recipes
    from amibake.steps.preflight import MANIFEST_FORMAT

    cfg = config_from(args)
    recipe = args.recipe or "kernels"
    if args.recipe is not None:  # a recipe that is not there was judged by its targets, unsaid
        recipes.load(recipe, cfg.recipes_dir)
    machine = cpu.this_machine()
    artifacts = cfg.results_dir / "artifacts"
    built: dict[str, set[str]] = {}
    for sidecar in artifacts.glob(f"{recipe}_*.manifest.json"):
        try:
            manifest = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            continue
        if manifest.get("format") == MANIFEST_FORMAT and not manifest.get("variant"):
            built[str(manifest.get("family"))] = set(manifest.get("isa_features", []))
    choices = cpu.families_for(machine, built)
    if args.architecture:
        choices = [c for c in choices if c.family.architecture == args.architecture]
    runs = [c for c in choices if c.verdict.runs]
    if args.first:
        best = cpu.best_family(machine, built, args.architecture)
        if best is None:
            of = f"{args.architecture} " if args.architecture else ""
            raise UserError(f"this machine runs no {of}family's {recipe} build: {_why(choices)}")
        print(best)
        return 0
    rows = [
        {
            "family": c.family.name,
            "arch": c.family.architecture,
            "target": flags.family_target(c.family).name,
            "runs": c.verdict.how,
            "judged by": "its build" if c.basis == "built" else "its target",
            "why not native": c.verdict.reason,
        }
        for c in runs
    ]
    native = [c.family.name for c in runs if c.verdict.how == "native"]
    emulated = [c.family.name for c in runs if c.verdict.how == "emulated"]

    def text(rows: list[dict[str, Any]]) -> str:
        qemu = ", ".join(sorted(machine.emulators)) or "none (apt-get install qemu-user-static)"
        return "\n".join(
            [
                f"this machine: {machine.model or '?'} ({machine.microarchitecture}, "
                f"{machine.architecture}); QEMU for: {qemu}",
                tabulate(rows, headers="keys") if rows else "no family's build runs here",
                f"the local cloud smoke-tests {len(runs)} families: natively "
                f"{', '.join(native) or 'none'}; under QEMU {', '.join(emulated) or 'none'}",
                f"it benchmarks natively: {', '.join(native) or 'none'} (emulated runs are "
                "measured but never ranked against native ones)",
                f"cannot run here: {_why(choices)}",
            ]
        )

    print_result(args, rows, text)
    return 0


def _why(choices: list[Any]) -> str:
    cannot = [f"{c.family.name} ({c.verdict.reason})" for c in choices if not c.verdict.runs]
    return "; ".join(cannot) or "none"


def _duration(text: str) -> timedelta:
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if not match:
        raise UserError(f"--older-than {text!r}: use a number and a unit, e.g. 30m, 2h, 1d")
    unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
    number = int(match.group(1))
    if number > MAX_AGE / timedelta(**{unit: 1}):
        raise UserError(
            f"--older-than {text}: more than ten years; amibake's resources expire in hours"
        )
    return timedelta(**{unit: number})


def _ls(args: argparse.Namespace) -> int:
    from amibake import inventory
    from amibake.connect import connect
    from amibake.journal import Journal

    cfg = config_from(args)
    cloud = connect(cfg)
    found = inventory.discover(cloud, Journal(cfg.results_dir / "journal.sqlite"), everything=True)
    result = {
        "region": cfg.region,
        "resources": [r.as_json() for r in found],
        "total": inventory.totals(found),
        "basis": inventory.basis(cfg.region),
    }
    print_result(args, result, lambda _: inventory.table(found, cfg.region))
    return 0


def _gc(args: argparse.Namespace) -> int:
    from amibake import gc, inventory
    from amibake.connect import connect
    from amibake.journal import Journal

    older = _duration(args.older_than) if args.older_than else None
    if args.run_id is not None:
        _check_run_id(args.run_id)
    cfg = config_from(args)
    logs.to_terminal()
    cloud = connect(cfg)
    journal = Journal(cfg.results_dir / "journal.sqlite")
    if not args.dry_run:
        journal.close_dead_runs()  # a SIGKILLed run says so, and what it left is found below
    if args.dry_run:  # what is alive, as amibake ls finds it, each marked delete or keep
        alive = inventory.discover(
            cloud, journal, run_id=args.run_id, older_than=older, everything=True
        )
        leftovers = [x for x in alive if not x.kept]
        deleted: list[Any] = []
        failures: list[str] = []
    else:  # what is kept is said only where a run still runs (it may be thought left)
        alive = [
            x
            for x in inventory.discover(cloud, journal, run_id=args.run_id, older_than=older)
            if not x.kept or x.running
        ]
        leftovers = [x for x in alive if not x.kept]
        deleted, failures = gc.delete(cloud, journal, leftovers)
        for run_id in {x.run_id for x in leftovers if x.run_id}:
            journal.cleaned_up(run_id)
    elsewhere = gc.other_regions(cloud, journal, args.run_id)
    result = {
        "dry_run": args.dry_run,
        "region": cfg.region,
        "found": [x.describe() for x in leftovers],
        "deleted": [x.describe() for x in deleted],
        "kept": [{"resource": x.describe(), "why": x.kept} for x in alive if x.kept],
        "failures": failures,
        "other_regions": elsewhere,
    }
    verb = "would delete" if args.dry_run else "deleted"

    def text(r: dict[str, Any]) -> str:
        lines = [f"{verb} {line}" for line in r["found" if args.dry_run else "deleted"]]
        lines += [f"keep {k['resource']}: {k['why']}" for k in r["kept"]]
        if not r["found"]:
            lines.append(f"nothing to clean up in {r['region']}")
        return "\n".join(lines + r["failures"])

    print_result(args, result, text)
    for region in elsewhere:  # a run elsewhere may have left something: say where to look
        print(
            f"amibake gc: the journal lists resources in {region} not known to be deleted, and "
            f"this looked in {cfg.region} only: run amibake gc --region {region}",
            file=sys.stderr,
        )
    return 1 if failures else 0


def _batch_images(cloud: Any) -> dict[str, str] | None:
    """The images Batch launches from, for bake --keep; None (nothing is retired, said why)
    when this identity may not read them: the bake, paid for, is not failed for it."""
    import botocore.exceptions

    from amibake import batch
    from amibake.cloud.calls import error_code
    from amibake.inventory import DENIED

    try:
        return batch.images_launched(cloud)
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) not in DENIED:
            raise
        print(
            "amibake bake: --keep retired nothing: this identity may not read which images "
            "Batch launches from (batch:DescribeComputeEnvironments: amibake iam-policy --for "
            "bake)",
            file=sys.stderr,
        )
        return None


def _check_run_id(run_id: str) -> None:
    """gc --run-id takes an amibake run's id. A fleet run's resources carry the ids of the
    amibake runs inside it, so a fleet id (or a typo) found nothing and said all was clean."""
    if re.fullmatch(r"f[bt]-[0-9a-f]+", run_id):
        raise UserError(
            f"--run-id {run_id} is a fleet run; its resources carry its amibake runs' ids: "
            f"fleet kill {run_id} removes what it left"
        )
    if not re.fullmatch(r"ab-[0-9a-f]{12}", run_id):
        raise UserError(
            f"--run-id {run_id!r} is not an amibake run id (ab- and 12 hex digits, as the "
            "run's log lines and amibake gc --dry-run show)"
        )


def _source(args: argparse.Namespace) -> int:
    from pathlib import Path

    from amibake import sources

    if args.source_command == "has":
        from amibake import recipes as recipes_module

        cfg = config_from(args)
        found = sources.resolve(recipes_module.load(args.recipe, cfg.recipes_dir), cfg.results_dir)
        print_result(
            args,
            {"sha256": found.sha256, "path": str(found.path)},
            lambda r: f"{args.recipe}: {r['path']}",
        )
        return 0
    source, recipes = sources.add(Path(args.file))
    print_result(
        args,
        {"sha256": source.sha256, "path": str(source.path), "recipes": recipes},
        lambda r: f"cached {args.file} ({r['sha256'][:16]}...) for {', '.join(r['recipes'])}",
    )
    return 0


def _recipe(args: argparse.Namespace) -> int:
    from amibake import new_recipe

    cfg = config_from(args)
    written = new_recipe.write(
        args.name,
        args.origin,
        root=cfg.recipes_dir,
        commit=args.commit,
        build=args.build,
        artifacts=args.artifact,
        results_dir=cfg.results_dir,
    )
    print_result(
        args,
        {
            "recipe": written.name,
            "path": str(written.directory),
            "build": written.build,
            "source": written.source,
            "files": written.files,
            "packages": written.packages,
        },
        lambda r: (
            f"wrote {r['path']}: {r['source']} ({r['files']} files), built with {r['build']}; "
            f"next: amibake build --family FAMILY --recipe {r['recipe']}"
        ),
    )
    return 0


def _completion(args: argparse.Namespace) -> int:
    cfg = config_module.load()  # the recipes completed are those of the configured folder
    print(cliutil.completion_script(build_parser(), "amibake", args.shell, cfg.recipes_dir))
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "local": _local,
    "build": _build,
    "bake": _bake,
    "batch": _batch,
    "families": _families,
    "ls": _ls,
    "gc": _gc,
    "iam-policy": _iam_policy,
    "source": _source,
    "recipe": _recipe,
    "completion": _completion,
}


def main(argv: Sequence[str] | None = None) -> int:
    def handle() -> int:
        args = build_parser().parse_args(argv)
        return HANDLERS[args.command](args)

    return guarded("amibake", handle)


def guarded(prog: str, handle: Callable[[], int]) -> int:
    """Run a command; a user mistake or a cloud refusal is one line on stderr, never a
    traceback, with the exit code of its kind (2: fix the input, 1: the cloud said no)."""
    from amibake.runner import terminate_as_interrupt

    try:
        # SIGTERM (`kill`, `fleet kill`, a CI timeout) unwinds a run like Ctrl-C does.
        with terminate_as_interrupt():
            return handle()
    except AmibakeError as exc:
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except botocore.exceptions.NoCredentialsError:  # credentials gone since connect
        from amibake.cloud.session import NO_CREDENTIALS

        print(f"{prog}: error: {NO_CREDENTIALS}", file=sys.stderr)
        return 2
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        # AccessDenied and friends: the message names the action and the principal.
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    # Messages can carry a library's text (pandas' parser error ends in a newline, a remote
    # command's output has several): the error stays one line, its lines joined.
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def main_entry() -> None:
    sys.exit(main())
