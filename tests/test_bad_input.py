"""Bad input to both CLIs, as an adversarial user would give it (issue 24): each row is what was
typed (and the files and environment it names), the exit code, the first words of the one-line
error, and that nothing was created: no fleet run, no journal run, no file, and no cloud asked.

The local cloud is the cloud of every row, and asking it anything fails the row: bad input is
refused before any cloud is contacted. The few refusals that need the cloud's answer (an image
that does not exist) are at the end, on the session's local cloud, checked for leftovers."""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amibake import config
from amibake.cli import _duration
from amibake.cli import main as amibake
from amibake.cloud import Cloud
from amibake.journal import Journal
from fleet import bench, plan, spec, tune
from fleet.cli import main as fleet
from tests.helpers import wait_until_clean

RECIPES = Path(__file__).parent / "recipes"

# Bases that each row spoils in one place (the last tests show that unspoilt, they pass).
BENCH = 'types = ["c5a.large"]\ncommand = "echo {args}"\n'
TABLE = {"t.csv": "a,metric\n1,3\n2,2\n3,1\n"}
TUNE_HEAD = 'replay = "{tmp}/t.csv"\nobjective = "metric"\n'
PARAM_A = '[params.a]\nkind = "int"\nlow = 1\nhigh = 3\n'
TUNE = TUNE_HEAD + PARAM_A
KERNELS = 'recipe = "kernels"\ntypes = ["c5a.large"]\n'
# A byte that is no UTF-8 (Latin-1's e acute) on the second line.
LATIN1 = b"# caf\xe9\n"


def case(
    argv: str,
    start: str,
    code: int = 2,
    *,
    files: dict[str, str | bytes] | None = None,
    env: dict[str, str] | None = None,
    id: str | None = None,
) -> Any:
    """A row: `argv` as a shell would split it ({tmp}: the row's own directory)."""
    return pytest.param(argv, start, code, files or {}, env or {}, id=id or argv)


def bench_file(text: str | bytes, id: str) -> Any:
    """A bench file; the error is BENCH_FILE_ERRORS[id] after the file's path."""
    start = "{tmp}/bench.toml" + BENCH_FILE_ERRORS[id]
    return case("fleet bench {tmp}/bench.toml", start, files={"bench.toml": text}, id=f"bench:{id}")


def tune_file(text: str | bytes, start: str, id: str, table: str | bytes | None = None) -> Any:
    files: dict[str, str | bytes] = {"tune.toml": text, **TABLE}
    if table is not None:
        files["t.csv"] = table
    return case("fleet tune {tmp}/tune.toml", start, files=files, id=f"tune:{id}")


def config_env(name: str, value: str, start: str) -> Any:
    """A setting's bad value, said of the variable that set it."""
    start = start if start.startswith(name) else f"{name}: {start}"
    return case("fleet status", start, env={name: value}, id=f"env:{name}={value}")


def config_file(text: str | bytes, start: str, id: str) -> Any:
    return case("fleet status", start, files={"amibake.toml": text}, id=f"amibake.toml:{id}")


def recipe_file(replace: tuple[str, str] | bytes, start: str, id: str) -> Any:
    """The trivial recipe with one change, built: refused before the build's cloud."""
    original = (RECIPES / "trivial" / "recipe.toml").read_text()
    text = replace if isinstance(replace, bytes) else original.replace(*replace)
    return case(
        "amibake build --family c5a --recipe trivial",
        start,
        files={"recipes/trivial/recipe.toml": text},
        env={"AMIBAKE_RECIPES_DIR": "{tmp}/recipes"},
        id=f"recipe:{id}",
    )


AMIBAKE = [
    case("amibake", "the following arguments are required: command"),
    case("amibake bogus", "argument command: invalid choice: 'bogus'"),
    # A command's option before the command: its value was read as the command.
    case("amibake --cloud local ls", "--cloud goes after the command: `amibake ls --cloud local`"),
    case("fleet --region=eu-west-1 status", "--region goes after the command: `fleet status "
         "--region=eu-west-1`"),
    case("amibake build", "the following arguments are required: --family"),
    case("amibake build --family c7i --tmpfs-gb 1", "unrecognized arguments: --tmpfs-gb 1"),
    case("amibake build --family ''", "--family needs at least one family"),
    case("amibake build --family c7i --on-demand --on-demand-fallback", "--on-demand-fallback is "
         "for spot builds"),
    case("amibake build --family ,,", "--family needs at least one family"),
    case("amibake build --family c7ii", "unknown family 'c7ii'; did you mean c7i"),
    case("amibake build --family c5a --size huge", "size 'huge' is not offered for c5a"),
    case("amibake build --family c5a --size ../x", "size '../x' is not offered for c5a"),
    case("amibake build --family c5a --recipe ../x", "recipe '../x' is not a plain name"),
    case("amibake build --family c5a --recipe /etc", "recipe '/etc' is not a plain name"),
    case("amibake build --family c5a --recipe .", "recipe '.' is not a plain name"),
    case("amibake build --family c5a --recipe ''", "recipe '' is not a plain name"),
    case("amibake build --family c5a --recipe kernels/../zstd", "recipe 'kernels/../zstd' is"),
    case("amibake build --family c5a --recipe nope", "unknown recipe 'nope'"),
    case("amibake build --family c5a --spot --on-demand", "argument --on-demand: not allowed"),
    case("amibake build --family c5a --cloud gcp", "--cloud: cloud must be one of aws, local, got 'gcp'"),
    case("amibake build --family c5a --region mars", "--region: region must be an AWS region code"),
    case("amibake build --family c5a --region eu-north-1", "the local cloud serves"),
    case("amibake bake --tmpfs-reserve-mb-per-vcpu -1", "argument --tmpfs-reserve-mb-per-vcpu: "
         "must be an integer from 0 to 32768, not -1"),
    case("amibake bake --tmpfs-reserve-mb-per-vcpu 99999999999999999999", "argument "
         "--tmpfs-reserve-mb-per-vcpu: must be an integer from 0 to 32768, not 99999999999999999999: "
         "no EC2 type has more memory per vCPU"),
    case("amibake bake --tmpfs-reserve-mb-per-vcpu 1.5", "argument --tmpfs-reserve-mb-per-vcpu: "
         "'1.5' is not an integer"),
    case("amibake bake --name 'bad|name'", "--name 'bad|name': an image name prefix is up to"),
    case("amibake bake --name ''", "--name '': an image name prefix is up to"),
    case("amibake bake --family c7ii", "unknown family 'c7ii'"),
    case("amibake bake --recipe kernels", "--recipe goes with --build"),
    case("amibake bake --keep 0", "argument --keep: must be an integer of at least 1, not 0"),
    case("amibake bake --keep=-2", "argument --keep: must be an integer of at least 1, not -2"),
    case("amibake bake --keep two", "argument --keep: 'two' is not an integer"),
    case("amibake bake --keep 1.5", "argument --keep: '1.5' is not an integer"),
    case("amibake bake --keep", "argument --keep: expected one argument"),
    case("amibake ls --cloud gcp", "--cloud: cloud must be one of aws, local, got 'gcp'"),
    case("amibake ls --region mars", "--region: region must be an AWS region code"),
    case("amibake ls --all", "unrecognized arguments: --all"),
    case("amibake bake --build --family c5a --recipe ../x", "recipe '../x' is not a plain name"),
    case("amibake bake --build --family c5a --recipe nope", "unknown recipe 'nope'"),
    case("amibake bake --region mars", "--region: region must be an AWS region code"),
    case("amibake batch", "the following arguments are required: batch_command"),
    case("amibake batch bogus", "argument batch_command: invalid choice: 'bogus'"),
    case("amibake batch up", "one of the arguments --ami --from-bake is required"),
    case("amibake batch up --ami ami-12345678 --from-bake", "argument --from-bake: not allowed"),
    case("amibake batch up --ami bad", "--ami 'bad' is not an image id"),
    case("amibake batch up --ami ami-../../x", "--ami 'ami-../../x' is not an image id"),
    case("amibake batch down --cloud gcp", "--cloud: cloud must be one of aws, local"),
    case("amibake families --compiler gcc@abc", "compiler 'gcc@abc' is not NAME@VERSION"),
    case("amibake families --compiler clang", "compiler 'clang' is not NAME@VERSION"),
    case("amibake families --first", "--first goes with --host"),
    case("amibake families --host --recipe ../x", "recipe '../x' is not a plain name"),
    case("amibake families --host --recipe /tmp", "recipe '/tmp' is not a plain name"),
    # judged by the targets, exit 0, as if the recipe had no build yet
    case("amibake families --host --recipe nosuch", "unknown recipe 'nosuch'; known: kernels"),
    case("amibake families --recipe kernels", "--recipe goes with --host"),
    case("amibake families --architecture arm64", "--architecture goes with --host"),
    case("amibake iam-policy --for nope", "iam-policy: unknown command 'nope'"),
    case("amibake iam-policy --for ,", "--for needs at least one command"),
    case("amibake iam-policy --for ''", "--for needs at least one command"),
    case("amibake gc --older-than 2x", "--older-than '2x': use a number and a unit"),
    case("amibake gc --older-than=-1h", "--older-than '-1h': use a number and a unit"),
    case("amibake gc --older-than 99999999999999d", "--older-than 99999999999999d: more than "
         "ten years"),
    case("amibake gc --older-than 999999999999999999999s", "--older-than 999999999999999999999s"),
    case("amibake gc --run-id fb-1234", "--run-id fb-1234 is a fleet run"),
    case("amibake gc --run-id xyz", "--run-id 'xyz' is not an amibake run id"),
    case("amibake gc --run-id ab-123", "--run-id 'ab-123' is not an amibake run id"),
    case("amibake source", "the following arguments are required: source_command"),
    case("amibake source add {tmp}/missing.tar.gz", "{tmp}/missing.tar.gz: no such file"),
    case("amibake source add {tmp}", "{tmp} is a directory; give the source archive itself"),
    case("amibake source add {tmp}/zstd-1.5.4.tar.gz", "{tmp}/zstd-1.5.4.tar.gz: sha256 ",
         files={"zstd-1.5.4.tar.gz": b"tampered"}),
    case("amibake source has ../x", "recipe '../x' is not a plain name"),
    case("amibake source has nope", "unknown recipe 'nope'"),
    case("amibake recipe", "the following arguments are required: recipe_command"),
    case("amibake recipe new x", "the following arguments are required: --from"),
    case("amibake recipe new x --from {tmp}/missing", "--from {tmp}/missing: no such directory"),
    case("amibake recipe new x --from {tmp}/a-file", "--from {tmp}/a-file: not a directory"),
    case("amibake recipe new x --from {tmp}/empty", "--from {tmp}/empty: no files to build (the "
         "tree is empty, or .gitignore excludes everything)", files={"empty/.gitignore": "*\n"}),
    case("amibake recipe new x --from {tmp}/src", "--from {tmp}/src: no CMakeLists.txt, "
         "configure(.ac) or Makefile at its top to tell the build system: give --build "
         "cmake|make|autotools, or --build custom", files={"src/main.c": "int main() {}\n"}),
    case("amibake recipe new x --from https://git.example.org/x.git", "--from "
         "https://git.example.org/x.git: a git URL is built at a pinned commit: add --commit SHA"),
    case("amibake recipe new x --from https://git.example.org/x.git --commit abc1234",
         "--commit abc1234: give the full 40-hex commit"),
    case("amibake recipe new x --from file://{recipes}/.. --commit " + "0" * 40,
         f"commit {'0' * 40} is not in file://{{recipes}}/..: check --commit"),
    case("amibake recipe new x --from {tmp} --commit " + "0" * 40,
         "--commit goes with a git URL; --from {tmp} is a directory"),
    case("amibake recipe new x --from {tmp} --build scons", "argument --build: invalid choice"),
    case("amibake recipe new x --from {tmp} --artifact ../x", "--artifact: '../x' is not a path "
         "under the install prefix"),
    case("amibake recipe new ../x --from {tmp}", "recipe '../x' is not a plain name"),
    case("amibake recipe new 'a b' --from {tmp}", "recipe 'a b' is not a plain name"),
    case("amibake recipe new kernels --from {tmp}", "recipe kernels already exists in {recipes}: "
         "choose another name"),
    case("amibake local", "the following arguments are required: local_command"),
    case("amibake local interrupt bad", "'bad' is not an instance id"),
    case("amibake local interrupt 'i-1; reboot'", "'i-1; reboot' is not an instance id"),
    case("amibake local up --region mars", "--region: region must be an AWS region code"),
    # the README's `local up --faults aws`: the flag exists, and checks its value
    case("amibake local up --faults bogus", "--faults: local_faults: no behaviour 'bogus'; use "
         "none, aws"),
    case("amibake local up --faults-seed x", "argument --faults-seed: invalid int value: 'x'"),
    # Issue 27: a mistyped command, choice or flag is answered with the one meant; names in any case.
    case("amibake biuld", "argument command: invalid choice: 'biuld'; did you mean build?"),
    case("amibake local upp", "argument local_command: invalid choice: 'upp'; did you mean up?"),
    case("amibake build --familly c7i", "unrecognized argument --familly; did you mean --family? "
         "(see `amibake build --help`)"),
    case("amibake build --family c7i --dryrun", "unrecognized argument --dryrun; did you mean "
         "--dry-run?"),
    case("amibake bake --tmpfs-reserve-mb-per-cpu 1", "unrecognized argument "
         "--tmpfs-reserve-mb-per-cpu; did you mean --tmpfs-reserve-mb-per-vcpu?"),
    case("amibake batch up --from-bakes", "unrecognized argument --from-bakes; did you mean "
         "--from-bake?"),
    # A missing subcommand stays the mistake, not the flags meant for it.
    case("amibake batch --from-bake", "the following arguments are required: batch_command"),
    case("amibake build --family C7II", "unknown family 'c7ii'; did you mean c7i"),
    case("amibake bake --family C7I,c7gg", "unknown family 'c7gg'; did you mean c7g"),
    case("amibake build --family c5a --recipe kernel", "unknown recipe 'kernel'; did you mean "
         "kernels?"),
    case("amibake completion", "the following arguments are required: shell"),
    case("amibake completion fish", "argument shell: invalid choice: 'fish' (choose from bash, "
         "zsh)"),
]  # fmt: skip

CONFIG = [
    config_env("AMIBAKE_CLOUD", "gcp", "cloud must be one of aws, local, got 'gcp'"),
    config_env("AMIBAKE_REGION", "mars", "region must be an AWS region code"),
    config_env("AMIBAKE_REGION", "", "region must be an AWS region code"),
    # Well-formed, and in no partition: botocore's "Unknown region", exit 1, no setting named.
    config_env("AMIBAKE_REGION", "zz-fake-9", "region zz-fake-9 is in no AWS partition"),
    # The AWS tools' region, below amibake's own: read (it was ignored), and said of itself.
    config_env("AWS_REGION", "zz-fake-9", "region zz-fake-9 is in no AWS partition"),
    config_env("AWS_DEFAULT_REGION", "mars", "region must be an AWS region code"),
    config_env("AMIBAKE_RETRY_MODE", "legacy", "retry_mode must be one of standard, adaptive"),
    config_env("AMIBAKE_MAX_ATTEMPTS", "0", "max_attempts must be between 1 and 50, got 0"),
    config_env(
        "AMIBAKE_INSTANCE_DEADLINE_MIN",
        "0",
        "instance_deadline_min must be minutes, 1 to 1440 (a day), got 0",
    ),
    config_env(
        "AMIBAKE_INSTANCE_DEADLINE_MIN",
        "1.5",
        "AMIBAKE_INSTANCE_DEADLINE_MIN: instance_deadline_min must be int",
    ),
    config_env("AMIBAKE_MAX_ATTEMPTS", "99", "max_attempts must be between 1 and 50, got 99"),
    config_env("AMIBAKE_MAX_ATTEMPTS", "1e3", "AMIBAKE_MAX_ATTEMPTS: max_attempts must be int"),
    config_env("AMIBAKE_MAX_ATTEMPTS", "2.5", "AMIBAKE_MAX_ATTEMPTS: max_attempts must be int"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "-1", "ssh_timeout_s must be a finite number above 0 "
               "and at most 86400, not -1"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "0", "ssh_timeout_s must be a finite number above 0"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "nan", "ssh_timeout_s must be a finite number above 0 "
               "and at most 86400, not nan"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "inf", "ssh_timeout_s must be a finite number above 0 "
               "and at most 86400, not inf"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "-inf", "ssh_timeout_s must be a finite number"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "1e400", "ssh_timeout_s must be a finite number"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "1e9", "ssh_timeout_s must be a finite number above 0 "
               "and at most 86400, not 1e+09: an instance that has not answered SSH in a day"),
    config_env("AMIBAKE_SSH_TIMEOUT_S", "fast", "AMIBAKE_SSH_TIMEOUT_S: ssh_timeout_s must be "
               "float, got 'fast'"),
    config_env("AMIBAKE_LOCAL_PORT", "0", "local_port must be a TCP port (1-65535), got 0"),
    config_env("AMIBAKE_LOCAL_PORT", "70000", "local_port must be a TCP port (1-65535)"),
    config_env("AMIBAKE_LOCAL_PORT", "x", "AMIBAKE_LOCAL_PORT: local_port must be int, got 'x'"),
    config_env("AMIBAKE_LOCAL_SSH_PORT", "-5", "local_ssh_port must be a TCP port"),
    config_env("AMIBAKE_LOCAL_IMDS_PORT", "65536", "local_imds_port must be a TCP port"),
    config_env("AMIBAKE_LOCAL_SUBNET", "10.0.0.0/8", "local_subnet must be a loopback network"),
    config_env("AMIBAKE_LOCAL_SUBNET", "127.0.0.1/32", "local_subnet must be a loopback network"),
    config_env("AMIBAKE_LOCAL_SUBNET", "garbage", "local_subnet must be a loopback network"),
    config_env("AMIBAKE_LOCAL_FAULTS", "bogus", "local_faults: no behaviour 'bogus'; use none"),
    config_env("AMIBAKE_LOCAL_FAULTS", "aws,-bogus", "local_faults: no behaviour 'bogus'"),
    config_env("AMIBAKE_LOCAL_FAULTS_SEED", "-1", "local_faults_seed must be an integer from 0 "
               "to 4294967295, not -1"),
    config_env("AMIBAKE_LOCAL_FAULTS_SEED", "99999999999", "local_faults_seed must be an integer "
               "from 0 to 4294967295, not 99999999999: a seed is 32 bits"),
    config_env("AMIBAKE_LOCAL_FAULTS_SEED", "x", "AMIBAKE_LOCAL_FAULTS_SEED: local_faults_seed "
               "must be int"),
    config_env("AMIBAKE_SPOT", "perhaps", "AMIBAKE_SPOT: spot must be bool, got 'perhaps'"),
    config_env("AMIBAKE_SSH_USER", "root; rm -rf /", "ssh_user must be a user name"),
    config_env("AMIBAKE_SSH_USER", "", "ssh_user must be a user name"),
    config_env("AMIBAKE_SSH_USER", "Ec2-User", "ssh_user must be a user name"),
    config_env("AMIBAKE_RESULTS_DIR", "{tmp}/a-file", "results_dir {tmp}/a-file is a file"),
    config_env("AMIBAKE_RESULTS_DIR", "", "AMIBAKE_RESULTS_DIR: results_dir must be Path"),
    # a pseudo-filesystem root's os.access passes: the journal's mkdir raised FileNotFoundError
    config_env("AMIBAKE_RESULTS_DIR", "/proc/amibake-x", "AMIBAKE_RESULTS_DIR: results_dir "
               "/proc/amibake-x is in /proc, the kernel's view of itself"),
    config_env("AMIBAKE_LOCAL_DIR", "{tmp}/a-file", "local_dir {tmp}/a-file is a file"),
    config_env("AMIBAKE_RECIPES_DIR", "{tmp}/nowhere", "recipes_dir {tmp}/nowhere does not exist"),
    config_env("AMIBAKE_RECIPES_DIR", "{tmp}/a-file", "recipes_dir {tmp}/a-file is a file"),
    config_env("AMIBAKE_ENDPOINT_URL", "localhost:5000", "endpoint_url must be an http:// or "
               "https:// URL, got 'localhost:5000'"),
    config_env("AMIBAKE_ENDPOINT_URL", "ftp://example.com", "endpoint_url must be an http://"),
    config_env("AMIBAKE_ENDPOINT_URL", "http://", "endpoint_url must be an http://"),
    config_env("AMIBAKE_LOCAL_CREDENTIALS", "no-colon", "local_credentials must be KEY_ID:SECRET"),
    config_env("AMIBAKE_LOCAL_CREDENTIALS", ":secret", "local_credentials must be KEY_ID:SECRET"),
    config_env("AMIBAKE_CONFIG", "{tmp}/missing.toml", "AMIBAKE_CONFIG names {tmp}/missing.toml, "
               "which does not exist"),
    case("fleet status", "{tmp}: cannot read the config file: Is a directory",
         env={"AMIBAKE_CONFIG": "{tmp}"}, id="env:AMIBAKE_CONFIG={tmp}"),
    config_env("AMIBAKE_REGOIN", "eu-west-1", "AMIBAKE_REGOIN is not a setting; did you mean "
               "AMIBAKE_REGION?"),
    config_env("AMIBAKE_SSH_TIMEOUT", "30", "AMIBAKE_SSH_TIMEOUT is not a setting; did you mean "
               "AMIBAKE_SSH_TIMEOUT_S?"),
    config_env("AMIBAKE_RESULT_DIR", "{tmp}", "AMIBAKE_RESULT_DIR is not a setting; did you mean"
               " AMIBAKE_RESULTS_DIR?"),
    case("fleet status", "{tmp}/other.toml:2: the config file is not UTF-8 text (byte 0xe9); "
         "save it as UTF-8", files={"other.toml": b'region = "eu-west-1"\n' + LATIN1},
         env={"AMIBAKE_CONFIG": "{tmp}/other.toml"}, id="env:AMIBAKE_CONFIG=latin-1"),
    case("amibake build --family c5a", "recipe '../x' is not a plain name",
         env={"AMIBAKE_RECIPE": "../x"}, id="env:AMIBAKE_RECIPE=../x"),
    case("amibake build --family c5a", "size 'huge' is not offered for c5a",
         env={"AMIBAKE_SIZE": "huge"}, id="env:AMIBAKE_SIZE=huge"),
    config_file(b'region = "eu-west-1"\n' + LATIN1, "amibake.toml:2: the config file is not "
                "UTF-8 text", "latin-1"),
    config_file("size = \n", "amibake.toml: Invalid value (at line 1", "syntax"),
    config_file('colud = "local"\n', "amibake.toml: unknown setting 'colud'; did you mean cloud?",
                "unknown"),
    config_file("ssh_timeout_s = nan\n", "amibake.toml: ssh_timeout_s must be a finite number above 0 and at "
                "most 86400, not nan", "ssh_timeout_s=nan"),
    config_file("ssh_timeout_s = inf\n", "amibake.toml: ssh_timeout_s must be a finite number",
                "ssh_timeout_s=inf"),
    config_file("ssh_timeout_s = -1\n", "amibake.toml: ssh_timeout_s must be a finite number",
                "ssh_timeout_s=-1"),
    config_file("ssh_timeout_s = true\n", "amibake.toml: ssh_timeout_s must be float, got True",
                "ssh_timeout_s=true"),
    config_file('ssh_timeout_s = "fast"\n', "amibake.toml: ssh_timeout_s must be float",
                "ssh_timeout_s=string"),
    config_file("max_attempts = 2.5\n", "amibake.toml: max_attempts must be int, got 2.5",
                "max_attempts=2.5"),
    config_file("max_attempts = inf\n", "amibake.toml: max_attempts must be int, got inf",
                "max_attempts=inf"),
    config_file("max_attempts = nan\n", "amibake.toml: max_attempts must be int, got nan",
                "max_attempts=nan"),
    config_file("local_port = true\n", "amibake.toml: local_port must be int, got True",
                "local_port=true"),
    config_file("region = 5\n", "amibake.toml: region must be str, got 5", "region=5"),
    config_file("results_dir = 5\n", "amibake.toml: results_dir must be Path, got 5",
                "results_dir=5"),
    config_file('results_dir = ""\n', "amibake.toml: results_dir must be Path, got ''",
                "results_dir=empty"),
    config_file('results_dir = "a\\u0000b"\n', "amibake.toml: results_dir must be Path",
                "results_dir=nul"),
    config_file('cloud = ["aws"]\n', "amibake.toml: cloud must be str, got ['aws']", "cloud=list"),
    config_env("AMIBAKE_SSH_ADDRESS", "elastic", "ssh_address must be one of public, private"),
    config_env("AMIBAKE_SUBNET_IDS", "subnet-1", "subnet_ids: 'subnet-1' is not an id like "
               "subnet-0123456789abcdef0"),
    config_env("AMIBAKE_SECURITY_GROUP_IDS", "sg-01234567", "security_group_ids needs subnet_ids"),
    case("amibake build --family c7i --subnet subnet-1 --dry-run",
         "--subnet: subnet_ids: 'subnet-1' is not an id like subnet-0123456789abcdef0"),
    case("fleet bench {tmp}/bench.toml --subnet sg-01234567",
         "--subnet: subnet_ids: 'sg-01234567' is not an id like subnet-0123456789abcdef0",
         files={"bench.toml": BENCH}),
    config_env("AMIBAKE_CLUOD", "local", "AMIBAKE_CLUOD is not a setting; did you mean "
               "AMIBAKE_CLOUD?"),
    # Every problem of every layer at once, on one line.
    case("fleet status", "amibake.toml: unknown setting 'regoin'; did you mean region?; "
         "AMIBAKE_MAX_ATTEMPTS: max_attempts must be int, got 'x'",
         files={"amibake.toml": 'regoin = "eu-west-1"\n'}, env={"AMIBAKE_MAX_ATTEMPTS": "x"},
         id="config:every-layer-at-once"),
    case("fleet status", "AMIBAKE_CONFIG names {tmp}/missing.toml, which does not exist; "
         "AMIBAKE_SPOT: spot must be bool", env={"AMIBAKE_CONFIG": "{tmp}/missing.toml",
         "AMIBAKE_SPOT": "perhaps"}, id="config:missing-file-and-env"),
    config_file('spot = "perhaps"\n', "amibake.toml: spot must be bool", "spot=perhaps"),
    config_file("local_faults_seed = -1\n", "amibake.toml: local_faults_seed must be an integer from 0",
                "local_faults_seed=-1"),
    case("amibake build --family c5a", "recipe '../x' is not a plain name",
         files={"amibake.toml": 'recipe = "../x"\n'}, id="amibake.toml:recipe=../x"),
]  # fmt: skip

PLAN = [
    case("fleet", "the following arguments are required: command"),
    case("fleet bogus", "argument command: invalid choice: 'bogus'"),
    case("fleet plan", "the following arguments are required: run, --work"),
    case("fleet plan last --work nan", "--work must be a finite number above 0, not nan"),
    case("fleet plan last --work inf", "--work must be a finite number above 0, not inf"),
    case("fleet plan last --work=-inf", "--work must be a finite number above 0, not -inf"),
    case("fleet plan last --work 1e400", "--work must be a finite number above 0, not inf"),
    case("fleet plan last --work 0", "--work must be a finite number above 0, not 0"),
    case("fleet plan last --work -5", "--work must be a finite number above 0, not -5"),
    case("fleet plan last --work abc", "argument --work: invalid float value: 'abc'"),
    case("fleet plan last --work 1 --instances 0", "--instances must be an integer from 1 to "
         "100000, not 0"),
    case("fleet plan last --work 1 --instances -1", "--instances must be an integer from 1"),
    case("fleet plan last --work 1 --instances 1e21", "argument --instances: invalid int value"),
    case("fleet plan last --work 1 --instances 1000000000000000000000", "--instances must be an "
         "integer from 1 to 100000, not 100... (22 digits): more than any account's EC2 quota"),
    case("fleet plan last --work 1 --budget nan", "--budget must be a finite number above 0, "
         "not nan"),
    case("fleet plan last --work 1 --budget 0", "--budget must be a finite number above 0"),
    case("fleet plan last --work 1 --budget inf", "--budget must be a finite number above 0"),
    case("fleet plan last --work 1 --deadline 4x", "--deadline '4x' is not a duration like 4h"),
    case("fleet plan last --work 1 --deadline 0h", "--deadline '0h' is not a duration like 4h"),
    case("fleet plan last --work 1 --deadline 4", "--deadline '4' is not a duration like 4h"),
    case("fleet plan last --work 1 --deadline=", "--deadline '' is not a duration like 4h"),
    case("fleet plan last --work 1 --deadline nan", "--deadline 'nan' is not a duration"),
    case("fleet plan last --work 1 --deadline 1e400h", "--deadline '1e400h' is not a duration"),
    case("fleet plan last --work 1 --deadline 9999999h", "--deadline '9999999h' is more than a "
         "year"),
    case("fleet plan nope --work 1", "no fleet run 'nope'"),
    case("fleet plan last --work 1", "no fleet runs yet"),
    case("fleet status nope", "no fleet run 'nope'"),
    case("fleet status last", "no fleet runs yet"),
    case("fleet kill", "the following arguments are required: run"),
    case("fleet kill nope", "no fleet run 'nope'"),
    case("fleet kill last", "no fleet runs yet"),
    case("fleet report nope", "no fleet run 'nope'"),
    case("fleet report last --prefer speed", "--prefer 'speed' is not one of time, cost"),
    case("fleet prices --type c5x.large", "no price for c5x.large"),
    case("fleet prices --family nope", "no instance type of family nope"),
    case("fleet prices --family ''", "--family lists nothing"),
    case("fleet bench --types c5a.large --command ''", "--command is empty"),
    case("fleet report last --current ''", "--current is empty"),  # it listed every type
    case("fleet prices --type c7i.large --family c7g", "none of --type c7i.large is of --family "
         "c7g"),  # c7g is in the snapshot: the filters have nothing in common
    case("fleet prices --region mars", "--region: region must be an AWS region code"),
    case("fleet bnech", "argument command: invalid choice: 'bnech'; did you mean bench?"),
    case("fleet plan last --wrok 1", "unrecognized argument --wrok; did you mean --work? (see "
         "`fleet plan --help`)"),
    case("fleet report last --nohtml", "unrecognized argument --nohtml; did you mean --no-html?"),
    case("fleet bench --types c5a.large --command true --replicas 3", "unrecognized argument "
         "--replicas; did you mean --replicates?"),
    case("fleet bench --types C5X.Large --command true", "--types: unknown instance type "
         "'c5x.large'"),
    case("fleet bench --families C7II --command true", "--families: unknown family 'c7ii'; did "
         "you mean c7i"),
    case("fleet prices --type C5X.LARGE", "no price for c5x.large"),
    case("fleet completion", "the following arguments are required: shell"),
    case("fleet completion tcsh", "argument shell: invalid choice: 'tcsh' (choose from bash, "
         "zsh)"),
]  # fmt: skip

BENCH_FLAGS = [
    case("fleet bench", "command line: types: name at least one instance type"),
    case("fleet bench --types '' --command true", "--types lists nothing: name at least one"),
    case("fleet bench --types ', ,' --command true", "--types lists nothing"),
    case("fleet bench --types c5a.large --recipe kernels --builds ''", "--builds lists nothing"),
    case("fleet bench --families '' --command true", "--families lists nothing"),
    case("fleet bench --types c5x.large --command true", "--types: unknown instance type "
         "'c5x.large'"),
    case("fleet bench --types c5a.huge --command true", "--types: unknown instance type "
         "'c5a.huge': c5a comes in large"),
    case("fleet bench --types g5.xlarg --command true", "--types: unknown instance type "
         "'g5.xlarg': EC2 has no such type; did you mean g5.xlarge"),
    case("fleet bench --types g5.xlarge --recipe kernels", "--types: g5.xlarge: family g5 is not "
         "in the build catalog (amibake/catalog/families.json)"),
    case("fleet bench --types c5a.large", "command line: recipe: give exactly one of recipe"),
    case("fleet bench --types c5a.large --command true --recipe kernels", "--recipe: give exactly "
         "one of recipe"),
    case("fleet bench --types c5a.large --recipe ../x", "--recipe: recipe '../x' is not a plain "
         "name"),
    case("fleet bench --types c5a.large --recipe /etc", "--recipe: recipe '/etc' is not a plain"),
    case("fleet bench --types c5a.large --recipe nope", "--recipe: unknown recipe 'nope'"),
    case("fleet bench --types c5a.large --command true --replicates 0", "--replicates: must be "
         "an integer from 1 to 1000, not 0"),
    case("fleet bench --types c5a.large --command true --replicates 99999999999999",
         "--replicates: must be an integer from 1 to 1000, not 99999999999999: a median's "
         "interval narrows"),
    case("fleet bench --types c5a.large --command true --replicates -1", "--replicates: must be"),
    case("fleet bench --types c5a.large --command true --replicates abc", "argument --replicates: "
         "invalid int value: 'abc'"),
    case("fleet bench --types c5a.large --command true --warmups -1", "--warmups: must be an "
         "integer from 0 to 100, not -1"),
    case("fleet bench --types c5a.large --command true --warmups 1000", "--warmups: must be an "
         "integer from 0 to 100, not 1000: a machine is warm"),
    case("fleet bench --types c5a.large --command true --concurrency 0", "--concurrency: must be "
         "an integer from 1 to 256, not 0"),
    case("fleet bench --types c5a.large --command true --concurrency 100000", "--concurrency: "
         "must be an integer from 1 to 256, not 100000: each type measured at once"),
    case("fleet bench --types c5a.large --command true --executor k8s", "--executor: 'k8s' is "
         "not one of ssh, batch"),
    case("fleet bench --types c5a.large --command true --metric-regex (", "--metric-regex: "
         "metric.pattern does not compile"),
    case("fleet bench --types c5a.large --command true --metric-regex x", "--metric-regex: "
         "metric.pattern needs exactly one (group)"),
    case("fleet bench --types c5a.large --command true --metric-regex '(a)(b)'",
         "--metric-regex: metric.pattern needs exactly one (group)"),
    case("fleet bench --types c5a.large --recipe kernels --builds fast", "--builds: must be a "
         "non-empty list of tuned, generic"),
    case("fleet bench --types c5a.large --command true --builds generic", "--builds: builds are "
         "for a recipe"),
    case("fleet bench --types c5a.large --recipe zstd --args=-T2", "--args: the command "
         "(bin/zstd -b{level} -i{seconds}) has no {args}"),
    case("fleet bench --families c7ii --command true", "--families: unknown family 'c7ii'"),
    case("fleet bench --families c5a --sizes huge --command true", "--sizes: c5a has no size "
         "'huge'"),
    case("fleet bench --types c5a.large --sizes xlarge --command true", "--sizes: sizes are of "
         "families"),
    case("fleet bench --resume nope", "no fleet run 'nope'"),
    # Issue 27: a spending cap is a finite amount above nothing.
    case("fleet bench --types c5a.large --command true --max-cost -1", "--max-cost: must be a "
         "finite number above 0 and at most 1e+06, not -1"),
    case("fleet bench --types c5a.large --command true --max-cost 0", "--max-cost: must be a "
         "finite number above 0"),
    case("fleet bench --types c5a.large --command true --max-cost nan", "--max-cost: must be a "
         "finite number above 0 and at most 1e+06, not nan"),
    case("fleet bench --types c5a.large --command true --max-cost inf", "--max-cost: must be a "
         "finite number above 0 and at most 1e+06, not inf"),
    case("fleet bench --types c5a.large --command true --max-cost 1e400", "--max-cost: must be a "
         "finite number above 0 and at most 1e+06, not inf"),
    case("fleet bench --types c5a.large --command true --max-cost ten", "argument --max-cost: "
         "invalid float value: 'ten'"),
    case("fleet bench --types c5a.large --command true --executor batch --max-cost 5",
         "--max-cost: caps runs on the ssh executor only"),
    case("fleet bench --resume fb-0 --replicates 5 --on-demand", "--resume RUN takes the run's "
         "own plan: drop --replicates, --on-demand"),
    case("fleet bench {tmp}/missing.toml", "{tmp}/missing.toml: cannot read the bench file: No "
         "such file or directory"),
    case("fleet bench {tmp}", "{tmp}: cannot read the bench file: Is a directory"),
    case("fleet bench --types c5a.large --recipe trivial", "--recipe: {tmp}/recipes/trivial/"
         "recipe.toml has no [bench] command",
         files={"recipes/trivial/recipe.toml": (RECIPES / "trivial/recipe.toml").read_text()},
         env={"AMIBAKE_RECIPES_DIR": "{tmp}/recipes"}),
]  # fmt: skip

# What each bench file row's error starts with, after "{tmp}/bench.toml".
BENCH_FILE_ERRORS = {
    "latin-1": ":3: the bench file is not UTF-8 text (byte 0xe9); save it as UTF-8",
    "syntax": ": Expected ']' at the end of a table declaration (at line 3",
    "unknown-key": ":3: unknown key 'replicate'; did you mean replicates",
    "max_usd": ":3: unknown key 'max_usd'; did you mean max_cost?; known: ",
    "replicates=huge": ":3: replicates: must be an integer from 1 to 1000, not 99999999999999: "
    "a median's interval narrows as 1/sqrt(n)",
    "replicates=1.5": ":3: replicates: must be an integer from 1 to 1000, not 1.5",
    "replicates=true": ":3: replicates: must be an integer from 1 to 1000, not True",
    "replicates=string": ":3: replicates: must be an integer from 1 to 1000, not '3'",
    "replicates=0": ":3: replicates: must be an integer from 1 to 1000, not 0",
    "replicates=nan": ":3: replicates: must be an integer from 1 to 1000, not nan",
    "warmups=-1": ":3: warmups: must be an integer from 0 to 100, not -1",
    "warmups=1000": ":3: warmups: must be an integer from 0 to 100, not 1000",
    "concurrency=0": ":3: concurrency: must be an integer from 1 to 256, not 0",
    "concurrency=99999": ":3: concurrency: must be an integer from 1 to 256, not 99999",
    "timeout_s=nan": ":3: timeout_s: must be a finite number above 0 and at most 604800, not nan",
    "timeout_s=inf": ":3: timeout_s: must be a finite number above 0 and at most 604800, not inf",
    "timeout_s=-inf": ":3: timeout_s: must be a finite number above 0 and at most 604800, not -inf",
    "timeout_s=-1": ":3: timeout_s: must be a finite number above 0 and at most 604800, not -1",
    "timeout_s=0": ":3: timeout_s: must be a finite number above 0 and at most 604800, not 0",
    "timeout_s=string": ":3: timeout_s: must be a finite number above 0 and at most 604800, not "
    "'1h'",
    "timeout_s=1e9": ":3: timeout_s: must be a finite number above 0 and at most 604800, not "
    "1e+09: a replicate running for a week is stuck",
    "timeout_s=true": ":3: timeout_s: must be a finite number above 0 and at most 604800, not True",
    "spot=string": ":3: spot: must be true or false",
    "monitor=1": ":3: monitor: must be true or false",
    "allow_missing_price=string": ":3: allow_missing_price: must be true or false",
    "types=string": ":1: types: must be a list of instance types",
    "types=number": ":1: types: must be a list of instance types",
    "types=unknown-size": ":1: types: unknown instance type 'c5a.nano': c5a comes in large",
    "families=string": ":1: families: families and sizes must be lists",
    "builds=empty": ":3: builds: must be a non-empty list of tuned, generic",
    "metric.kind": ":3: metric: metric.kind 'bogus' is not one of runtime, regex, file",
    "metric.pattern": ":3: metric: metric.pattern does not compile",
    "metric.meaning": ":3: metric: metric.meaning must be rate or seconds",
    "metric.aggregate": ":3: metric: metric.aggregate 'max' is not one of geomean",
    "metric=5": ":3: metric: must be a table",
    "metric-key": ":3: metric: unknown key 'agregate'; did you mean aggregate",
    "command=list": ':2: command: must be a string, e.g. command = "my-app {args}"',
    "args=5": ":3: args: args must be a string or a table",
    "executor": ":3: executor: 'k8s' is not one of ssh, batch",
    "name=date": ":3: name: must be a string (quoted), not datetime.date(2024, 1, 1)",
    "args.threads=nan": ":3: args: args.threads is nan, not a finite number",
    "args.scale=-inf": ":3: args: args.scale is -inf, not a finite number",
    "args.key;": ":3: args: args: 'x; id' is not a flag name (letters, digits, - and _)",
    "args.x=table": ":3: args: args.x is {'b': 1}: give a string or a number",
    "recipe=../x": ":2: recipe: recipe '../x' is not a plain name",
    "recipe=/etc": ":2: recipe: recipe '/etc' is not a plain name",
    "recipe-and-command": ":3: recipe: give exactly one of recipe (a build recipe) or command",
    "expected_runtime=soon": ":3: expected_runtime: 'soon' is not a duration like 90s, 5m or 1.5h",
    "expected_runtime=5": ":3: expected_runtime: 5 is not a duration like 90s, 5m or 1.5h",
    "expected_runtime=0m": ":3: expected_runtime: '0m' is not a duration like 90s, 5m or 1.5h",
    "expected_runtime=-5m": ":3: expected_runtime: '-5m' is not a duration like 90s",
    "expected_runtime=1e9h": ":3: expected_runtime: '1e9h' is not a duration like 90s",
    "expected_runtime=9999h": ":3: expected_runtime: '9999h' is more than a week",
    "max_cost=nan": ":3: max_cost: must be a finite number above 0 and at most 1e+06, not nan",
    "max_cost=-inf": ":3: max_cost: must be a finite number above 0 and at most 1e+06, not -inf",
    "max_cost=string": ":3: max_cost: must be a finite number above 0 and at most 1e+06, not '5'",
    "max_cost=1e9": ":3: max_cost: must be a finite number above 0 and at most 1e+06, not 1e+09: "
    "a cap is for what you mean to spend",
    "unit=5": ':3: unit: must name one unit of work, e.g. unit = "frames"',
    "unit=empty": ':3: unit: must name one unit of work, e.g. unit = "frames"',
}

BENCH_FILES = [
    bench_file(BENCH.encode() + LATIN1, "latin-1"),
    bench_file(BENCH + "[metric\n", "syntax"),
    bench_file(BENCH + "replicate = 3\n", "unknown-key"),
    bench_file(BENCH + "max_usd = 3\n", "max_usd"),  # tune files' name for max_cost
    bench_file(BENCH + "replicates = 99999999999999\n", "replicates=huge"),
    bench_file(BENCH + "replicates = 1.5\n", "replicates=1.5"),
    bench_file(BENCH + "replicates = true\n", "replicates=true"),
    bench_file(BENCH + 'replicates = "3"\n', "replicates=string"),
    bench_file(BENCH + "replicates = 0\n", "replicates=0"),
    bench_file(BENCH + "replicates = nan\n", "replicates=nan"),
    bench_file(BENCH + "warmups = -1\n", "warmups=-1"),
    bench_file(BENCH + "warmups = 1000\n", "warmups=1000"),
    bench_file(BENCH + "concurrency = 0\n", "concurrency=0"),
    bench_file(BENCH + "concurrency = 99999\n", "concurrency=99999"),
    bench_file(BENCH + "timeout_s = nan\n", "timeout_s=nan"),
    bench_file(BENCH + "timeout_s = inf\n", "timeout_s=inf"),
    bench_file(BENCH + "timeout_s = -inf\n", "timeout_s=-inf"),
    bench_file(BENCH + "timeout_s = -1\n", "timeout_s=-1"),
    bench_file(BENCH + "timeout_s = 0\n", "timeout_s=0"),
    bench_file(BENCH + 'timeout_s = "1h"\n', "timeout_s=string"),
    bench_file(BENCH + "timeout_s = 1e9\n", "timeout_s=1e9"),
    bench_file(BENCH + "timeout_s = true\n", "timeout_s=true"),
    bench_file(BENCH + 'spot = "yes"\n', "spot=string"),
    bench_file(BENCH + "monitor = 1\n", "monitor=1"),
    bench_file(BENCH + 'allow_missing_price = "no"\n', "allow_missing_price=string"),
    bench_file('types = "c5a.large"\ncommand = "true"\n', "types=string"),
    bench_file('types = [1]\ncommand = "true"\n', "types=number"),
    bench_file('types = ["c5a.nano"]\ncommand = "true"\n', "types=unknown-size"),
    bench_file('families = "c5a"\ncommand = "true"\n', "families=string"),
    bench_file('types = ["c5a.large"]\nrecipe = "kernels"\nbuilds = []\n', "builds=empty"),
    bench_file(BENCH + '[metric]\nkind = "bogus"\n', "metric.kind"),
    bench_file('types = ["c5a.large"]\ncommand = ["echo"]\n', "command=list"),
    bench_file(BENCH + '[metric]\nkind = "regex"\npattern = "t=(.+)"\nagregate = "sum"\n',
               "metric-key"),
    bench_file(BENCH + '[metric]\nkind = "regex"\npattern = "("\n', "metric.pattern"),
    bench_file(BENCH + '[metric]\nkind = "regex"\npattern = "(x)"\nmeaning = "speed"\n',
               "metric.meaning"),
    bench_file(BENCH + '[metric]\nkind = "regex"\npattern = "(x)"\naggregate = "max"\n',
               "metric.aggregate"),
    bench_file(BENCH + "metric = 5\n", "metric=5"),
    bench_file(BENCH + "args = 5\n", "args=5"),
    bench_file(BENCH + 'executor = "k8s"\n', "executor"),
    bench_file(BENCH + "name = 2024-01-01\n", "name=date"),
    bench_file(BENCH + "[args]\nthreads = nan\n", "args.threads=nan"),
    bench_file(BENCH + "[args]\nscale = -inf\n", "args.scale=-inf"),
    bench_file(BENCH + '[args]\n"x; id" = 1\n', "args.key;"),
    bench_file(BENCH + "[args]\nx = {b = 1}\n", "args.x=table"),
    bench_file('types = ["c5a.large"]\nrecipe = "../x"\n', "recipe=../x"),
    bench_file('types = ["c5a.large"]\nrecipe = "/etc"\n', "recipe=/etc"),
    bench_file(BENCH + 'recipe = "kernels"\n', "recipe-and-command"),
    bench_file(BENCH + 'expected_runtime = "soon"\n', "expected_runtime=soon"),
    bench_file(BENCH + "expected_runtime = 5\n", "expected_runtime=5"),
    bench_file(BENCH + 'expected_runtime = "0m"\n', "expected_runtime=0m"),
    bench_file(BENCH + 'expected_runtime = "-5m"\n', "expected_runtime=-5m"),
    bench_file(BENCH + 'expected_runtime = "1e9h"\n', "expected_runtime=1e9h"),
    bench_file(BENCH + 'expected_runtime = "9999h"\n', "expected_runtime=9999h"),
    bench_file(BENCH + "max_cost = nan\n", "max_cost=nan"),
    bench_file(BENCH + "max_cost = -inf\n", "max_cost=-inf"),
    bench_file(BENCH + 'max_cost = "5"\n', "max_cost=string"),
    bench_file(BENCH + "max_cost = 1e9\n", "max_cost=1e9"),
    bench_file(BENCH + "unit = 5\n", "unit=5"),
    bench_file(BENCH + 'unit = " "\n', "unit=empty"),
]  # fmt: skip
TUNE_FLAGS = [
    case("fleet tune", "fleet tune needs a tune file (or compare, or --resume RUN)"),
    case("fleet tune {tmp}/missing.toml", "{tmp}/missing.toml: cannot read the tune file"),
    case("fleet tune {tmp}", "{tmp}: cannot read the tune file: Is a directory"),
]
for flags, start in (
    ("--trials 0", "--trials: must be an integer from 1 to 10000, not 0"),
    ("--trials 99999999999999", "--trials: must be an integer from 1 to 10000, not "
     "99999999999999: every trial is built and measured"),
    ("--trials x", "argument --trials: invalid int value: 'x'"),
    ("--parallel 0", "--parallel: must be an integer from 1 to 256, not 0"),
    ("--parallel 100000", "--parallel: must be an integer from 1 to 256, not 100000"),
    ("--seed -1", "--seed: must be an integer from 0 to 4294967295, not -1"),
    ("--seed 99999999999", "--seed: must be an integer from 0 to 4294967295, not 99999999999: "
     "a seed is 32 bits"),
    ("--startup-trials -1", "--startup-trials: must be an integer from 0 to 10000, not -1"),
    ("--startup-trials 99999999", "--startup-trials: must be an integer from 0 to 10000"),
    ("--algorithm bogus", "--algorithm: 'bogus' is not one of"),
    ("--replay {tmp}/missing.csv", "{tmp}/missing.csv: cannot read the replay table: No such"),
    ("--max-cost nan", "--max-cost: must be a finite number above 0, not nan"),
    ("--max-cost -1", "--max-cost: must be a finite number above 0, not -1"),
    ("--max-cost inf", "--max-cost: must be a finite number above 0, not inf"),
):  # fmt: skip
    TUNE_FLAGS.append(
        case(f"fleet tune {{tmp}}/tune.toml {flags}", start, files={"tune.toml": TUNE, **TABLE})
    )
TUNE_FLAGS += [
    case("fleet tune --resume nope", "no fleet run 'nope'"),
    case("fleet tune --resume ft-0 --seed 1", "no fleet run 'ft-0'"),
]

TUNE_FILES = [
    tune_file(TUNE.encode() + LATIN1, "{tmp}/tune.toml:7: the tune file is not UTF-8 text",
              "latin-1"),
    tune_file(TUNE + "[params\n", "{tmp}/tune.toml: Expected ']' at the end of a table",
              "syntax"),
    tune_file(TUNE_HEAD + 'algorithm = "tp"\n' + PARAM_A, "{tmp}/tune.toml:3: algorithm: 'tp' is "
              "not one of auto, forest, gp, blend, tpe, random, grid; did you mean tpe", "algorithm"),
    tune_file(TUNE_HEAD + "trails = 3\n" + PARAM_A, "{tmp}/tune.toml:3: trails: unknown key; did "
              "you mean trials, ", "unknown-key"),
    tune_file('replay = "{tmp}/t.csv"\nobjective = "speed"\n' + PARAM_A, "{tmp}/tune.toml:2: objective: "
              "'speed' is not one of runtime", "objective"),
    tune_file(TUNE_HEAD + 'algorithm = "bogus"\n' + PARAM_A, "{tmp}/tune.toml:3: algorithm: "
              "'bogus' is not one of", "algorithm"),
    tune_file(TUNE_HEAD + "trials = 0\n" + PARAM_A, "{tmp}/tune.toml:3: trials: must be an "
              "integer from 1 to 10000, not 0", "trials=0"),
    tune_file(TUNE_HEAD + "trials = 99999999999999\n" + PARAM_A, "{tmp}/tune.toml:3: trials: "
              "must be an integer from 1 to 10000, not 99999999999999", "trials=huge"),
    tune_file(TUNE_HEAD + "trials = 2.5\n" + PARAM_A, "{tmp}/tune.toml:3: trials: must be an "
              "integer from 1 to 10000, not 2.5", "trials=2.5"),
    tune_file(TUNE_HEAD + "trials = true\n" + PARAM_A, "{tmp}/tune.toml:3: trials: must be an "
              "integer from 1 to 10000, not True", "trials=true"),
    tune_file(TUNE_HEAD + "trials = inf\n" + PARAM_A, "{tmp}/tune.toml:3: trials: must be an "
              "integer from 1 to 10000, not inf", "trials=inf"),
    tune_file(TUNE_HEAD + "parallel = 0\n" + PARAM_A, "{tmp}/tune.toml:3: parallel: must be an "
              "integer from 1 to 256", "parallel=0"),
    tune_file(TUNE_HEAD + "parallel = 1000\n" + PARAM_A, "{tmp}/tune.toml:3: parallel: must be "
              "an integer from 1 to 256, not 1000", "parallel=1000"),
    tune_file(TUNE_HEAD + "replicates = 99999\n" + PARAM_A, "{tmp}/tune.toml:3: replicates: "
              "must be an integer from 1 to 1000, not 99999", "replicates=99999"),
    tune_file(TUNE_HEAD + "seed = -1\n" + PARAM_A, "{tmp}/tune.toml:3: seed: must be an integer "
              "from 0 to 4294967295, not -1", "seed=-1"),
    tune_file(TUNE_HEAD + "seed = 4294967296\n" + PARAM_A, "{tmp}/tune.toml:3: seed: must be an "
              "integer from 0 to 4294967295, not 4294967296: a seed is 32 bits", "seed=2**32"),
    tune_file(TUNE_HEAD + "startup_trials = -1\n" + PARAM_A, "{tmp}/tune.toml:3: startup_trials:"
              " must be an integer from 0 to 10000, not -1", "startup_trials=-1"),
    tune_file(TUNE_HEAD + "startup_trials = 1e6\n" + PARAM_A, "{tmp}/tune.toml:3: "
              "startup_trials: must be an integer from 0 to 10000, not 1000000.0",
              "startup_trials=1e6"),
    tune_file(TUNE_HEAD + "max_usd = nan\n" + PARAM_A, "{tmp}/tune.toml:3: max_usd: must be a "
              "finite number above 0, not nan (leave it out for no limit)", "max_usd=nan"),
    tune_file(TUNE_HEAD + "max_usd = inf\n" + PARAM_A, "{tmp}/tune.toml:3: max_usd: must be a "
              "finite number above 0, not inf", "max_usd=inf"),
    tune_file(TUNE_HEAD + "max_usd = -1\n" + PARAM_A, "{tmp}/tune.toml:3: max_usd: must be a "
              "finite number above 0, not -1", "max_usd=-1"),
    tune_file(TUNE_HEAD + 'max_usd = "ten"\n' + PARAM_A, "{tmp}/tune.toml:3: max_usd: must be a "
              "finite number above 0, not 'ten'", "max_usd=string"),
    tune_file(TUNE_HEAD + "max_cost = nan\n" + PARAM_A, "{tmp}/tune.toml:3: max_cost: must be a "
              "finite number above 0, not nan (leave it out for no limit)", "max_cost=nan"),
    tune_file(TUNE_HEAD + "max_cost = 2\nmax_usd = 3\n" + PARAM_A, "{tmp}/tune.toml:3: max_cost:"
              " is max_usd by another name: give one of them", "max_cost+max_usd"),
    tune_file(TUNE_HEAD + 'expected_runtime = "later"\n' + PARAM_A, "{tmp}/tune.toml:3: "
              "expected_runtime: 'later' is not a duration like 90s, 5m or 1.5h",
              "expected_runtime=later"),
    tune_file(TUNE_HEAD + "max_hours = nan\n" + PARAM_A, "{tmp}/tune.toml:3: max_hours: must be "
              "a finite number above 0 and at most 8784, not nan", "max_hours=nan"),
    tune_file(TUNE_HEAD + "max_hours = 1e9\n" + PARAM_A, "{tmp}/tune.toml:3: max_hours: must be "
              "a finite number above 0 and at most 8784, not 1e+09: over a year",
              "max_hours=1e9"),
    tune_file(TUNE_HEAD + "constraints = 5\n" + PARAM_A, "{tmp}/tune.toml:3: constraints: a "
              "table of max_seconds", "constraints=5"),
    tune_file(TUNE + "[constraints]\nmax_speed = 1\n", "{tmp}/tune.toml:8: max_speed: unknown "
              "constraint; did you mean max_seconds", "constraints.unknown"),
    tune_file(TUNE + "[constraints]\nmax_seconds = nan\n", "{tmp}/tune.toml:8: max_seconds: must"
              " be a finite number above 0, not nan", "max_seconds=nan"),
    tune_file(TUNE + "[constraints]\nmax_seconds = inf\n", "{tmp}/tune.toml:8: max_seconds: must"
              " be a finite number above 0, not inf", "max_seconds=inf"),
    tune_file(TUNE + "[constraints]\nmin_rate = -1\n", "{tmp}/tune.toml:8: min_rate: must be a "
              "finite number above 0, not -1", "min_rate=-1"),
    tune_file('replay = 5\nobjective = "metric"\n' + PARAM_A, "{tmp}/tune.toml:1: replay: must "
              "be the path of a CSV table, not 5", "replay=5"),
    tune_file('replay = "{tmp}/nope.csv"\nobjective = "metric"\n' + PARAM_A, "{tmp}/nope.csv: "
              "cannot read the replay table: No such file or directory", "replay=missing"),
    tune_file(TUNE, "{tmp}/t.csv:3: the replay table is not UTF-8 text (byte 0xe9)",
              "table=latin-1", table=b"a,metric\n1,3\n2,2\xe9\n"),
    tune_file(TUNE, "{tmp}/t.csv:3: metric '-inf' is not a finite number", "table:metric=-inf",
              table="a,metric\n1,3\n2,-inf\n3,1\n"),
    tune_file(TUNE, "{tmp}/t.csv:2: metric 'nan' is not a finite number", "table:metric=nan",
              table="a,metric\n1,nan\n2,2\n3,1\n"),
    tune_file(TUNE, "{tmp}/t.csv:4: metric 'inf' is not a finite number", "table:metric=inf",
              table="a,metric\n1,3\n2,2\n3,inf\n"),
    tune_file(TUNE, "{tmp}/t.csv:2: metric 'inf' is not a finite number", "table:metric=1e400",
              table="a,metric\n1,1e400\n2,2\n3,1\n"),
    tune_file(TUNE, "{tmp}/t.csv:3: metric 'fast' is not a number", "table:metric=fast",
              table="a,metric\n1,3\n2,fast\n3,1\n"),
    tune_file(TUNE_HEAD + "replay_column = 5\n" + PARAM_A, "{tmp}/tune.toml:3: replay_column: "
              "must be the name of a column", "replay_column=5"),
    tune_file(TUNE_HEAD + 'replay_column = "speed"\n' + PARAM_A, "{tmp}/t.csv:1: the replay "
              "table has no column speed", "replay_column=missing"),
    tune_file('types = "c5a.large"\n' + TUNE, "{tmp}/tune.toml:1: types: must be a list of "
              "instance types", "types=string"),
    tune_file('types = ["c5a.nano"]\n' + TUNE, "{tmp}/tune.toml:1: types: unknown instance type "
              "'c5a.nano'", "types=unknown"),
    tune_file(TUNE_HEAD + 'executor = "k8s"\n' + PARAM_A, "{tmp}/tune.toml:3: executor: 'k8s' "
              "is not one of ssh, batch", "executor"),
    tune_file('types = ["c5a.large"]\n' + PARAM_A, "{tmp}/tune.toml: recipe: name the recipe to "
              "tune", "no-recipe-no-replay"),
    tune_file('recipe = "../x"\ntypes = ["c5a.large"]\n' + PARAM_A, "{tmp}/tune.toml:1: recipe: "
              "recipe '../x' is not a plain name", "recipe=../x"),
    tune_file('recipe = "/etc"\ntypes = ["c5a.large"]\n' + PARAM_A, "{tmp}/tune.toml:1: recipe: "
              "recipe '/etc' is not a plain name", "recipe=/etc"),
    # What the evaluator finds wrong with what the file names, said of the file and line (as
    # params.NAME's below): it named neither.
    tune_file('recipe = "nosuch"\ntypes = ["c5a.large"]\n' + PARAM_A, "{tmp}/tune.toml:1: "
              "unknown recipe 'nosuch'; known: kernels, zstd", "recipe=nosuch"),
    tune_file(KERNELS + 'command = "echo"\n' + PARAM_A, "{tmp}/tune.toml:3: command: is for an "
              "image's tune (image = ...); drop it, or name the image", "recipe-and-command"),
    tune_file(KERNELS + 'gpus = 4\n' + PARAM_A, "{tmp}/tune.toml:3: gpus: is for an image's "
              "tune", "recipe-and-gpus"),
    tune_file(KERNELS + 'recipe_dir = "/"\n' + PARAM_A, "{tmp}/tune.toml:3: recipe_dir: unknown "
              "key", "recipe_dir"),
]  # fmt: skip


def param(body: str, start: str, id: str, head: str = TUNE_HEAD) -> Any:
    """A tune file whose parameter a is `body`; the error is said of params.a at its line."""
    return tune_file(head + "[params.a]\n" + body, start, f"params:{id}")


PARAMS = [
    tune_file(TUNE_HEAD, "{tmp}/tune.toml: the search space is empty", "params:none"),
    tune_file(TUNE_HEAD + "[params]\na = 5\n", "{tmp}/tune.toml:4: params.a: must be a table",
              "params:not-a-table"),
    param('kind = "normal"\n', "{tmp}/tune.toml:3: params.a: unknown kind 'normal'", "kind"),
    # Into the instance's shell as written (a build's CFLAGS="...", as root; a replicate's
    # command line): a value, a flag template or a name a shell reads ran there as a command.
    param('kind = "categorical"\nvalues = ["-O2", "-O2; touch /tmp/pwned"]\nstage = "compile"\n',
          "{tmp}/tune.toml:3: params.a: values: '-O2;' has a character", "value;"),
    param('kind = "categorical"\nvalues = ["$(id)"]\n', "{tmp}/tune.toml:3: params.a: values: "
          "'$(id)' has a character the instance's shell reads", "value$("),
    param('kind = "int"\nlow = 1\nhigh = 3\narg = "--n {} `id`"\n', "{tmp}/tune.toml:3: params.a: "
          "arg: '`id`' has a character", "arg`"),
    tune_file(TUNE_HEAD + '[params."a;id"]\nkind = "int"\nlow = 1\nhigh = 3\n', "{tmp}/tune.toml: "
              "params.a;id: a parameter's name is letters, digits, - and _", "name;"),
    param('kind = "int"\nlow = 1\nhigh = 3\nflg = "-x{}"\n', "{tmp}/tune.toml:3: params.a: "
          "unknown key 'flg'; did you mean flag?; known: kind, values", "unknown-key"),
    param('kind = "int"\nlow = 1\nhigh = 3\nstage = "link"\n', "{tmp}/tune.toml:3: params.a: "
          "stage 'link' is not compile or run", "stage"),
    param('kind = "int"\nlow = 1\nhigh = 3\nflag = "-x={}"\n', "{tmp}/tune.toml:3: params.a: "
          "flag is for compile-stage parameters (a build flag); a run parameter is passed by arg",
          "flag-on-run"),
    param('kind = "int"\nlow = 1\nhigh = 3\nstage = "run"\nflag = "-x={}"\n', "{tmp}/tune.toml:3:"
          " params.a: flag is for compile-stage parameters", "flag-on-run-stated"),
    param('kind = "int"\nlow = 1\nhigh = 3\nstage = "compile"\narg = "--a {}"\n',
          "{tmp}/tune.toml:3: params.a: arg is for run-stage parameters", "arg-on-compile"),
    param('kind = "int"\nlow = 1\nhigh = 3\nstage = "compile"\nflag = 5\n', "{tmp}/tune.toml:3: "
          "params.a: flag must be a string", "flag=5"),
    param('kind = "categorical"\nvalues = []\n', "{tmp}/tune.toml:3: params.a: a categorical "
          "parameter needs a non-empty list of values", "values=empty"),
    param('kind = "categorical"\nvalues = "abc"\n', "{tmp}/tune.toml:3: params.a: a categorical "
          "parameter needs a non-empty list of values", "values=string"),
    param('kind = "categorical"\nvalues = [1, 1]\n', "{tmp}/tune.toml:3: params.a: values repeat",
          "values-repeat"),
    param('kind = "categorical"\nvalues = [1.0, nan]\n', "{tmp}/tune.toml:3: params.a: values: "
          "nan is not a finite number", "values-nan"),
    param('kind = "categorical"\nvalues = [1, {x = 1}]\n', "{tmp}/tune.toml:3: params.a: values:"
          " {'x': 1} is not a string or a number", "values-table"),
    param('kind = "int"\nvalues = [1, 2]\n', "{tmp}/tune.toml:3: params.a: int takes low and "
          "high, not values", "int-values"),
    param('kind = "int"\nlow = 5\nhigh = 1\n', "{tmp}/tune.toml:3: params.a: low 5 is above high "
          "1: the range is empty", "low>high"),
    param('kind = "int"\nlow = 1\nhigh = 3\nstep = 0\n', "{tmp}/tune.toml:3: params.a: int needs"
          " integer low, high and a step of at least 1", "step=0"),
    param('kind = "int"\nlow = 1\nhigh = 3\nstep = 1.5\n', "{tmp}/tune.toml:3: params.a: int "
          "needs integer low, high", "step=1.5"),
    param('kind = "int"\nlow = 1\nhigh = 3\nstep = nan\n', "{tmp}/tune.toml:3: params.a: int "
          "needs integer low, high", "step=nan"),
    param('kind = "int"\nlow = 1.5\nhigh = 3\n', "{tmp}/tune.toml:3: params.a: int needs integer"
          " low, high", "low=1.5"),
    param('kind = "int"\nlow = nan\nhigh = 3\n', "{tmp}/tune.toml:3: params.a: int needs numbers "
          "low and high: low must be a finite number, not nan", "low=nan"),
    param('kind = "int"\nlow = 1\nhigh = inf\n', "{tmp}/tune.toml:3: params.a: int needs numbers "
          "low and high: high must be a finite number, not inf", "high=inf"),
    param('kind = "int"\nlow = "1"\nhigh = 3\n', "{tmp}/tune.toml:3: params.a: int needs numbers "
          "low and high: low must be a finite number, not '1'", "low=string"),
    param('kind = "int"\nhigh = 3\n', "{tmp}/tune.toml:3: params.a: int needs numbers low and "
          "high: low must be a finite number, not None", "low-missing"),
    param('kind = "int"\nlow = 1\nhigh = 1000000000000000000\n', "{tmp}/tune.toml:3: params.a: "
          "1000000000000000000 values is more than 10000", "int-huge-range"),
    param('kind = "uniform"\nlow = nan\nhigh = 1\n', "{tmp}/tune.toml:3: params.a: uniform needs "
          "numbers low and high: low must be a finite number, not nan", "uniform-low=nan"),
    param('kind = "uniform"\nlow = -inf\nhigh = 1\n', "{tmp}/tune.toml:3: params.a: uniform needs"
          " numbers low and high: low must be a finite number, not -inf", "uniform-low=-inf"),
    param('kind = "uniform"\nlow = 0\nhigh = 1\nstep = 0.1\n', "{tmp}/tune.toml:3: params.a: "
          "step is for int parameters", "uniform-step"),
    param('kind = "loguniform"\nlow = 0\nhigh = 1\n', "{tmp}/tune.toml:3: params.a: loguniform "
          "needs low above 0", "loguniform-low=0"),
    param('kind = "uniform"\nlow = 1\nhigh = 3\n', "{tmp}/t.csv: a replay table holds "
          "configurations, not ranges: a is continuous", "uniform-on-a-table"),
    param('kind = "int"\nlow = 1\nhigh = 3\nwhen = 5\n', "{tmp}/tune.toml:3: params.a: when must"
          " be a table", "when=5"),
    param('kind = "int"\nlow = 1\nhigh = 3\nwhen = { arch = "sparc" }\n', "{tmp}/tune.toml:3: "
          "params.a: when.arch 'sparc' is not x86_64 or arm64", "when.arch"),
    param('kind = "int"\nlow = 1\nhigh = 3\nwhen = { param = "zz", in = [1] }\n',
          "{tmp}/tune.toml:3: params.a: when names an unknown parameter 'zz'", "when.param"),
    param('kind = "int"\nlow = 1\nhigh = 3\nwhen = { param = "b", in = [9] }\n[params.b]\nkind ='
          ' "categorical"\nvalues = [1, 2]\n', "{tmp}/tune.toml:3: params.a: when.in has [9], not"
          " values of b", "when.in"),
    param('kind = "int"\nlow = 1\nhigh = 3\nwhen = { param = "b", in = [1] }\n[params.b]\nkind ='
          ' "int"\nlow = 1\nhigh = 2\n', "{tmp}/tune.toml:3: params.a: when needs b to be an "
          "unconditional categorical", "when-parent-int"),
    param('kind = "int"\nlow = 1\nhigh = 3\nwhen = { param = "b", in = "12" }\n[params.b]\nkind ='
          ' "categorical"\nvalues = [12, 2]\n', "{tmp}/tune.toml:3: params.a: when.in must be a "
          "list of values, not '12'", "when.in=string"),  # it said "when.in has ['1', '2']"
    param('kind = "int"\nlow = 1\nhigh = 3\nwhen = { arch = "x86_64", param = "b", in = [1] }\n',
          "{tmp}/tune.toml:3: params.a: when has arch, in, param: give { arch = ... } or",
          "when-arch-and-param"),  # the param was dropped without a word
    tune_file(TUNE + '[params.instance_type]\nkind = "categorical"\nvalues = ["c5a.large"]\n'
              'stage = "run"\n', "{tmp}/tune.toml:7: params.instance_type: the instance type is "
              "categorical, with values and no stage", "params:instance_type-stage"),
    tune_file(TUNE + '[params.instance_type]\nkind = "categorical"\nvalues = ["c5a.tiny"]\n',
              "{tmp}/tune.toml:7: params.instance_type: unknown instance type 'c5a.tiny'",
              "params:instance_type-unknown"),
]  # fmt: skip
# What the workload takes: kernels' [bench.parameters] declare threads, size and block as
# integers. Refused before the cloud or the prices are asked.
for body, start, name in (
    ('kind = "uniform"\nlow = 1\nhigh = 2\nstage = "run"\n', "params.threads: kernels's workload "
     'takes threads as an integer (its [bench.parameters] in {recipes}/kernels/recipe.toml); '
     'kind = "uniform" would pass it fractions such as 1.44: make it kind = "int"', "uniform"),
    ('kind = "loguniform"\nlow = 1\nhigh = 8\nstage = "run"\n', "params.threads: kernels's "
     "workload takes threads as an integer", "loguniform"),
    ('kind = "categorical"\nvalues = ["one", "two"]\nstage = "run"\n', "params.threads: kernels's"
     " workload takes threads as an integer", "categorical-words"),
    ('kind = "categorical"\nvalues = [1.5, 2.5]\nstage = "run"\n', "params.threads: kernels's "
     "workload takes threads as an integer", "categorical-fractions"),
):  # fmt: skip
    PARAMS.append(
        case("fleet tune {tmp}/tune.toml", "{tmp}/tune.toml:3: " + start, files={"tune.toml": KERNELS +
             f"[params.threads]\n{body}"}, id=f"tune:kernels-threads-{name}")
    )  # fmt: skip
PARAMS += [
    case("fleet tune {tmp}/tune.toml", "{tmp}/tune.toml:3: params.treads: kernels's workload "
         "takes no 'treads'",
         files={"tune.toml": KERNELS + '[params.treads]\nkind = "int"\nlow = 1\nhigh = 2\n'},
         id="tune:kernels-misspelt"),
    case("fleet tune {tmp}/tune.toml", "{tmp}/tune.toml:3: params.threads: zstd's bench "
         "command (bin/zstd "
         "-b{level} -i{seconds}) has no {args} to pass it",
         files={"tune.toml": 'recipe = "zstd"\ntypes = ["c5a.large"]\n[params.threads]\n'
                'kind = "int"\nlow = 1\nhigh = 2\n'}, id="tune:zstd-no-args"),
]  # fmt: skip

COMPARE = [
    case("fleet tune compare", "fleet tune compare needs --replay TABLE.csv"),
    # compare's flags given to a search were ignored: --budget 3 ran the file's trials
    case("fleet tune {tmp}/t.toml --budget 3", "--budget is for `fleet tune compare`, which "
         "compares searches on a table; a search of a tune file takes --trials"),
    case("fleet tune {tmp}/t.toml --replay-runs {tmp}/r.csv", "--replay-runs is for `fleet tune "
         "compare`"),
    case("fleet tune --resume ft-0000000000 --seeds 5", "--seeds is for `fleet tune compare`"),
    # ...and a search's flags given to compare, ignored: --dry-run wrote the whole comparison.
    case("fleet tune compare --replay {tmp}/t.csv --dry-run", "--dry-run is for a search of a "
         "tune file; `fleet tune compare` takes nothing: it creates nothing", files=TABLE),
    # A list flag given empty fell back to its default, as if it had not been given.
    case("fleet tune compare --replay {tmp}/t.csv --algorithms ''", "--algorithms lists nothing: "
         "name at least one", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --trials 3", "--trials is for a search of a "
         "tune file; `fleet tune compare` takes --budget", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --algorithm tpe", "--algorithm is for a search "
         "of a tune file; `fleet tune compare` takes --algorithms", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --max-cost 5", "--max-cost is for a search",
         files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --replay-runs {tmp}/t.csv", "--replay and "
         "--replay-runs: compare replays one table; give one of them", files=TABLE),
    case("fleet tune compare --replay {tmp}/missing.csv", "{tmp}/missing.csv: cannot read the "
         "replay table: No such file or directory"),
    case("fleet tune compare --replay {tmp}", "{tmp}: cannot read the replay table: Is a "
         "directory"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:3: the replay table is not UTF-8"
         " text (byte 0xe9)", files={"t.csv": b"a,metric\n1,3\n2,2\xe9\n"}, id="compare:latin-1"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv: cannot read the replay table: "
         "No columns to parse", files={"t.csv": ""}, id="compare:empty"),
    # a first row one field too wide was read with an index, every column shifted left
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:2: 4 fields where the header has"
         " 3 (threads, block, metric)", files={"t.csv": "threads,block,metric\n1,8,3,4\n2,8,5\n"
         "1,16,4\n"}, id="compare:ragged-first"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:3: 2 fields where the header has"
         " 3", files={"t.csv": "threads,block,metric\n1,8,3\n2,8\n"}, id="compare:short-row"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv: the replay table has a header "
         "(threads, metric) but no rows", files={"t.csv": "threads,metric\n"}, id="compare:no-rows"),
    case("fleet tune compare --replay {tmp}/t.csv --algorithms tp", "--algorithms: 'tp' is not "
         "one of auto, forest, gp, blend, tpe, random, grid; did you mean tpe", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:1: column 2 has no name", files={
         "t.csv": "threads,,metric\n1,8,3\n"}, id="compare:unnamed-column"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:1: the column threads appears "
         "twice", files={"t.csv": "threads,threads,metric\n1,8,3\n"}, id="compare:twice"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:3: metric '-inf' is not a finite"
         " number", files={"t.csv": "a,metric\n1,3\n2,-inf\n3,1\n"}, id="compare:-inf"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:4: metric 'nan' is not a finite"
         " number", files={"t.csv": "a,metric\n1,3\n2,2\n3,nan\n"}, id="compare:nan"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/t.csv:3: metric 'x' is not a number",
         files={"t.csv": "a,metric\n1,3\n2,x\n3,1\n"}, id="compare:not-a-number"),
    case("fleet tune compare --replay {tmp}/t.csv --budget 100000000", "--budget must be an "
         "integer from 1 to 10000, not 100000000: every trial", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --budget 4", "--budget 4 is more than the 3 "
         "configurations the table holds", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --budget 0", "--budget must be an integer from "
         "1 to 10000, not 0", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --seeds 0", "--seeds must be an integer from 1"
         " to 1000, not 0", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --seeds 100000", "--seeds must be an integer "
         "from 1 to 1000, not 100000: each seed is a whole search", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --startup-trials -1", "--startup-trials must "
         "be an integer from 0 to 10000, not -1", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --algorithms tpe,bogus", "--algorithms: "
         "'bogus' is not one of", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --objective-column speed", "{tmp}/t.csv:1: the"
         " replay table has no column speed", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --objective-column ''", "--objective-column is"
         " empty", files=TABLE),  # it fell back to metric
    case("fleet tune compare --replay {tmp}/t.csv --space {tmp}/space.toml --objective-column a",
         "--objective-column: 'a' is a parameter the search sets, not what it minimises",
         files={**TABLE, "space.toml": PARAM_A}, id="compare:objective-is-a-parameter"),
    case("fleet tune {tmp}/tune.toml", "{tmp}/tune.toml:3: replay_column: names a column of a "
         "replay table", files={"tune.toml": KERNELS + 'replay_column = "x"\n' + PARAM_A
                                .replace("high = 3\n", 'high = 3\nstage = "run"\n')},
         id="tune:replay-column-without-replay"),
    case("fleet tune compare --replay {tmp}/t.csv --space {tmp}/missing.toml", "{tmp}/missing"
         ".toml: cannot read the tune file", files=TABLE),
    case("fleet tune compare --replay {tmp}/t.csv --space {tmp}/space.toml", "{tmp}/space.toml:"
         "6: the tune file is not UTF-8 text", files={**TABLE, "space.toml": PARAM_A.encode() +
         b'objective = "metric"\n' + LATIN1}, id="compare:space-latin-1"),
    case("fleet tune compare --replay-runs {tmp}/missing.csv", "{tmp}/missing.csv: cannot read "
         "the replay table: No such file"),
    case("fleet tune compare --replay-runs {tmp}/runs.csv", "{tmp}/runs.csv:2: the replay table "
         "is not UTF-8 text", files={"runs.csv": b"run,a,metric\n0,1,2\xe9\n"},
         id="compare-runs:latin-1"),
    # the budget counts replicates (it may pass the 2 configurations), not without end
    case("fleet tune compare --replay-runs {tmp}/runs.csv --budget 10001", "--budget must be an "
         "integer from 1 to 10000, not 10001", files={"runs.csv": "run,a,metric\n0,1,2\n0,2,3\n"
         "1,1,2\n"}, id="compare-runs:budget"),
    case("fleet tune compare --replay-runs {tmp}/runs.csv", "{tmp}/runs.csv:3: a configuration "
         "with no run: number each configuration's runs", files={"runs.csv": "run,a,metric\n0,1,2"
         "\n,2,3\n1,1,2\n"}, id="compare-runs:no-run"),
]  # fmt: skip

# What a results directory holds, damaged: refused before a run is recorded, in one line (a
# file where a run writes a folder failed the run half-way).
RESULTS = [
    case("fleet tune {tmp}/tune.toml", "{tmp}/results/logs is a file, not a directory: move it",
         files={"results/logs": "x\n", "tune.toml": TUNE, **TABLE}, id="results:logs-file"),
    case("fleet tune compare --replay {tmp}/t.csv", "{tmp}/results/reports is a file, not a "
         "directory", files={"results/reports": "x\n", **TABLE}, id="results:reports-file"),
    # A byte-order mark is no error: the file is read, and its real mistake said at its line.
    bench_file("\ufeff" + BENCH + "replicate = 3\n", "unknown-key"),
    # A run that is not there, in a results directory that holds none: nothing made to say so.
    *(case(f"fleet {command} fb-nosuch{extra}", "no fleet run 'fb-nosuch' in {tmp}/results/"
           "fleet.sqlite", id=f"results:{command}-unknown-run")
      for command, extra in (("status", ""), ("report", ""), ("kill", ""),
                             ("plan", " --work 1"))),
]  # fmt: skip

RECIPE_FILES = [
    recipe_file(('name = "trivial"', 'name = "../evil"'), "{tmp}/recipes/trivial/recipe.toml: "
                "name '../evil' must be the recipe's folder name 'trivial'", "name=../evil"),
    recipe_file(('name = "trivial"', 'name = "other"'), "{tmp}/recipes/trivial/recipe.toml: "
                "name 'other' must be the recipe's folder name 'trivial'", "name=other"),
    recipe_file(b'name = "trivial"\n' + LATIN1, "{tmp}/recipes/trivial/recipe.toml:2: the recipe"
                " is not UTF-8 text", "latin-1"),
    recipe_file(('template = "build.sh.j2"', 'template = "../../../../etc/passwd"'),
                "{tmp}/recipes/trivial/recipe.toml: build.template: ../../../../etc/passwd is not"
                " inside the recipe's folder", "template-outside"),
    recipe_file(("[smoke]", '[bench]\ncommand = "x {n}"\n[bench.parameters]\nn = { kind = '
                 '"float", default = 1 }\n[smoke]'), "{tmp}/recipes/trivial/recipe.toml: "
                "bench.parameters.n.kind 'float' is not one of int, uniform", "parameter-kind"),
    recipe_file(("[build]", "[build\n"), "{tmp}/recipes/trivial/recipe.toml: ", "syntax"),
    # A metric that is no table, or a misspelt key in it or in a parameter: a traceback, and
    # aggregate, unit or a parameter's bound silently left at their defaults.
    recipe_file(("[smoke]", '[bench]\ncommand = "bin/hello"\nmetric = "t=([0-9.]+)"\n[smoke]'),
                "{tmp}/recipes/trivial/recipe.toml: bench.metric must be a table", "metric=text"),
    recipe_file(("[smoke]", '[bench]\ncommand = "bin/hello"\nmetric = { kind = "regex", pattern '
                 '= "t=(.+)", agregate = "sum" }\n[smoke]'), "{tmp}/recipes/trivial/recipe.toml: "
                "bench.metric: unknown key 'agregate'; did you mean aggregate", "metric-key"),
    recipe_file(("[smoke]", '[bench]\ncommand = "x {n}"\n[bench.parameters]\nn = { kind = '
                 '"int", lo = 1, default = 1 }\n[smoke]'), "{tmp}/recipes/trivial/recipe.toml: "
                "bench.parameters.n: unknown key 'lo'; did you mean low", "parameter-key"),
    # A metric kind no parser knows: said of the recipe (the bench blamed its command line; a
    # tune took it and measured nothing).
    case("fleet bench --types c5a.large --recipe trivial", "{tmp}/recipes/trivial/recipe.toml: "
         "bench.metric.kind 'regexp' is not one of runtime, regex, file",
         files={"recipes/trivial/recipe.toml": (RECIPES / "trivial" / "recipe.toml").read_text()
                .replace("[smoke]", '[bench]\ncommand = "bin/hello"\nmetric = { kind = "regexp"'
                         ' }\n[smoke]')},
         env={"AMIBAKE_RECIPES_DIR": "{tmp}/recipes"}, id="recipe:metric-kind-bench"),
    case("fleet tune {tmp}/tune.toml", "{tmp}/recipes/trivial/recipe.toml: bench.metric.kind "
         "'regexp' is not one of runtime, regex, file",
         files={"recipes/trivial/recipe.toml": (RECIPES / "trivial" / "recipe.toml").read_text()
                .replace("[smoke]", '[bench]\ncommand = "bin/hello {args}"\nmetric = { kind = '
                         '"regexp" }\n[bench.parameters]\na = { kind = "int", default = 1 }\n'
                         '[smoke]'),
                "tune.toml": 'recipe = "trivial"\ntypes = ["c5a.large"]\n[params.a]\nkind = '
                             '"int"\nlow = 1\nhigh = 3\nstage = "run"\n'},
         env={"AMIBAKE_RECIPES_DIR": "{tmp}/recipes"}, id="recipe:metric-kind-tune"),
    recipe_file(("[smoke]", '[bench]\ncommand = "x {n}"\n[bench.parameters]\nn = { kind = '
                 '"uniform", default = nan }\n[smoke]'), "{tmp}/recipes/trivial/recipe.toml: "
                "bench.parameters.n.default nan is not finite", "parameter-default=nan"),
    # Values of the wrong type were made text: the workload ran "['bin/x']", or "bin/x abc".
    recipe_file(("[smoke]", '[bench]\ncommand = ["bin/x"]\n[smoke]'),
                "{tmp}/recipes/trivial/recipe.toml: bench.command must be a string",
                "bench-command=list"),
    recipe_file(('command = "bin/hello"', "command = 5"),
                "{tmp}/recipes/trivial/recipe.toml: smoke.command must be a string",
                "smoke-command=5"),
    recipe_file(("[smoke]", '[bench]\ncommand = "x {n}"\n[bench.parameters]\nn = { kind = '
                 '"int", default = "abc" }\n[smoke]'), "{tmp}/recipes/trivial/recipe.toml: "
                "bench.parameters.n.default 'abc' is not an integer", "parameter-default=text"),
    recipe_file(("[smoke]", '[bench]\ncommand = "x {n}"\n[bench.parameters]\nn = { kind = '
                 '"int", default = 5, low = 5, high = 1 }\n[smoke]'),
                "{tmp}/recipes/trivial/recipe.toml: bench.parameters.n: low 5 is above high 1",
                "parameter-low-above-high"),
    recipe_file(('template = "build.sh.j2"', 'template = "build\\u0000.sh.j2"'),
                "{tmp}/recipes/trivial/recipe.toml: build.template has a NUL character",
                "template-nul"),  # ValueError: embedded null byte, from a path
    recipe_file(('architectures = ["x86_64", "arm64"]', "architectures = []"),
                "{tmp}/recipes/trivial/recipe.toml: architectures lists none", "architectures=[]"),
]  # fmt: skip

CASES = [
    *AMIBAKE, *CONFIG, *PLAN, *BENCH_FLAGS, *BENCH_FILES, *TUNE_FLAGS, *TUNE_FILES, *PARAMS,
    *COMPARE, *RECIPE_FILES, *RESULTS,
]  # fmt: skip


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A row's own directory, results and local cloud; the cloud refuses to be asked."""
    for name in [n for n in os.environ if n.startswith("AMIBAKE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no amibake.toml but a row's own
    monkeypatch.setenv("AMIBAKE_CLOUD", "local")
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("AMIBAKE_LOCAL_DIR", str(tmp_path / "local"))

    def asked(*_: object, **__: object) -> None:
        raise AssertionError("bad input reached the cloud: it must be refused before")

    monkeypatch.setattr("amibake.local.control.up", asked)
    (tmp_path / "a-file").write_text("not a directory\n")
    yield tmp_path


def runs(results: Path) -> list[str]:
    """Fleet runs and journal runs recorded under a results directory."""
    found = []
    for name in ("fleet.sqlite", "journal.sqlite"):
        if (results / name).exists():
            with sqlite3.connect(results / name) as db:
                found += [f"{name}: {r[0]}" for r in db.execute("SELECT run_id FROM runs")]
    return found


def files_under(directory: Path) -> set[str]:
    """Every file, but amibake's journal (its runs are checked) and pytest's own. fleet's
    results database is one of them: a refused command used to leave an empty one."""
    return {
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and not p.name.startswith("journal.sqlite")
    }


def run_cli(argv: list[str]) -> int:
    return (amibake if argv[0] == "amibake" else fleet)(argv[1:])


@pytest.mark.parametrize(("argv", "start", "code", "files", "env"), CASES)
def test_bad_input_is_refused_on_one_line_creating_nothing(
    sandbox: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: str,
    start: str,
    code: int,
    files: dict[str, str | bytes],
    env: dict[str, str],
) -> None:
    tmp = str(sandbox)

    def fill(text: str) -> str:
        return text.replace("{tmp}", tmp).replace(
            "{recipes}", str(RECIPES.parent.parent / "build_recipes")
        )

    for name, content in files.items():
        path = sandbox / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(fill(content))
        if name.startswith("recipes/"):  # the rest of the recipe, beside its recipe.toml
            for other in (RECIPES / "trivial").iterdir():
                if not (path.parent / other.name).exists():
                    copy = shutil.copytree if other.is_dir() else shutil.copy
                    copy(other, path.parent / other.name)
    for name, value in env.items():
        monkeypatch.setenv(name, fill(value))
    words = shlex.split(fill(argv))
    before = files_under(sandbox)

    assert run_cli(words) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), f"not one line: {err!r}"
    assert err.startswith(f"{words[0]}: error: {fill(start)}"), err
    assert "Traceback" not in err
    assert runs(sandbox / "results") == [], "bad input recorded a run"
    assert files_under(sandbox) == before, "bad input left files"
    assert not (sandbox / "local").exists(), "bad input started a local cloud"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[]\n", "TypeError"),
        ('{"date": "x", "prices": {"c5a.large": {"on_demand": "x", "spot": {}, "vcpus": 2, '
         '"memory_gib": 4}}}\n', "ValueError"),
        ('{"prices": {}}\n', "KeyError"),
    ],
)  # fmt: skip
def test_a_damaged_price_table_is_said_so_not_read_as_no_prices(
    tmp_path: Path, text: str, why: str
) -> None:
    """Read as no table, every type of a build or bake estimate was $0.00 (and a JSON list a
    traceback); fleet's reader called the same file damaged. One reader now, one answer."""
    from amibake import cost
    from amibake.errors import UserError
    from fleet import prices

    table = tmp_path / "prices_us-east-1.json"
    table.write_text(text)
    for read in (cost.price_table, prices.in_use):
        with pytest.raises((UserError, prices.PriceError)) as caught:
            read(tmp_path, "us-east-1")
        said = str(caught.value)
        assert said.startswith(f"{table} is damaged ({why}") and "--refresh" in said, said


def test_a_results_database_that_is_a_directory_is_said_so(tmp_path: Path) -> None:
    from amibake.errors import UserError
    from amibake.journal import Journal

    (tmp_path / "journal.sqlite").mkdir()
    with pytest.raises(UserError, match=r"journal.sqlite is a directory \(unable to open"):
        Journal(tmp_path / "journal.sqlite")


def test_a_file_in_a_folder_the_user_may_not_enter_is_read_and_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a plain user, AMIBAKE_CONFIG or a recipe under a root-only folder: Path.exists raised
    PermissionError (a traceback). Root may enter any folder, so the refusal is made here."""
    from amibake import config, recipes, tomlfile
    from amibake.errors import UserError

    closed = tmp_path / "closed"
    real_exists, real_read = Path.exists, Path.read_bytes

    def refused(path: Path, *args: Any, **kwargs: Any) -> Any:
        if closed in path.parents:
            raise PermissionError(13, "Permission denied", str(path))
        return real_exists(path, *args, **kwargs)

    def unreadable(path: Path) -> bytes:
        if closed in path.parents:
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(Path, "exists", refused)
    monkeypatch.setattr(Path, "read_bytes", unreadable)
    assert tomlfile.present(closed / "a.toml")
    with pytest.raises(config.ConfigError, match="cannot read the config file: Permission denied"):
        config.load(environ={"AMIBAKE_CONFIG": str(closed / "a.toml")})
    with pytest.raises(UserError, match="cannot read the recipe: Permission denied"):
        recipes.load("kernels", closed)


def test_the_table_covers_both_commands_every_subcommand_and_every_setting() -> None:
    from amibake.cli import build_parser as amibake_parser
    from amibake.config import _FIELDS
    from fleet.cli import build_parser as fleet_parser

    assert len(CASES) > 150
    typed = [shlex.split(p.values[0]) for p in CASES]

    def subcommands(parser: Any) -> set[str]:
        action = next(a for a in parser._actions if a.dest == "command")
        return set(action.choices)

    for prog, parser in (("amibake", amibake_parser()), ("fleet", fleet_parser())):
        covered = {w[1] for w in typed if w[0] == prog and len(w) > 1}
        assert subcommands(parser) <= covered, subcommands(parser) - covered
    settings = {name.removeprefix("AMIBAKE_").lower() for p in CASES for name in p.values[4]} | {
        line.split("=")[0].strip()
        for p in CASES
        for text in p.values[3].values()
        if isinstance(text, str)
        for line in text.splitlines()
        if "=" in line and p.id.startswith("amibake.toml")
    }
    # A profile is any name; a wrong one is the AWS chain's to refuse (--cloud aws only).
    free = {"profile"}
    missing = set(_FIELDS) - settings - free
    assert not missing, f"no row spoils: {sorted(missing)}"


def test_the_bases_the_rows_spoil_are_good(
    sandbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each row fails for what it changed: unchanged, the same input passes."""
    tmp = str(sandbox)
    (sandbox / "t.csv").write_text(TABLE["t.csv"])
    (sandbox / "tune.toml").write_text(TUNE.replace("{tmp}", tmp))
    assert fleet(["tune", "compare", "--replay", f"{tmp}/t.csv", "--seeds", "2"]) == 0
    bench_spec = spec.load(_write(sandbox / "bench.toml", BENCH), {})
    assert bench_spec.types == ("c5a.large",) and bench_spec.replicates == 3
    tune_spec = tune.load(sandbox / "tune.toml")
    assert tune_spec.space.params["a"].options() == [1, 2, 3]
    assert fleet(["status"]) == 0
    assert fleet(["tune", f"{tmp}/tune.toml", "--trials", "3"]) == 0  # a replayed search
    assert amibake(["families", "--host", "--recipe", "kernels"]) == 0
    # The caps are the last values accepted, not below them.
    assert _duration("3650d").days == 3650
    plan.check(work=1e30, instances=plan.MAX_INSTANCES, deadline_h=plan.hours("8784h"), budget=1)
    loaded = config.load(environ={"AMIBAKE_SSH_TIMEOUT_S": "86400", "AMIBAKE_MAX_ATTEMPTS": "50"})
    assert (loaded.ssh_timeout_s, loaded.max_attempts) == (86400.0, 50)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_status_reads_the_largest_runs_without_planning_their_replicates(
    sandbox: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """replicates = 99999999999999 was recorded, and then `fleet status` hung and was OOM-killed
    building the run's replicate list. Status now counts them: neither the largest run the caps
    allow, nor one recorded before the caps, has its replicates listed (`plan` would raise)."""
    families = ["c5a", "c6a", "c6i", "c7a", "c7i", "c6g", "c7g"]
    text = (
        f"families = {families!r}\n"
        'sizes = ["large", "xlarge"]\nrecipe = "kernels"\nbuilds = ["tuned", "generic"]\n'
        f"replicates = {spec.COUNTS['replicates'][1]}\nwarmups = {spec.COUNTS['warmups'][1]}\n"
    )
    largest = spec.load(_write(sandbox / "bench.toml", text), {})
    results = bench.results_db(sandbox / "results")
    bench_run = "fb-0123456789"
    results.create_run(bench_run, "bench", largest.to_json(), "local", "us-east-1", "")
    before_caps = "fb-9876543210"
    recorded = spec.load(_write(sandbox / "old.toml", BENCH), {}).to_json()
    recorded["replicates"] = 99999999999999
    results.create_run(before_caps, "bench", recorded, "local", "us-east-1", "")
    head = TUNE_HEAD.replace("{tmp}", str(sandbox)) + f"trials = {tune.MAX_TRIALS}\n"
    tune_spec = tune.load(_write(sandbox / "tune.toml", head + PARAM_A))
    (sandbox / "t.csv").write_text(TABLE["t.csv"])
    tune_run = tune.start(results, tune_spec, "local", "us-east-1")

    def no_listing(*_: object) -> None:
        raise AssertionError("fleet status listed a run's replicates")

    monkeypatch.setattr(bench, "plan", no_listing)
    for argv in (
        ["status"],
        ["status", bench_run],
        ["status", before_caps],
        ["status", tune_run],
        ["status", "--json"],
    ):
        assert fleet(argv) == 0, argv
    out = capsys.readouterr().out
    planned = len(largest.types) * 2 * (1000 + 100)
    assert f"0/{planned} replicates" in out and f"0/{tune.MAX_TRIALS} trials" in out, out
    assert f"0/{99999999999999 + recorded['warmups']} replicates" in out, out


def test_a_run_recorded_before_the_caps_is_refused_on_resume_not_planned(
    sandbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resumed, `replicates = 99999999999999` raised MemoryError planning its replicates."""
    results = bench.results_db(sandbox / "results")
    recorded = spec.load(_write(sandbox / "bench.toml", BENCH), {}).to_json()
    recorded["replicates"] = 99999999999999
    results.create_run("fb-0123456789", "bench", recorded, "local", "us-east-1", "")
    assert fleet(["bench", "--resume", "fb-0123456789"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "fleet: error: run fb-0123456789 cannot be resumed: its recorded replicates must be an "
        "integer from 1 to 1000, not 99999999999999: a median's interval"
    ), err
    assert err.rstrip().endswith("`fleet kill fb-0123456789` removes what it left") and (
        err.count("\n") == 1
    ), err
    assert not (sandbox / "local").exists()


@pytest.mark.e2e
def test_refusals_that_need_the_clouds_answer_leave_nothing(
    cloud: Cloud, local_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image or instance id of the right shape that the cloud does not have: refused on one
    line, and the cloud holds what it held."""
    journal = Journal(cloud.config.results_dir / "journal.sqlite")

    def held() -> tuple[int, int, int]:
        ec2 = cloud.ec2
        return (
            len(journal.alive()),
            len(ec2.describe_key_pairs()["KeyPairs"]),
            len(ec2.describe_security_groups()["SecurityGroups"]),
        )

    before = held()
    for argv, code, start in (
        (["batch", "up", "--ami", "ami-0123456789abcdef0"], 2, "image ami-0123456789abcdef0 does "
         "not exist in us-east-1"),
        (["build", "--family", "c5a", "--recipe", "kernels", "--region", "eu-north-1"], 2,
         "the local cloud serves"),
        (["local", "interrupt", "i-0123456789abcdef0"], 2, "i-0123456789abcdef0 is not a running "
         "local-cloud instance; `amibake local status` lists them"),
    ):  # fmt: skip
        assert amibake(argv) == code, argv
        err = capsys.readouterr().err
        assert err.startswith(f"amibake: error: {start}") and err.count("\n") == 1, err
    assert held() == before
    # a moment for the session's cloud to finish ending what an earlier test stopped
    assert wait_until_clean(local_dir) == []
