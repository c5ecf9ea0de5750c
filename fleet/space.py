"""A search space for `fleet tune`: parameters, their kinds and stages, and conditions; turned
into a hyperopt space (for tpe and random) or enumerated (for grid).

    [params.opt]
    kind = "categorical"            # categorical | int | uniform | loguniform
    values = ["-O2", "-O3"]
    stage = "compile"               # compile: into the build flags; run: into {args}
    [params.vector_width]
    kind = "categorical"
    values = ["128", "256", "512"]
    stage = "compile"
    flag = "-mprefer-vector-width={}"
    when = { arch = "x86_64" }      # or { param = "opt", in = ["-O3"] }
    [params.threads]
    kind = "int"
    low = 1
    high = 2
    step = 1
    stage = "run"
    arg = "--threads {}"

A condition on a categorical parameter nests the conditional one under that parameter's options
(hyperopt's own way to express it), so the search never spends a trial on a combination that
cannot exist. A condition on `arch` is settled by the instance types in play.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from amibake import checks
from amibake.errors import UserError, did_you_mean
from fleet.spec import check_type, line_of

if TYPE_CHECKING:
    from amibake.recipes import Recipe

KINDS = ("categorical", "int", "uniform", "loguniform")
STAGES = ("compile", "run")
TYPE = "instance_type"  # the parameter (and its stage) that chooses the instance type
# A parameter's table: what each key is for. A key not here (flg = ...) was ignored, and the
# search ran without what the user meant.
KEYS = ("kind", "values", "low", "high", "step", "stage", "flag", "arg", "when", "scale")
SCALE = "nodes"  # a parameter of this name is a node count (scale) without saying so
# An int parameter is searched by its position in its list of values, which is built whole.
MAX_VALUES = 10000


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    stage: str
    values: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    step: float = 1.0
    template: str = ""  # "-mprefer-vector-width={}" (compile) or "--threads {}" (run)
    when_param: str = ""
    when_in: tuple[Any, ...] = ()
    # A node count or other scale-out factor: more of it, less time, more price per hour (the
    # search may model time as a + b/n + c log n, as Ernest, NSDI'16). None: not said, and the
    # search may take it for one by its name and values (fleet/search/features.py: node_count)
    scale: bool | None = None

    def options(self) -> list[Any]:
        """Every value of a discrete parameter (categorical, or int with its step)."""
        if self.kind == "categorical":
            return list(self.values)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step)))
        raise ValueError(f"{self.name} is {self.kind}: continuous, it has no list of values")

    @property
    def ordinal(self) -> bool:
        """Numbers have an order the search should use: near values perform alike (a block of
        48 is between 32 and 64). Searched by position, not as unrelated labels."""
        return self.kind == "int" or (
            self.kind == "categorical"
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in self.values)
        )

    def render(self, value: Any) -> str:
        if self.template:
            return self.template.replace("{}", str(value))
        return str(value) if self.stage == "compile" else f"--{self.name} {value}"


def key(params: dict[str, Any]) -> str:
    """A configuration's identity: the same parameters, the same key."""
    return json.dumps(params, sort_keys=True, default=str)


@dataclass
class Space:
    params: dict[str, Param]
    architectures: set[str] = field(default_factory=set)  # of the types in play
    # Where each parameter is written ("tune.toml:7"), for an error the search meets later (an
    # instance type whose features neither its name nor the catalog gives).
    origins: dict[str, str] = field(default_factory=dict)
    # The configurations that can run, where not every combination of the values can: a replay
    # table's rows. A published table of cluster runs sets its node counts per size (the
    # cluster's total vCPUs take a few values), so the grid of its columns is twice its rows,
    # and a search over the grid spent half its trials on configurations nobody ran. None:
    # every combination.
    only: list[dict[str, Any]] | None = None
    # What each configuration costs an hour where a replay table says (its price column), by
    # configuration (key): the search weighs it as it weighs the catalog's price, which knows
    # neither the types a public table's authors ran (c4, r3) nor the prices they paid.
    prices: dict[str, float] = field(default_factory=dict)

    def holding(
        self, configurations: list[dict[str, Any]], prices: dict[str, float] | None = None
    ) -> Space:
        """This space narrowed to `configurations` (each a combination of its values), with
        what each costs an hour where that is known (`prices`, by key)."""
        return replace(self, only=[dict(c) for c in configurations], prices=dict(prices or {}))

    def price(self, chosen: dict[str, Any]) -> float | None:
        """What the configuration costs an hour, where the space was given it."""
        return self.prices.get(key(self.active(chosen))) if self.prices else None

    def names(self, chosen: dict[str, Any]) -> bool:
        """Whether `chosen` is one of this space's configurations: each value one its parameter
        lists, each parameter one that applies, and every one that applies given (a replay
        table's row the search can run: one with an empty cell was {}, and recommended)."""
        return (
            all(
                name in self.params and value in self.params[name].options()
                for name, value in chosen.items()
            )
            and self.active(chosen) == chosen
            and all(n in chosen for n, p in self.params.items() if self._holds(p, chosen))
        )

    def origin(self, name: str) -> str:
        return self.origins.get(name, "the search space")

    def active(self, chosen: dict[str, Any]) -> dict[str, Any]:
        """The parameters that apply to this choice (a conditional one only where it holds)."""
        return {
            name: value
            for name, value in chosen.items()
            if name in self.params and self._holds(self.params[name], chosen)
        }

    def _holds(self, param: Param, chosen: dict[str, Any]) -> bool:
        if not param.when_param:
            return True
        return chosen.get(param.when_param) in param.when_in

    def hyperopt(self) -> dict[str, Any]:
        from hyperopt import hp

        def expression(param: Param, label: str) -> Any:
            if param.ordinal:  # a position; Search.ask maps it back to the value
                return hp.quniform(label, -0.5, len(param.options()) - 0.5, 1)
            if param.kind == "categorical":
                return hp.choice(label, list(param.values))
            if param.kind == "uniform":
                return hp.uniform(label, param.low, param.high)
            return hp.loguniform(label, math.log(param.low), math.log(param.high))

        children: dict[str, list[Param]] = {}
        for param in self.params.values():
            if param.when_param:
                children.setdefault(param.when_param, []).append(param)
        space: dict[str, Any] = {}
        for param in self.params.values():
            if param.when_param:
                continue
            mine = children.get(param.name, [])
            if not mine:
                space[param.name] = expression(param, param.name)
                continue
            branches = []
            for option in param.options():
                branch: dict[str, Any] = {"__value": option}
                for child in mine:
                    if option in child.when_in:
                        branch[child.name] = expression(
                            child, f"{child.name}|{param.name}={option}"
                        )
                branches.append(branch)
            space[param.name] = hp.choice(param.name, branches)
        return space

    def hyperopt_values(self, chosen: dict[str, Any]) -> dict[str, list[Any]]:
        """A configuration as hyperopt records a draw of `hyperopt()` (a label's index into its
        choice, or its value): the inverse of `from_sample`, for a configuration the search
        picks itself and hyperopt must learn from as its own."""

        def value(param: Param, given: Any) -> Any:
            if param.ordinal:
                return float(param.options().index(given))  # a position (quniform)
            if param.kind == "categorical":
                return param.options().index(given)  # the choice's index
            return given

        vals: dict[str, list[Any]] = {}
        for param in self.params.values():
            if param.when_param:
                continue
            given = chosen[param.name]
            vals[param.name] = [value(param, given)]
            for child in self.params.values():
                if child.when_param != param.name:
                    continue
                for option in (o for o in param.options() if o in child.when_in):
                    label = f"{child.name}|{param.name}={option}"
                    held = option == given and child.name in chosen and option in child.when_in
                    vals[label] = [value(child, chosen[child.name])] if held else []
        return vals

    def from_sample(self, sample: dict[str, Any]) -> dict[str, Any]:
        """hyperopt's sample -> {name: value}: nesting undone, positions turned into values."""
        flat = self.flatten(sample)
        for name, value in flat.items():
            param = self.params.get(name)
            if param is not None and param.ordinal:
                options = param.options()
                flat[name] = options[min(max(round(value), 0), len(options) - 1)]
        return flat

    @staticmethod
    def flatten(sample: dict[str, Any]) -> dict[str, Any]:
        """hyperopt's nested sample -> {name: value}."""
        flat: dict[str, Any] = {}
        for name, value in sample.items():
            if isinstance(value, dict):
                flat[name] = value["__value"]
                flat.update({k: v for k, v in value.items() if k != "__value"})
            else:
                flat[name] = value
        return flat

    @property
    def continuous(self) -> list[str]:
        """The parameters with no list of values (uniform, loguniform)."""
        return [p.name for p in self.params.values() if p.kind in ("uniform", "loguniform")]

    def _require_discrete(self) -> None:
        if self.continuous:
            raise UserError(
                f"grid needs a discrete space: {', '.join(self.continuous)} "
                "is continuous (make it int with a step, or categorical)"
            )

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every valid combination of a discrete space, each once."""
        self._require_discrete()
        if self.only is not None:
            yield from (dict(c) for c in self.only)
            return
        roots = [p for p in self.params.values() if not p.when_param]
        for combination in itertools.product(*(p.options() for p in roots)):
            chosen = dict(zip((p.name for p in roots), combination, strict=True))
            conditional = [
                p for p in self.params.values() if p.when_param and self._holds(p, chosen)
            ]
            for extra in itertools.product(*(p.options() for p in conditional)):
                yield {**chosen, **dict(zip((p.name for p in conditional), extra, strict=True))}

    def size(self) -> int:
        """How many combinations grid() yields, counted without enumerating them (a space of
        ten parameters of ten values has 10^10)."""
        self._require_discrete()
        if self.only is not None:
            return len(self.only)
        total = 1
        for root in (p for p in self.params.values() if not p.when_param):
            children = [p for p in self.params.values() if p.when_param == root.name]
            total *= sum(
                math.prod(len(c.options()) for c in children if option in c.when_in)
                for option in root.options()
            )
        return total

    def check_workload(self, recipe: Recipe) -> None:
        """A run parameter the recipe's [bench.parameters] declares takes values of the declared
        kind: a uniform `threads` ran `--threads 1.44`, and the search recommended it."""
        declared = recipe.bench.get("parameters", {})
        for param in self.params.values():
            wanted = declared.get(param.name) if isinstance(declared, dict) else None
            if param.stage != "run" or not isinstance(wanted, dict):
                continue
            kind = wanted.get("kind", "int")
            whose = f"{recipe.name}'s workload takes {param.name} as"
            where = f"its [bench.parameters] in {recipe.file}"
            if kind == "int" and not (
                param.kind == "int"
                or (param.kind == "categorical" and all(_integral(v) for v in param.values))
            ):
                raise UserError(
                    f"params.{param.name}: {whose} an integer ({where}); kind = "
                    f'"{param.kind}" would pass it fractions such as 1.44: make it kind = "int" '
                    "with low, high and step, or categorical integers"
                )
            if kind in ("uniform", "loguniform") and not (
                param.kind != "categorical" or all(_numeric(v) for v in param.values)
            ):
                raise UserError(
                    f"params.{param.name}: {whose} a number ({where}); its values "
                    f"{list(param.values)} are not all numbers"
                )
            known = wanted.get("values")
            if kind == "categorical" and isinstance(known, list):
                if param.kind != "categorical":
                    raise UserError(
                        f"params.{param.name}: {whose} one of {known} ({where}); make it "
                        'kind = "categorical" with some of those values'
                    )
                foreign = [v for v in param.values if v not in known]
                if foreign:
                    raise UserError(
                        f"params.{param.name}: {foreign} are not among the values {known} the "
                        f"workload takes ({where})"
                    )

    def cflags(self, chosen: dict[str, Any]) -> str:
        return " ".join(
            self.params[n].render(v)
            for n, v in sorted(self.active(chosen).items())
            if self.params[n].stage == "compile" and str(v) != ""
        )

    def args(self, chosen: dict[str, Any]) -> str:
        return " ".join(
            self.params[n].render(v)
            for n, v in sorted(self.active(chosen).items())
            if self.params[n].stage == "run"
        )


def _integral(value: Any) -> bool:
    """An integer, or the text of one ("8" passes as --threads 8 all the same)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit())


def _numeric(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def parse(raw: Any, where: str, text: str, types: list[str], build: bool = True) -> Space:
    """The [params] table of a tune file; every problem names the file and line. ``types`` are
    the instance types in play when the type is not itself a parameter; ``build`` says whether
    a trial builds (a recipe does; a replay table or a prebuilt workload does not), and so
    whether each type's family must be in the build catalog."""
    from amibake import instance_kinds

    arch_of = instance_kinds.architecture

    def fail(name: str, message: str) -> UserError:
        line = line_of(text, f"params.{name}")
        return UserError(f"{where}{f':{line}' if line else ''}: params.{name}: {message}")

    given = raw.get(TYPE) if isinstance(raw, dict) else None
    # values that are no list (5, or one type's name, read letter by letter) are refused below
    if isinstance(given, dict) and isinstance(given.get("values"), list):
        types = [str(t) for t in given["values"]]
        for instance_type in types:
            check_type(instance_type, lambda _key, message: fail(TYPE, message), build=build)
    architectures = {arch_of(t) for t in types}

    if not isinstance(raw, dict) or not raw:
        line = text[: text.find("[params")].count("\n") + 1 if "[params" in text else None
        return_error = f"{where}{f':{line}' if line else ''}: the search space is empty: add "
        raise UserError(return_error + "[params.NAME] tables (see `fleet tune --help`)")
    params: dict[str, Param] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            raise fail(name, "must be a table with kind, stage and its range or values")
        kind = spec.get("kind")
        if kind not in KINDS:
            raise fail(name, f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        unknown_keys = [key for key in spec if key not in KEYS]
        if unknown_keys:
            unknown = unknown_keys[0]
            raise fail(
                name,
                f"unknown key {unknown!r}{did_you_mean(unknown, KEYS)}; known: {', '.join(KEYS)}",
            )
        if name == TYPE:
            # The type picks the instance: it is neither a build flag nor a workload argument.
            if kind != "categorical" or "stage" in spec:
                raise fail(name, "the instance type is categorical, with values and no stage")
            stage = TYPE
        else:
            stage = spec.get("stage", "run")
            if stage not in STAGES:
                raise fail(name, f"stage {stage!r} is not compile or run")
        # Each stage has its own way into the workload; the other's was silently ignored.
        if "flag" in spec and stage != "compile":
            raise fail(
                name,
                "flag is for compile-stage parameters (a build flag); a run parameter is "
                'passed by arg = "--NAME {}"',
            )
        if "arg" in spec and stage != "run":
            raise fail(
                name,
                "arg is for run-stage parameters (a workload argument); a compile parameter is "
                'passed by flag = "-x={}"',
            )
        for key in ("flag", "arg"):
            if key in spec and not isinstance(spec[key], str):
                raise fail(name, f'{key} must be a string such as "--{name} {{}}"')
            # Into a build script's CFLAGS="..." or a replicate's command line on the instance,
            # as written: a ; or $( ran there as a command (as root, in a build).
            problem = checks.shell_words(str(spec.get(key, "")).replace("{}", "0"))
            if problem:
                raise fail(name, f"{key}: {problem}")
        if stage != TYPE and not checks.FLAG_NAME.fullmatch(name):
            raise fail(name, "a parameter's name is letters, digits, - and _: it is the "
                       "workload's --NAME, or its recipe's {NAME}")  # fmt: skip
        values: tuple[Any, ...] = ()
        low = high = 0.0
        step = 1.0
        if kind == "categorical":
            raw_values = spec.get("values", ())
            if not isinstance(raw_values, list) or not raw_values:
                raise fail(name, "a categorical parameter needs a non-empty list of values")
            values = tuple(raw_values)
            if len(set(map(str, values))) != len(values):
                raise fail(name, "values repeat")
            for value in values:
                if isinstance(value, float) and checks.number(value):
                    raise fail(name, f"values: {value} is not a finite number")
                if not isinstance(value, str | int | float):
                    raise fail(name, f"values: {value!r} is not a string or a number")
                problem = checks.shell_words(str(value)) if stage != TYPE else ""
                if problem:
                    raise fail(name, f"values: {problem}: give plain flags or words")
        else:
            if "values" in spec:
                raise fail(name, f"{kind} takes low and high, not values (or kind = categorical)")
            for key in ("low", "high"):
                problem = checks.number(spec.get(key))
                if problem:
                    raise fail(name, f"{kind} needs numbers low and high: {key} {problem}")
            low, high = float(spec["low"]), float(spec["high"])
            if low > high:
                raise fail(name, f"low {low:g} is above high {high:g}: the range is empty")
            if kind == "int":
                raw_step = spec.get("step", 1)
                step = float(raw_step) if not checks.number(raw_step) else 0.0
                if (
                    step < 1
                    or not step.is_integer()
                    or not (low.is_integer() and high.is_integer())
                ):
                    raise fail(name, "int needs integer low, high and a step of at least 1")
                if (high - low) // step + 1 > MAX_VALUES:
                    raise fail(
                        name,
                        f"{int((high - low) // step + 1)} values is more than {MAX_VALUES}: an int "
                        "parameter is searched by its position among them; widen the step (or "
                        "use loguniform)",
                    )
            elif "step" in spec:
                raise fail(name, f"step is for int parameters; {kind} is continuous")
            if kind == "loguniform" and low <= 0:
                raise fail(name, "loguniform needs low above 0")
        when = spec.get("when", {})
        when_param: str = ""
        when_in: tuple[Any, ...] = ()
        if when:
            if not isinstance(when, dict):
                raise fail(
                    name, "when must be a table: { arch = ... } or { param = ..., in = [...] }"
                )
            keys = sorted(when)
            if keys not in (["arch"], ["in", "param"]):
                # arch beside param dropped the param; a misspelt key was read as absent
                raise fail(
                    name,
                    f"when has {', '.join(keys)}: give {{ arch = ... }} or {{ param = ..., "
                    "in = [...] }}",
                )
            if "in" in when and not isinstance(when["in"], list):  # "16" was read as 1 and 6
                raise fail(name, f"when.in must be a list of values, not {when['in']!r}")
            if "arch" in when:
                arch = when["arch"]
                if arch not in ("x86_64", "arm64"):
                    raise fail(name, f"when.arch {arch!r} is not x86_64 or arm64")
                if architectures and arch not in architectures:
                    continue  # never applies to the types in play
                if len(architectures) > 1:  # the type is a parameter spanning architectures
                    when_param = TYPE
                    when_in = tuple(t for t in types if arch_of(t) == arch)
            else:
                when_param = str(when.get("param", ""))
                when_in = tuple(when.get("in", ()))
                if not when_param or not when_in:
                    raise fail(name, "when needs param and a non-empty in = [...]")
        scale = spec.get("scale", True if name == SCALE and kind != "categorical" else None)
        if name == SCALE and kind == "categorical" and "scale" not in spec:
            scale = all(_numeric(v) and v > 0 for v in values)
        if scale is not None and not isinstance(scale, bool):
            raise fail(name, f"scale must be true or false, not {scale!r}")
        if scale and not (
            (kind == "categorical" and all(_numeric(v) and v > 0 for v in values))
            or (kind != "categorical" and low > 0)
        ):
            shown = list(values) if kind == "categorical" else f"{low:g}..{high:g}"
            raise fail(
                name,
                f"scale = true marks a node count, a number above 0; {shown} is not: make "
                "its values numbers above 0, or drop scale",
            )
        params[name] = Param(
            name,
            kind,
            stage,
            values,
            low,
            high,
            step,
            str(spec.get("flag" if stage == "compile" else "arg", "")),
            when_param,
            when_in,
            scale,
        )
    for param in params.values():
        if param.when_param and param.when_param not in params:
            raise fail(param.name, f"when names an unknown parameter {param.when_param!r}")
        if param.when_param in params:
            parent = params[param.when_param]
            if parent.kind != "categorical" or parent.when_param:
                raise fail(
                    param.name, f"when needs {parent.name} to be an unconditional categorical"
                )
            unknown = [v for v in param.when_in if v not in parent.values]
            if unknown:
                raise fail(param.name, f"when.in has {unknown!r}, not values of {parent.name}")
    if not params:
        raise UserError(f"{where}: no parameter applies to the instance types in play")
    origins = {}
    for name in params:
        line = line_of(text, f"params.{name}")
        origins[name] = f"{where}{f':{line}' if line else ''}"
    return Space(params, architectures, origins)
