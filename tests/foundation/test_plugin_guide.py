"""The minimal plugin of docs/plugin-guide.md loads as written and behaves as the guide says."""

import re
from pathlib import Path

from hwrun.plugins import load_plugins

GUIDE = Path(__file__).parents[2] / "docs" / "plugin-guide.md"


def minimal_plugin_source() -> str:
    text = GUIDE.read_text()
    after = text.split("A minimal plugin", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_guides_minimal_plugin_loads_and_refuses_without_its_device(tmp_path, monkeypatch):
    (tmp_path / "hwrun_guide_example.py").write_text(minimal_plugin_source())
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin_set = load_plugins(["hwrun_guide_example"])
    assert "myvendor" in plugin_set.names()
    target = plugin_set.target("myvendor")
    assert target.device_type == "cpu"  # this machine has no NPU
    assert target.reasons == ("no MyVendor NPU: install the vendor's torch extension and driver",)
    impls = plugin_set.registry("myvendor").impls("indexer.topk")
    assert [i.name for i in impls] == ["npu-radix"]
    assert impls[0].validate(target.spec("indexer.topk")) == [
        "tensors must be on the NPU, got 'cpu'"
    ]
    assert plugin_set.capabilities("myvendor").ops == frozenset()
