"""botocore's service models, read once a process.

botocore keeps what it reads from its data files (service models, endpoints, partitions) in a
cache of each session's own: every new session decodes them again, the EC2 model alone several
megabytes of JSON. A command opens a session per cloud it connects to, the local cloud asks
models to read requests off the wire, and the test suite connects hundreds of times: decoding
was 52 s of the 189 s test_iam_policy's Batch test took (cProfile). Here every session shares
one cache, as the data files do not change while a process runs.
"""

from __future__ import annotations

import os
import threading
from functools import cache
from typing import Any

import botocore.loaders
import botocore.session

_lock = threading.Lock()
_shared: dict[tuple[Any, ...], Any] = {}


def _once(key: tuple[Any, ...], load: Any) -> Any:
    with _lock:
        if key in _shared:
            return _shared[key]
    value = load()  # outside the lock: another thread may load a different model meanwhile
    with _lock:
        return _shared.setdefault(key, value)


class SharedLoader(botocore.loaders.Loader):  # type: ignore[misc]
    """A loader whose models and top-level data files are read once for every session of the
    process with the same search paths. What botocore returns from a loader it already shares
    among a session's clients, so it never changes it."""

    def load_service_model(
        self, service_name: str, type_name: str, api_version: str | None = None
    ) -> Any:
        key = ("model", tuple(self.search_paths), service_name, type_name, api_version)
        return _once(key, lambda: super(SharedLoader, self).load_service_model(
            service_name, type_name, api_version
        ))  # fmt: skip

    def load_data_with_path(self, name: str) -> Any:
        # A path inside a service's directory is an extras file, merged into the model it
        # extends: only load_service_model's result, shared above, is kept.
        if os.sep in name:
            return super().load_data_with_path(name)
        key = ("data", tuple(self.search_paths), name)
        return _once(key, lambda: super(SharedLoader, self).load_data_with_path(name))


def session(profile: str | None = None) -> botocore.session.Session:
    """A botocore session reading through the shared cache (AWS_DATA_PATH honoured, as
    botocore's own loader does)."""
    new = botocore.session.Session(profile=profile)
    paths = new.get_config_variable("data_path")
    extra = (
        [os.path.expanduser(os.path.expandvars(p)) for p in paths.split(os.pathsep)]
        if paths
        else None
    )
    new.register_component("data_loader", SharedLoader(extra_search_paths=extra))
    return new


@cache
def service_model(service: str) -> Any:
    """botocore's model of a service (its operations and shapes)."""
    return session().get_service_model(service)


@cache
def paginators(service: str) -> dict[str, Any]:
    """A service's paginator definitions by operation; empty for a service without any."""
    try:
        return dict(session().get_paginator_model(service)._paginator_config)
    except Exception:  # a service without paginators
        return {}
