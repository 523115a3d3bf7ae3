"""The suite uses loopfence's own pytest plugin (fixtures, loopback-only network) and pytester.

The plugin is normally loaded through its `pytest11` entry point; a checkout whose environment was
installed before the entry point existed gets it registered here instead.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    import loopfence.testing._plugin as plugin

    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "loopfence")
