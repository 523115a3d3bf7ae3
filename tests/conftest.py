"""The suite uses loopfence's own pytest plugin (fixtures, loopback-only network) and pytester.

The plugin is normally loaded through its `pytest11` entry point; a checkout whose environment was
installed before the entry point existed gets it registered here instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

# Shared, noisy machines: property tests judge results, never speed.
settings.register_profile("loopfence", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("loopfence")


def pytest_configure(config: pytest.Config) -> None:
    import loopfence.testing._plugin as plugin

    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "loopfence")


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """loopfence's cross-run record of untrusted content (tools/_provenance) is each test's own."""
    monkeypatch.setenv("LOOPFENCE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


def _shape(record: dict[str, Any]) -> tuple[Any, ...]:
    """What a record looks like: its kind, its fields and their JSON types (one level into objects),
    and the values of its enum fields. One record of each shape is checked."""
    def kinds(d: dict[str, Any]) -> tuple[Any, ...]:
        return tuple((k, type(v).__name__, kinds(v) if isinstance(v, dict) and k != "raw" else None,
                      v if k in ("decision", "reason", "verdict", "result", "format", "version") else None)
                     for k, v in d.items())
    return kinds(record)


@pytest.fixture(scope="session", autouse=True)
def _logs_match_the_published_schema() -> Iterator[None]:
    """Every event the suite writes through RunLog is checked against `loopfence schema events` with
    jsonschema (not with loopfence's own models): the schema cannot drift from the writer."""
    from loopfence._json import dumps
    from loopfence.cli import cli  # noqa: F401 - the schema as the command prints it
    from loopfence._log import _writer
    from loopfence._log._schema import events_schema

    schema = json.loads(dumps(events_schema()))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema)
    seen: set[tuple[Any, ...]] = set()
    bad: list[str] = []
    write = _writer.RunLog.write

    def checked(self: Any, ev: Any) -> Any:
        out = write(self, ev)
        record, event = out.record, out.event
        shape = _shape(record)
        if shape not in seen:
            seen.add(shape)
            line = json.loads(dumps(record))
            errors = sorted(validator.iter_errors(line), key=lambda e: e.path)
            if errors:
                bad.append(f"{event} event {dumps(line)[:300]}: {errors[0].message[:300]}")
        return out

    _writer.RunLog.write = checked  # type: ignore[method-assign]
    try:
        yield
    finally:
        _writer.RunLog.write = write  # type: ignore[method-assign]
    assert not bad, f"{len(bad)} logged event shapes do not match `loopfence schema events`:\n" + \
        "\n".join(bad[:10])
