"""The suite uses loopfence's own pytest plugin (fixtures, loopback-only network) and pytester.

The plugin is normally loaded through its `pytest11` entry point; a checkout whose environment was
installed before the entry point existed gets it registered here instead.
"""

from __future__ import annotations

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
