"""Loads the conformance pytest plugin when pytest collects this package by its path.

(`pytest -p hwrun_conformance.pytest_plugin` loads it too; registering it twice is avoided.)
"""

from __future__ import annotations

import importlib

import pytest

PLUGIN = "hwrun_conformance.pytest_plugin"


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    module = importlib.import_module(PLUGIN)
    if not pluginmanager.is_registered(module):
        pluginmanager.register(module, PLUGIN)  # its pytest_addoption runs now, historically
