"""One registry implementation for everything VT reads by name: tools and the
trainer's algorithms share it, with lazy entries, entry points and "module:attr"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import vt_envs.core.registry as registry_module
from vt_envs import tool_registry
from vt_envs.core.registry import Registry
from vt_envs.domains.lookup import LookupTool
from vt_envs.errors import UnknownNameError, UnknownToolError
from vt_train.algorithms.advantages import ADVANTAGES
from vt_train.registry import Registry as TrainerRegistry


def test_tools_and_algorithms_share_one_implementation():
    assert TrainerRegistry is Registry
    assert isinstance(tool_registry, Registry) and isinstance(ADVANTAGES, Registry)


def test_entries_register_directly_lazily_or_as_a_decorator():
    things = Registry("thing")
    things.register("direct", 1)
    things.register("lazy", "vt_envs.domains.lookup:LookupTool")

    @things.register("decorated")
    def decorated():
        return 3

    assert things.get("direct") == 1 and things.get("decorated") is decorated
    assert things.get("lazy") is LookupTool  # imported on first use
    assert things.names() == ["decorated", "direct", "lazy"] and "lazy" in things
    with pytest.raises(ValueError, match="already registered"):
        things.register("direct", 2)


def test_a_miss_says_did_you_mean_and_module_attr_loads_by_reference():
    things = Registry("thing")
    things.register("median_baseline", 1)
    with pytest.raises(UnknownNameError, match="Did you mean 'median_baseline'"):
        things.get("median_baselin")
    assert things.get("vt_envs.domains.lookup:LookupTool") is LookupTool
    with pytest.raises(UnknownToolError, match="Did you mean 'python'"):
        tool_registry.get("pythn")
    assert tool_registry.get("vt_envs.domains.lookup:LookupTool") is LookupTool


def test_entry_points_are_read_on_the_first_lookup_only(monkeypatch):
    reads = []

    def fake_entry_points(group):
        reads.append(group)
        return [SimpleNamespace(name="lookup", value="vt_envs.domains.lookup:LookupTool")]

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    things = Registry("thing", entry_point_group="vt_test.things")
    assert reads == []  # building a registry reads nothing
    assert things.get("lookup") is LookupTool and things.names() == ["lookup"]
    assert reads == ["vt_test.things"]
