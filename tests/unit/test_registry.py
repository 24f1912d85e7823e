import pytest

from kvroute.errors import KvrouteError, UnknownNameError, suggest
from kvroute.registry import Registry


def test_lookup_and_decorator():
    reg: Registry[object] = Registry("press")

    @reg.register("snapkv")
    class Snap:
        pass

    reg.register("knorm", 3)
    assert reg.get("snapkv") is Snap
    assert reg.get("knorm") == 3
    assert reg.names() == ["snapkv", "knorm"]
    assert "knorm" in reg and "tova" not in reg


def test_unknown_name_suggests_closest_and_lists_all():
    reg: Registry[int] = Registry("press")
    for i, n in enumerate(["snapkv", "streaming_llm", "expected_attention", "knorm"]):
        reg.register(n, i)
    with pytest.raises(UnknownNameError) as e:
        reg.get("snapvk")
    msg = str(e.value)
    assert "did you mean 'snapkv'" in msg
    assert "expected_attention" in msg  # the full list is shown
    assert isinstance(e.value, KeyError) and isinstance(e.value, KvrouteError)


def test_duplicate_registration_refused():
    reg: Registry[int] = Registry("metric")
    reg.register("f1", 1)
    with pytest.raises(KvrouteError, match="registered twice"):
        reg.register("f1", 2)


@pytest.mark.parametrize("name,expected", [
    ("smollm2", "smollm2-135m"),  # prefix
    ("qwen2.5-05b", "qwen2.5-0.5b"),  # typo
    ("SMOLLM2-135M", "smollm2-135m"),  # case
])
def test_suggest(name, expected):
    assert suggest(name, ["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"])[0] == expected


def test_suggest_nothing_close():
    assert suggest("zzzzzz", ["snapkv", "knorm"]) == []


def test_unknown_name_with_nothing_close_is_still_a_sentence():
    msg = str(UnknownNameError("backend", "spark", ["local", "ray"], hint="(ray needs a cluster)"))
    assert msg == "unknown backend 'spark'. Known backends: local, ray. (ray needs a cluster)"


def test_add_registers_a_class_by_its_own_name():
    reg: Registry[type] = Registry("scorer")

    @reg.add
    class Snap:
        name = "snapkv"

    assert reg.get("snapkv") is Snap
    with pytest.raises(KvrouteError, match="no name attribute"):
        reg.add(type("Nameless", (), {}))
    with pytest.raises(KvrouteError, match="registered twice"):
        reg.add(type("Again", (), {"name": "snapkv"}))


def test_every_registered_class_is_registered_under_its_own_name():
    from kvroute.presses import SCORERS, SELECTIONS
    from kvroute.tasks import FAMILIES

    for registry in (SCORERS, SELECTIONS, FAMILIES):
        for key, obj in registry.items():
            assert getattr(obj, "name", key) == key, (registry.kind, key)
