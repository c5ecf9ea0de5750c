"""Every error amibake raises on purpose descends from one root.

::

    AmibakeError                      exit 1 unless a subclass says otherwise
    ├── UserError                     exit 2: the user can fix it (bad flag, bad file)
    │   ├── ConfigError               config values, collected and reported together
    │   └── UnknownNameError          a name not in a catalog, with close matches
    ├── EnvironmentProblem            exit 2: the machine lacks something (sshd, root, a port)
    ├── CloudError                    an AWS (or local cloud) call failed after retries
    ├── RemoteError                   SSH connection, host key, or a remote command failed
    │   └── HostKeyMismatch           the server's key is not in the console fingerprint block
    └── LocalCloudError               the local cloud daemon or a sandbox misbehaved

The CLI prints ``str(error)`` on one line and exits with ``error.exit_code``; anything that is
not an AmibakeError is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AmibakeError(Exception):
    exit_code = 1


class UserError(AmibakeError):
    exit_code = 2


class ConfigError(UserError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def close_matches(name: str, known: Iterable[str]) -> list[str]:
    """The known names a misspelt one is close to: what "did you mean" offers."""
    return difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.5)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ "; did you mean tpe?" to end a refusal of a misspelt name, or ''."""
    close = close_matches(name, known)
    return f"; did you mean {', '.join(close)}?" if close else ""


class UnknownNameError(UserError):
    def __init__(self, kind: str, name: str, known: Iterable[str], hint: str = "") -> None:
        known = sorted(known)
        close = close_matches(name, known)
        message = f"unknown {kind} {name!r}"
        if close:
            message += f"; did you mean {', '.join(close)}?"
        else:
            message += f"; known: {', '.join(known)}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


class EnvironmentProblem(AmibakeError):
    exit_code = 2


class CloudError(AmibakeError):
    pass


class RemoteError(AmibakeError):
    pass


class HostKeyMismatch(RemoteError):
    pass


class LocalCloudError(AmibakeError):
    pass
