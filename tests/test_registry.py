"""Tests of easycore.common.registry.Registry."""

from __future__ import annotations

import pickle

import pytest
from easycore.common.registry import AlreadyRegisteredError, Registry, RegistryKeyError
from easycore.errors import EasycoreError, InvalidArgument


def test_manual_register_with_its_name() -> None:
    MODEL_REGISTRY = Registry("MODEL")

    @MODEL_REGISTRY.register()
    class ResNet50:
        pass

    assert MODEL_REGISTRY.get("ResNet50") is ResNet50

    # or
    OTHER_REGISTRY = Registry("OTHER")
    assert OTHER_REGISTRY.register(obj=ResNet50) is None
    model_class = OTHER_REGISTRY.get("ResNet50")
    assert model_class is ResNet50


def test_manual_register_with_a_given_name() -> None:
    MODEL_REGISTRY = Registry("MODEL")

    @MODEL_REGISTRY.register("resnet")
    class ResNet50:
        pass

    assert MODEL_REGISTRY.get("resnet") is ResNet50
    assert not MODEL_REGISTRY.is_registered("ResNet50")

    # or
    OTHER_REGISTRY = Registry("OTHER")
    assert OTHER_REGISTRY.register("resnet", ResNet50) is None
    model_class = OTHER_REGISTRY.get("resnet")
    assert model_class is ResNet50


def test_decorator_returns_the_object_itself() -> None:
    registry = Registry("FN")

    @registry.register()
    def build(x: int) -> int:
        return x + 1

    @registry.register("named")
    def other(x: int) -> int:
        return x * 2

    assert build(1) == 2 and other(2) == 4
    assert registry.get("build") is build and registry.get("named") is other


def test_bare_decorator_without_parentheses() -> None:
    registry = Registry("FN")

    @registry.register
    class Plain:
        pass

    assert Plain.__name__ == "Plain" and registry.get("Plain") is Plain


def test_taken_name_is_an_error_unless_override() -> None:
    registry = Registry("MODEL")
    registry.register("a", 1)
    with pytest.raises(AlreadyRegisteredError) as info:
        registry.register("a", 2)
    assert isinstance(info.value, ValueError) and isinstance(info.value, EasycoreError)
    assert "'a'" in str(info.value) and "MODEL" in str(info.value)
    assert "override=True" in str(info.value)
    assert registry.get("a") == 1
    registry.register("a", 2, override=True)
    assert registry.get("a") == 2

    @registry.register("a", override=True)
    class Replacement:
        pass

    assert registry.get("a") is Replacement


def test_registering_the_same_object_again_is_harmless() -> None:
    registry = Registry("MODEL")

    class Net:
        pass

    registry.register(obj=Net)
    registry.register(obj=Net)
    assert registry.registered_names() == ["Net"]


def test_get_unknown_name_lists_names_and_closest_match() -> None:
    registry = Registry("MODEL")
    registry.register("resnet50", 1)
    registry.register("vgg16", 2)
    with pytest.raises(KeyError) as info:
        registry.get("resnet5")
    assert isinstance(info.value, RegistryKeyError) and isinstance(info.value, EasycoreError)
    message = str(info.value)
    assert "'resnet5'" in message and "'MODEL'" in message
    assert "Did you mean 'resnet50'?" in message
    assert "'resnet50', 'vgg16'" in message
    with pytest.raises(RegistryKeyError, match="Registered names: none"):
        Registry("EMPTY").get("x")


def test_get_of_unhashable_name_is_a_key_error() -> None:
    with pytest.raises(RegistryKeyError):
        Registry("R").get(["x"])  # type: ignore[arg-type]


def test_unregister() -> None:
    registry = Registry("MODEL")
    registry.register("a", 1)
    registry.unregister("a")
    assert not registry.is_registered("a") and len(registry) == 0
    with pytest.raises(RegistryKeyError, match="'a'"):
        registry.unregister("a")
    registry.register("a", 3)  # the name is free again
    assert registry.get("a") == 3


def test_is_registered_and_registered_names() -> None:
    registry = Registry("MODEL")
    assert registry.registered_names() == [] and not registry.is_registered("x")
    for name in ["c", "a", "b"]:
        registry.register(name, name.upper())
    assert registry.registered_names() == ["c", "a", "b"]  # registration order
    assert registry.is_registered("a")
    names = registry.registered_names()
    names.append("z")
    assert "z" not in registry  # a copy is returned


def test_container_protocol_and_repr() -> None:
    registry = Registry("MODEL")
    registry.register("x", 1)
    registry.register("y", 2)
    assert "x" in registry and "z" not in registry
    assert len(registry) == 2
    assert list(registry) == ["x", "y"]
    assert registry["y"] == 2
    assert registry.items() == [("x", 1), ("y", 2)]
    assert registry.name == "MODEL"
    assert repr(registry) == "Registry(name='MODEL', registered=[x, y])"
    for name in registry:  # iterating over a snapshot: changes during iteration are allowed
        registry.unregister(name)
    assert len(registry) == 0


def test_name_errors() -> None:
    registry = Registry("MODEL")
    with pytest.raises(InvalidArgument, match="no __name__"):
        registry.register(obj=3)
    with pytest.raises(InvalidArgument, match="must be a str"):
        registry.register(3, "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="must not be empty"):
        registry.register("", 1)
    assert len(registry) == 0


def test_registry_pickles_with_its_objects() -> None:
    registry = Registry("MODEL")
    registry.register("len", len)
    back = pickle.loads(pickle.dumps(registry))
    assert back.get("len") is len and back.name == "MODEL"
    back.register("max", max)
    assert "max" not in registry
