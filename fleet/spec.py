"""What `fleet bench` runs: a bench file (TOML) with command-line overrides, checked whole before
anything is launched. Errors name the file and the line of the key at fault.

    types = ["c5a.large", "c6a.xlarge"]      # and/or families = ["c7g"] with sizes = [...]
    recipe = "kernels"                       # or command = "my-app {args}"
    image = "ACCOUNT.dkr.ecr.REGION.amazonaws.com/app:tag"  # command run in this image
    gpus = 1                                 # GPUs the image's container gets (GPU types)
    builds = ["tuned", "generic"]            # recipe builds: the family's flags, or baseline
    replicates = 3
    warmups = 1
    args = "--size 2"                        # or a table: [args] threads = 2 -> --threads 2
    executor = "ssh"                         # or "batch": jobs on `amibake batch up`
    spot = true
    concurrency = 2
    expected_runtime = "5m"                  # one replicate, for the estimate before launching
    max_cost = 5.0                           # USD: no new work once it would spend more
    unit = "frames"                          # one unit of work, for costs: "$0.12 per 1M frames"
    [metric]                                 # default: the recipe's bench metric, or runtime
    kind = "regex"                           # runtime | regex | file ($FLEET_METRIC_FILE)
    pattern = "throughput=([0-9.]+)"
    meaning = "rate"                         # rate: work per second; seconds: per unit of work
    aggregate = "geomean"                    # several matches: geomean | sum | mean | last
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from amibake import catalog, checks, cost, instance_kinds, recipes, tomlfile
from amibake.errors import UserError, did_you_mean
from fleet.container import ImageRef

BUILDS = ("tuned", "generic")
# A plain command's (or an image's) one build: nothing is built, nothing is tuned, and a report
# that said "c5.large tuned" for it told the user flags had been chosen.
PLAIN = "plain"
EXECUTORS = ("ssh", "batch")
METRIC_KINDS = ("runtime", "regex", "file")
MEANINGS = ("rate", "seconds")
AGGREGATES = ("geomean", "sum", "mean", "last")
KNOWN_KEYS = {
    "name",
    "types",
    "families",
    "sizes",
    "recipe",
    "command",
    "builds",
    "replicates",
    "warmups",
    "args",
    "metric",
    "executor",
    "spot",
    "concurrency",
    "timeout_s",
    "allow_missing_price",
    "monitor",
    "expected_runtime",
    "max_cost",
    "unit",
    "image",
    "gpus",
}
# The counts a run may ask for, and why no more: past them a number is a typo, and recorded it
# made a run nobody could read back (`fleet status` planned 99999999999999 replicates).
COUNTS = {
    "replicates": (
        1,
        1000,
        "a median's interval narrows as 1/sqrt(n), and past 1000 runs of a type it no longer moves",
    ),
    "warmups": (0, 100, "a machine is warm after a few runs; more only costs"),
    "concurrency": (1, 256, "each type measured at once is an instance and a thread here"),
    "gpus": (0, 16, "no EC2 type has more than 16 GPUs"),
}
MAX_TIMEOUT_S = 7 * 86400.0  # a replicate still running after a week is stuck
# The flag that gives a key on the command line, where it is not --KEY.
EXAMPLE = {"recipe": "kernels", "command": "my-app {args}"}
FLAGS = {"command": "--command", "metric": "--metric-regex", "spot": "--on-demand"}
# The most a cap may be: past it a number is a typo (and 1e400 is inf).
MAX_COST_USD = 1e6


# Seconds in each time a metric's unit may name: a seconds metric in ms, or a rate per minute,
# was costed as if in seconds (1000 and 60 times off, nothing said).
TIME_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0,
    "seconds": 1.0, "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0,
    "hours": 3600.0,
}  # fmt: skip


def seconds_in(unit: str, meaning: str) -> float | None:
    """Seconds in the time a metric's unit is in; None where it names none. A seconds metric's
    unit begins with its time ("ms", "ns/op", "seconds per run"); a rate's ends with what it is
    per ("frames/min"; one without a "/" is per second, as "iterations")."""
    if meaning == "seconds":
        return TIME_UNITS.get(re.split(r"[/\s]", unit.strip())[0])
    if "/" not in unit:
        return 1.0
    return TIME_UNITS.get(unit.rsplit("/", 1)[1].strip())


@dataclass(frozen=True)
class Metric:
    kind: str = "runtime"
    pattern: str = ""
    meaning: str = "seconds"  # runtime is always seconds per run (one run = one unit of work)
    aggregate: str = "last"
    unit: str = "s"

    @property
    def higher_is_better(self) -> bool:
        return self.meaning == "rate"

    def seconds_per_unit(self, value: float) -> float:
        """A rate at or below 0 (a replicate that did no work, an interval's bound reaching 0)
        takes for ever per unit."""
        seconds = seconds_in(self.unit, self.meaning) or 1.0  # metric_from refused none
        if self.meaning == "seconds":
            return value * seconds
        return seconds / value if value > 0 else math.inf

    def parse(self, output: str, seconds: float, metric_file: str) -> float:
        """The replicate's value; a ValueError says why there is none."""
        if self.kind == "runtime":
            return seconds
        if self.kind == "file":
            words = metric_file.split()
            if not words or not _is_number(words[0]):  # inf or nan failed every report after
                raise ValueError(
                    f"the workload wrote no finite number to $FLEET_METRIC_FILE (got "
                    f"{metric_file!r})"
                )
            return float(words[0])
        values = [float(m) for m in re.findall(self.pattern, output) if _is_number(m)]
        if not values:
            raise ValueError(f"metric pattern {self.pattern!r} never matched the output")
        return aggregate(values, self.aggregate)


FOLDS = {"geomean": "geomean", "sum": "sum", "mean": "mean"}  # aggregate -> how it is said


def metric_label(metric: Metric) -> str:
    """The metric with its unit, as a label says it; one folded from several matches of the
    pattern (the kernels' four rates, each in its own unit, into one geomean) says so."""
    fold = FOLDS.get(metric.aggregate) if metric.kind == "regex" else None
    if fold is None:
        return metric.unit
    return f"{metric.unit} ({fold} of every match of {metric.pattern}, one number from several)"


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def aggregate(values: list[float], how: str) -> float:
    if how == "last":
        return values[-1]
    if how == "sum":
        return sum(values)
    if how == "mean":
        return sum(values) / len(values)
    if any(v <= 0 for v in values):
        raise ValueError("a geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class BenchSpec:
    types: tuple[str, ...]
    recipe: str = ""
    command: str = ""
    builds: tuple[str, ...] = ("tuned",)
    replicates: int = 3
    warmups: int = 1
    args: str = ""
    metric: Metric = field(default_factory=Metric)
    executor: str = "ssh"
    spot: bool = True
    concurrency: int = 2
    timeout_s: float = 3600.0
    allow_missing_price: bool = False
    monitor: bool = True
    name: str = ""
    workload: str = ""  # the command template: the plain command, or the recipe's [bench]
    parameters: dict[str, str] = field(default_factory=dict)  # the recipe's {NAME}s' values
    expected_runtime_s: float | None = None  # one replicate, as declared: for the estimate
    max_cost: float | None = None  # USD: no new work once spent + in flight would pass it
    unit: str = ""  # one unit of work ("frames"), for costs per unit; "" for the metric's
    image: str = ""  # an ECR image the command runs in (fleet/container.py); "" on the host
    gpus: int = 0  # GPUs given to the image's container

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchSpec:
        data = dict(data)
        data["metric"] = Metric(**data["metric"])
        for key in ("types", "builds"):
            data[key] = tuple(data[key])
        return cls(**data)

    @property
    def planned(self) -> int:
        """How many replicates the run makes (warm-ups included), counted without listing them:
        a run recorded before the caps (replicates = 99999999999999) must still be read back
        at once by `fleet status`."""
        return len(self.types) * len(self.builds) * (self.warmups + self.replicates)

    def command_line(self) -> str:
        """The workload as run in the build's directory on the instance: the recipe's {NAME}
        placeholders filled with their values (quoted for the shell), {args} with the args."""
        text = self.workload or self.command
        for name, value in self.parameters.items():
            text = text.replace(f"{{{name}}}", shlex.quote(value))
        return text.replace("{args}", self.args)


def line_of(text: str, key: str) -> int | None:
    """The line of `key = ...` or of a `[key]` table in a TOML text, for error messages; a
    dotted key also as `last = ...` inside its table (`workers = {...}` under `[params]`)."""
    # [ \t], not \s: \s matches a newline, and a blank line above the key was named.
    match = re.search(rf"^[ \t]*{re.escape(key)}[ \t]*=", text, re.MULTILINE)
    if match is None:
        match = re.search(rf"^[ \t]*\[{re.escape(key)}\]", text, re.MULTILINE)
    if match is None and "." in key:
        table, last = key.rsplit(".", 1)
        header = re.search(rf"^[ \t]*\[{re.escape(table)}\][ \t]*(#.*)?$", text, re.MULTILINE)
        if header is not None:
            end = re.search(r"^[ \t]*\[", text[header.end() :], re.MULTILINE)
            body = text[header.end() : header.end() + end.start() if end else len(text)]
            inner = re.search(rf"^[ \t]*{re.escape(last)}[ \t]*=", body, re.MULTILINE)
            if inner is not None:
                return text.count("\n", 0, header.end() + inner.start()) + 1
    return text.count("\n", 0, match.start()) + 1 if match else None


def _args_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, float) and checks.number(item):
                raise TypeError(f"args.{key} is {item}, not a finite number")
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                # {b = 1} went in as "{'b': 1}", true as "--verbose True"
                raise TypeError(
                    f"args.{key} is {item!r}: give a string or a number (a flag without a "
                    'value goes in a string: args = "--verbose --n 3")'
                )
            if not checks.FLAG_NAME.fullmatch(str(key)):  # --{key} goes into the command unquoted
                raise TypeError(f"args: {key!r} is not a flag name (letters, digits, - and _)")
        return " ".join(f"--{k} {shlex.quote(str(v))}" for k, v in value.items())
    raise TypeError("args must be a string or a table of name = value")


def metric_from(raw: dict[str, Any], recipe_metric: dict[str, Any]) -> Metric:
    unknown = [k for k in raw if k not in recipes.METRIC_KEYS]
    if unknown:
        known = recipes.METRIC_KEYS
        raise ValueError(f"unknown key {unknown[0]!r}{did_you_mean(unknown[0], known)}")
    # Another kind than the recipe's takes none of its kind's keys (runtime over a recipe's
    # regex kept its unit: seconds were headed "geomean throughput").
    same_kind = "kind" not in raw or raw["kind"] == recipe_metric.get("kind", "runtime")
    merged = {**recipe_metric, **raw} if same_kind else dict(raw)
    kind = str(merged.get("kind", "runtime"))
    if kind not in METRIC_KINDS:
        raise ValueError(f"metric.kind {kind!r} is not one of {', '.join(METRIC_KINDS)}")
    pattern = str(merged.get("pattern", ""))
    if kind == "regex":
        if not pattern:
            raise ValueError("metric.pattern is needed for kind = regex")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"metric.pattern does not compile: {exc}") from None
        if compiled.groups != 1:
            raise ValueError("metric.pattern needs exactly one (group) around the number")
    meaning = str(merged.get("meaning", "seconds" if kind == "runtime" else "rate"))
    if meaning not in MEANINGS or (kind == "runtime" and meaning != "seconds"):
        raise ValueError(
            f"metric.meaning must be rate or seconds (runtime is seconds), not {meaning!r}"
        )
    how = str(merged.get("aggregate", "last"))
    if how not in AGGREGATES:
        raise ValueError(f"metric.aggregate {how!r} is not one of {', '.join(AGGREGATES)}")
    unit = str(merged.get("unit", "s" if meaning == "seconds" else "units/s"))
    if seconds_in(unit, meaning) is None:
        raise ValueError(
            f"metric.unit {unit!r} names no time, so no cost per unit can be had from it: a "
            f"{meaning} metric's unit "
            + (
                "begins with one of ns, us, ms, s, min, h (ms, ns/op)"
                if meaning == "seconds"
                else "ends with one of /ns, /us, /ms, /s, /min, /h (frames/s)"
            )
        )
    return Metric(kind, pattern, meaning, how, unit)


def recipe_metric(recipe: recipes.Recipe) -> Metric:
    """A recipe's [bench] metric, its problems said of the recipe's file (a bench or a tune of
    it blamed its own file, or took a kind no parser knows and measured nothing)."""
    try:
        return metric_from(dict(recipe.bench.get("metric", {})), {})
    except ValueError as exc:
        raise UserError(f"{recipe.file}: bench.{exc}") from None


def load(
    path: Path | None, overrides: dict[str, Any], recipes_dir: Path = recipes.RECIPES_DIR
) -> BenchSpec:
    """The bench file (if any) with command-line values on top; every problem is a UserError
    naming the file and line."""
    text = ""
    data: dict[str, Any] = {}
    where = "command line"
    if path is not None:
        where = str(path)
        text, data = tomlfile.read(path, "bench file")
    for key in data:
        if key not in KNOWN_KEYS:
            raise UserError(
                f"{where}:{line_of(text, key)}: unknown key {key!r}"
                f"{did_you_mean(key, KNOWN_KEYS)}; known: {', '.join(sorted(KNOWN_KEYS))}"
            )
    given = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(given.get("metric"), dict) and isinstance(data.get("metric"), dict):
        # --metric-regex is a pattern: the file's [metric] keeps its meaning and unit (replaced
        # whole, a file's seconds became a rate, and the slowest type ranked first).
        given["metric"] = {**data["metric"], **given["metric"]}
    data.update(given)

    def fail(key: str, message: str) -> UserError:
        if overrides.get(key) is not None:  # said of the flag the user typed
            return UserError(f"{FLAGS.get(key, '--' + key.replace('_', '-'))}: {message}")
        line = line_of(text, key)
        return UserError(f"{where}{f':{line}' if line else ''}: {key}: {message}")

    return _build(data, fail, recipes_dir)


def _build(data: dict[str, Any], fail: Any, recipes_dir: Path) -> BenchSpec:
    types = data.get("types", [])
    families = data.get("families", [])
    sizes = data.get("sizes", ["large"])
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        # (list() of the string "c5a.large" made nine types of its letters)
        raise fail("types", 'must be a list of instance types, e.g. ["c5a.large"]')
    # AWS's names are lower case; "C7i.Large" in a file is the same type (as on the CLIs).
    types = [t.strip().lower() for t in types]
    if not isinstance(families, list) or not isinstance(sizes, list):
        raise fail("families", "families and sizes must be lists")
    families = [f.strip().lower() if isinstance(f, str) else f for f in families]
    sizes = [s.strip().lower() if isinstance(s, str) else s for s in sizes]
    if "sizes" in data and not families:  # else silently ignored: the user meant something
        raise fail("sizes", "sizes are of families: add families = [...] (or --families)")
    for name in families:
        try:
            family = catalog.family(str(name))
        except UserError as exc:
            raise fail("families", str(exc)) from None
        for size in sizes:
            if size not in family.sizes:
                raise fail(
                    "sizes", f"{name} has no size {size!r}; it has {', '.join(family.sizes)}"
                )
            types.append(family.instance_type(size))
    if not types:
        raise fail("types", "name at least one instance type (types = [...] or --types)")
    for instance_type in types:  # a build needs the type's family in the build catalog
        check_type(instance_type, fail, build=bool(data.get("recipe")))
    types = list(dict.fromkeys(types))
    for key in ("recipe", "command"):
        if not isinstance(data.get(key, ""), str):  # ["echo"] ran the text "['echo']"
            raise fail(key, f'must be a string, e.g. {key} = "{EXAMPLE[key]}"')
    recipe, command = str(data.get("recipe", "")), str(data.get("command", ""))
    image = data.get("image", "")
    if image:
        problem = image_problem(image, recipe, command)
        if problem:
            raise fail("image", problem)
    if bool(recipe) == bool(command):
        raise fail("recipe", "give exactly one of recipe (a build recipe) or command")
    recipe_raw: dict[str, Any] = {}
    workload = command
    parameters: dict[str, str] = {}
    if recipe:
        try:
            loaded = recipes.load(recipe, recipes_dir)
        except UserError as exc:
            raise fail("recipe", str(exc)) from None
        bench = loaded.bench
        if "command" not in bench:
            raise fail("recipe", f"{loaded.file} has no [bench] command to run")
        recipe_metric(loaded)  # checked as the recipe's, before the file's [metric] on top
        recipe_raw = dict(bench.get("metric", {}))
        workload = str(bench["command"])
        parameters = loaded.bench_values()
    builds = data.get("builds", ["tuned"])
    if not isinstance(builds, list) or not builds or any(b not in BUILDS for b in builds):
        raise fail("builds", f"must be a non-empty list of {', '.join(BUILDS)}")
    if command and builds != ["tuned"]:
        raise fail("builds", "builds are for a recipe; a plain command has nothing to build")
    if command:
        builds = [PLAIN]
    defaults = {"replicates": 3, "warmups": 1, "concurrency": 2, "gpus": 0}
    numbers: dict[str, int] = {}
    for key, (low, high, why) in COUNTS.items():
        value = data.get(key, defaults[key])
        problem = checks.integer(value, low, high, why)
        if problem:
            raise fail(key, problem)
        numbers[key] = value
    if numbers["gpus"] and not image:
        raise fail("gpus", 'GPUs are given to an image\'s container: add image = "..."')
    executor = str(data.get("executor", "ssh"))
    if executor not in EXECUTORS:
        raise fail("executor", f"{executor!r} is not one of {', '.join(EXECUTORS)}")
    if not isinstance(data.get("name", ""), str):  # a TOML date or a number: quote it
        raise fail("name", f"must be a string (quoted), not {data['name']!r}")
    try:
        args = _args_text(data.get("args", ""))
    except TypeError as exc:
        raise fail("args", str(exc)) from None
    if args and "{args}" not in workload:
        # They would be dropped without a word, and the run measure something else.
        raise fail("args", f"the command ({workload}) has no {{args}} to take them")
    metric_raw = data.get("metric", {})
    if isinstance(metric_raw, str):
        metric_raw = {"kind": "regex", "pattern": metric_raw} if metric_raw != "runtime" else {}
    if not isinstance(metric_raw, dict):
        raise fail("metric", "must be a table: [metric] kind = ...")
    try:
        metric = metric_from(metric_raw, recipe_raw)
    except ValueError as exc:
        raise fail("metric", str(exc)) from None
    timeout = data.get("timeout_s", 3600.0)
    # At least a second: the wrapper on the instance counts whole seconds (0.4 killed every
    # replicate at once, "timed out after 0s").
    problem = checks.number(
        timeout, above=0, at_most=MAX_TIMEOUT_S, why="a replicate running for a week is stuck"
    ) or ("must be 1 or more" if isinstance(timeout, int | float) and timeout < 1 else "")
    if problem:
        raise fail("timeout_s", f"{problem} (seconds)")
    for key in ("spot", "allow_missing_price", "monitor"):
        if not isinstance(data.get(key, True), bool):
            raise fail(key, "must be true or false")
    expected = data.get("expected_runtime")
    try:
        expected_s = None if expected is None else cost.seconds(expected)
    except ValueError as exc:
        raise fail("expected_runtime", str(exc)) from None
    max_cost = data.get("max_cost")
    problem = "" if max_cost is None else cap_problem(max_cost)
    if problem:
        raise fail("max_cost", problem)
    if max_cost is not None and executor == "batch":
        # Batch starts and stops the instances itself: the cap acts between an ssh run's
        # replicates, where fleet decides what is launched next.
        raise fail("max_cost", "caps runs on the ssh executor only; batch jobs run on the queue's")
    unit = data.get("unit", "")
    if not isinstance(unit, str) or ("unit" in data and not unit.strip()):
        raise fail("unit", 'must name one unit of work, e.g. unit = "frames"')
    return BenchSpec(
        types=tuple(types),
        recipe=recipe,
        command=command,
        builds=tuple(dict.fromkeys(builds)),
        replicates=numbers["replicates"],
        warmups=numbers["warmups"],
        args=args,
        metric=metric,
        executor=executor,
        spot=bool(data.get("spot", True)),
        concurrency=numbers["concurrency"],
        timeout_s=float(timeout),
        allow_missing_price=bool(data.get("allow_missing_price", False)),
        monitor=bool(data.get("monitor", True)),
        name=str(data.get("name", "")),
        workload=workload,
        parameters=parameters,
        expected_runtime_s=expected_s,
        max_cost=None if max_cost is None else float(max_cost),
        unit=unit.strip(),
        image=str(image).strip(),
        gpus=numbers["gpus"],
    )


def image_problem(image: Any, recipe: str, command: str) -> str:
    """What is wrong with a bench file's image, or '' (whether ECR has it is asked before
    anything is launched, fleet/container.py)."""
    if recipe:
        return "an image runs a command; a recipe builds on the instance: give one of them"
    if not isinstance(image, str):
        return "must be an ECR image reference in quotes"
    try:
        ImageRef.parse(image)
    except ValueError as exc:
        return str(exc)
    if not command.strip():
        return 'needs command = "..." to run in it'
    return ""


def cap_problem(value: Any) -> str:
    """What is wrong with a spending cap (max_cost, --max-cost), or ''."""
    return checks.number(
        value, above=0, at_most=MAX_COST_USD, why="a cap is for what you mean to spend"
    )


def check_type(instance_type: str, fail: Any, build: bool = True) -> None:
    """An instance type EC2 has: for a build, FAMILY.SIZE of a build-catalog family and one of
    its sizes; for a workload that needs none (build=False), any type EC2 names (whether the
    region offers it is asked at run time, before anything is launched)."""
    if instance_kinds.in_catalog(instance_type):
        return
    family_name = instance_type.partition(".")[0]
    known = catalog.families().get(family_name)
    if instance_type in instance_kinds.ec2_names() and not (build and known):
        if build:
            raise fail("types", instance_kinds.not_for_builds(instance_type))
        return
    if known is not None:
        raise fail(
            "types",
            f"unknown instance type {instance_type!r}: {family_name} comes in "
            f"{', '.join(known.sizes)}",
        )
    close = instance_kinds.suggestions(instance_type)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise fail("types", f"unknown instance type {instance_type!r}: EC2 has no such type{hint}")
