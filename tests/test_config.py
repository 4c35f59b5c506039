"""Tests of easycore.common.config: CfgNode and HierarchicalCfgNode."""

from __future__ import annotations

import copy
import io
import multiprocessing
import operator
import os
import pickle
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import yaml
from easycore.common.config import (
    BaseConfigNotFoundError,
    CfgNode,
    ConfigAttributeError,
    ConfigError,
    ConfigKeyError,
    FrozenConfigError,
    HierarchicalCfgNode,
    InvalidConfigError,
    UnsafeYAMLError,
)
from easycore.common.config import CfgNode as CN
from easycore.errors import EasycoreError, InvalidArgument
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DATA = Path(__file__).parent / "data" / "config"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A copy of tests/data/config, so tests may write next to the files."""
    target = tmp_path / "config"
    shutil.copytree(DATA, target)
    return target


def make_cfg() -> CfgNode:
    return CN(
        {
            "MODEL": {
                "IN_FEATURES": ["res3", "res4", "res5"],
                "INPUT_SIZE": (224, 224),
                "NUM_CLASSES": 100,
                "BACKBONE": {"DEPTH": 50, "NORM": "BN"},
            },
            "SOLVER": {"LR": 0.1, "STEPS": [30, 60]},
            "NAME": "YuxinZhaozyx",
        }
    )


# ---------------------------------------------------------------------- the manual's examples


def test_manual_load_config_from_yaml_file(data_dir: Path, monkeypatch) -> None:
    monkeypatch.chdir(data_dir)

    cfg = CN.open("example.yaml")

    # or
    with open("example.yaml", encoding="utf-8") as f:
        cfg2 = CN.open(f)

    assert cfg == cfg2
    assert cfg.MODEL.IN_FEATRES == ["res3", "res4", "res5"]
    assert cfg.MODEL.INPUT_SIZE == (224, 224)
    assert isinstance(cfg.MODEL.INPUT_SIZE, tuple)
    assert cfg.MODEL.NUM_CLASSES == 100
    assert cfg.NAME == "YuxinZhaozyx"
    assert isinstance(cfg.MODEL, CfgNode)


def test_manual_empty_config() -> None:
    cfg = CN()
    assert cfg == {}
    assert isinstance(cfg, dict)


def test_manual_config_from_dict_and_use() -> None:
    init_dict = {
        "MODEL": {
            "IN_FEATURES": ["res3", "res4", "res5"],
            "INPUT_SIZE": (224, 224),
            "NUM_CLASSES": 100,
        },
        "NAME": "YuxinZhaozyx",
    }
    cfg = CN(init_dict)

    in_features = cfg.MODEL.IN_FEATURES  # list
    input_size = cfg.MODEL.INPUT_SIZE  # tuple
    num_classes = cfg.MODEL.NUM_CLASSES  # int
    name = cfg.NAME  # str
    assert (type(in_features), type(input_size), type(num_classes), type(name)) == (
        list,
        tuple,
        int,
        str,
    )

    # add new value to config
    cfg.LICENSE = "MIT"

    # add a new CfgNode to config
    cfg.SOLVER = CN()
    cfg.SOLVER.LEARNING_RATE = 0.001
    cfg.SOLVER.BATCH_SIZE = 128

    assert cfg["LICENSE"] == "MIT"
    assert cfg["SOLVER"] == {"LEARNING_RATE": 0.001, "BATCH_SIZE": 128}
    assert init_dict["MODEL"]["NUM_CLASSES"] == 100 and "LICENSE" not in init_dict


def test_manual_merge_two_configs() -> None:
    cfg_a = CN()
    cfg_a.key1 = 1
    cfg_a.key2 = 2

    cfg_b = CN()
    cfg_b.key2 = 3
    cfg_b.key3 = 4  # the manual writes cfg_c.key3, a typo

    # merge two config
    cfg_a.merge(cfg_b)  # now cfg_a.key2 is 3
    assert cfg_a == {"key1": 1, "key2": 3, "key3": 4}
    assert cfg_b == {"key2": 3, "key3": 4}


def test_manual_copy_is_deep() -> None:
    cfg = make_cfg()
    cfg_copy = cfg.copy()  # get a deepcopy of cfg
    assert cfg_copy == cfg and isinstance(cfg_copy, CfgNode)
    cfg_copy.MODEL.IN_FEATURES.append("res6")
    cfg_copy.MODEL.BACKBONE.DEPTH = 101
    assert cfg.MODEL.IN_FEATURES == ["res3", "res4", "res5"]
    assert cfg.MODEL.BACKBONE.DEPTH == 50
    assert cfg_copy.MODEL is not cfg.MODEL


def test_manual_save_config(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = make_cfg()

    cfg.save("example-save.yaml")
    assert CN.open("example-save.yaml") == cfg

    # or
    os.remove("example-save.yaml")
    with open("example-save.yaml", "w", encoding="utf-8") as f:
        cfg.save(f)
    assert CN.open("example-save.yaml") == cfg


def test_manual_hierarchical_example(data_dir: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(data_dir)
    cfg = HierarchicalCfgNode.open("./example-A.yaml")
    print(cfg)
    assert cfg == {"A": "in example-A.yaml", "B": "in example-B.yaml", "C": "in example-A.yaml"}
    assert list(cfg) == ["A", "B", "C"]
    assert capsys.readouterr().out.strip() == (
        "{'A': 'in example-A.yaml', 'B': 'in example-B.yaml', 'C': 'in example-A.yaml'}"
    )


# ---------------------------------------------------------------------- construction and access


def test_nested_dicts_become_nodes_other_values_do_not() -> None:
    cfg = CN({"A": {"B": {"C": 1}}, "L": [{"x": 1}], "T": ({"y": 2},)})
    assert type(cfg.A) is CfgNode and type(cfg.A.B) is CfgNode
    assert type(cfg.L[0]) is dict and type(cfg.T[0]) is dict
    assert cfg.A.B.C == 1 and cfg["A"]["B"]["C"] == 1


def test_init_rejects_non_mapping() -> None:
    with pytest.raises(InvalidArgument):
        CN([("a", 1)])  # type: ignore[arg-type]


def test_copy_true_deepcopies_and_copy_false_shares_values() -> None:
    leaf = [1, 2]
    obj = object()
    source = {"A": {"L": leaf}, "O": obj}
    copied = CN(source)
    shared = CN(source, copy=False)
    assert copied.A.L == leaf and copied.A.L is not leaf
    assert shared.A.L is leaf and shared.O is obj
    leaf.append(3)
    assert copied.A.L == [1, 2] and shared.A.L == [1, 2, 3]


def test_copy_false_keeps_nested_cfgnodes_and_copy_true_rebuilds_them() -> None:
    inner = CN({"x": 1})
    inner.freeze()
    assert CN({"I": inner}, copy=False).I is inner
    rebuilt = CN({"I": inner})
    assert rebuilt.I == inner and rebuilt.I is not inner
    assert not rebuilt.I.is_frozen()
    rebuilt.I.x = 2
    assert inner.x == 1


def test_attribute_and_item_access_are_the_same() -> None:
    cfg = CN()
    cfg.A = 1
    cfg["B"] = 2
    assert cfg["A"] == 1 and cfg.B == 2
    del cfg.A
    del cfg["B"]
    assert cfg == {}


def test_assigned_dict_becomes_node_and_assigned_node_is_kept() -> None:
    cfg = CN()
    cfg.D = {"x": {"y": 1}}
    assert isinstance(cfg.D, CfgNode) and isinstance(cfg.D.x, CfgNode)
    node = CN()
    cfg.N = node
    node.z = 3
    assert cfg.N is node and cfg.N.z == 3


class _Model:
    """Stands for an arbitrary object, e.g. a torch model, kept in a config."""

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Model) and other.weight == self.weight


def test_arbitrary_objects_are_stored_as_they_are() -> None:
    cfg = CN()
    model = _Model(0.5)
    cfg.model = model
    cfg.fn = len
    assert cfg.model is model and cfg.fn is len
    copied = copy.deepcopy(cfg)
    assert copied.model == model and copied.model is not model
    restored = pickle.loads(pickle.dumps(cfg))
    assert restored.model == model and restored.fn is len


@pytest.mark.parametrize("key", ["1abc", "a-b", "a.b", "", "with space", "__frozen__"])
def test_invalid_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidConfigError, match="invalid config key"):
        CN({key: 1})
    cfg = CN({"MODEL": {}})
    with pytest.raises(InvalidConfigError, match="invalid config key 'MODEL."):
        cfg.MODEL[key] = 1
    assert cfg.MODEL == {}


def test_non_str_key_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="must be str"):
        CN({"A": {1: "x"}})
    with pytest.raises(ValueError):
        CN()[("a",)] = 1  # type: ignore[index]


def test_invalid_key_in_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("MODEL:\n  IN-FEATURES: 1\n", encoding="utf-8")
    with pytest.raises(InvalidConfigError) as info:
        CN.open(path)
    assert "bad.yaml" in str(info.value) and "MODEL.IN-FEATURES" in str(info.value)


def test_method_names_are_keys_only_through_items() -> None:
    cfg = CN()
    with pytest.raises(ConfigAttributeError, match=r"cfg\['copy'\]"):
        cfg.copy = 1
    cfg["copy"] = 1
    cfg["items"] = 2
    assert cfg["copy"] == 1 and callable(cfg.copy)
    assert dict(cfg.items()) == {"copy": 1, "items": 2}


def test_attribute_fast_paths_keep_the_rules() -> None:
    # Existing keys take the fast paths; every rule of the slow paths still holds there.
    cfg = CN({"count": 0, "copy": 1, "sub": {"a": 1}})
    for _ in range(3):
        cfg.count += 1
    assert cfg.count == 3 and cfg["count"] == 3
    with pytest.raises(ConfigAttributeError):
        cfg.copy = 2  # an existing key named like a method: still item access only
    assert callable(cfg.copy) and cfg["copy"] == 1
    cfg.sub = {"b": 2}  # a dict still becomes a CfgNode with its key path
    assert isinstance(cfg.sub, CN) and cfg.sub.b == 2
    with pytest.raises(ConfigKeyError, match="sub.c"):
        cfg.sub["c"]
    cfg.set_strict(True)
    cfg.count = 10  # existing keys may change in strict mode
    with pytest.raises(ConfigKeyError):
        cfg.counter = 1
    cfg.freeze()
    with pytest.raises(FrozenConfigError):
        cfg.count = 11
    assert cfg.count == 10


def test_a_subclass_method_name_is_a_key_only_where_no_method_has_it() -> None:
    # Reads of keys skip the per-class check for names no CfgNode class has; a subclass
    # made after nodes exist must still keep its own method names, and only its own.
    base = CN()
    base["late_method"] = 1
    assert base.late_method == 1  # no class has that name yet

    class Late(CN):
        def late_method(self) -> str:
            return "method"

    node = Late()
    node["late_method"] = 2
    assert node.late_method() == "method" and node["late_method"] == 2
    with pytest.raises(ConfigAttributeError, match=r"cfg\['late_method'\]"):
        node.late_method = 3
    assert base.late_method == 1  # the base class has no such method: still the key
    base.late_method = 4
    assert base["late_method"] == 4


def test_missing_item_is_a_key_error_with_full_path_and_suggestion() -> None:
    cfg = make_cfg()
    with pytest.raises(KeyError) as info:
        cfg.MODEL.BACKBONE["DEPHT"]
    assert isinstance(info.value, ConfigKeyError) and isinstance(info.value, EasycoreError)
    message = str(info.value)
    assert "MODEL.BACKBONE.DEPHT" in message and "Did you mean 'DEPTH'?" in message
    assert cfg.get("NOPE", 7) == 7


def test_missing_attribute_is_an_attribute_error_with_full_path() -> None:
    cfg = make_cfg()
    with pytest.raises(AttributeError) as info:
        _ = cfg.SOLVER.LEARNING_RATE
    assert isinstance(info.value, ConfigAttributeError)
    assert "SOLVER.LEARNING_RATE" in str(info.value)
    assert not hasattr(cfg, "NOPE")
    assert getattr(cfg.MODEL, "NUM_CLASES", None) is None
    with pytest.raises(ConfigAttributeError, match="Did you mean 'NUM_CLASSES'"):
        _ = cfg.MODEL.NUM_CLASES


def test_delete_missing_key_errors() -> None:
    cfg = make_cfg()
    with pytest.raises(ConfigKeyError, match="MODEL.NOPE"):
        del cfg.MODEL["NOPE"]
    with pytest.raises(ConfigAttributeError, match="MODEL.NOPE"):
        del cfg.MODEL.NOPE
    with pytest.raises(ConfigKeyError, match="SOLVER.NOPE"):
        cfg.SOLVER.pop("NOPE")
    assert cfg.SOLVER.pop("NOPE", None) is None


def test_dict_methods() -> None:
    cfg = CN({"A": 1})
    cfg.update({"B": {"x": 1}}, C=3)
    assert isinstance(cfg.B, CfgNode) and cfg.C == 3
    assert cfg.setdefault("D", {"y": 2}) == {"y": 2} and isinstance(cfg.D, CfgNode)
    assert cfg.setdefault("A", 5) == 1
    assert cfg.pop("C") == 3
    cfg |= {"E": 5}
    assert cfg.E == 5
    assert cfg.popitem() == ("E", 5)
    with pytest.raises(InvalidConfigError):
        cfg.update({"bad key": 1})
    assert "bad key" not in cfg
    cfg.clear()
    assert cfg == {}
    assert "NAME" in dir(make_cfg())


def test_dict_str_and_repr() -> None:
    cfg = make_cfg()
    plain = cfg.dict()
    assert type(plain) is dict and type(plain["MODEL"]) is dict
    assert type(plain["MODEL"]["BACKBONE"]) is dict
    assert plain == cfg
    assert str(CN({"A": 1, "B": {"C": "x"}})) == "{'A': 1, 'B': {'C': 'x'}}"
    assert repr(CN({"A": {"B": 1}})) == "CfgNode({'A': CfgNode({'B': 1})})"


# ---------------------------------------------------------------------- freezing


def _mutations() -> list[tuple[str, object]]:
    return [
        ("setattr", lambda c: setattr(c.MODEL.BACKBONE, "DEPTH", 1)),
        ("setattr-new", lambda c: setattr(c.MODEL, "NEW", 1)),
        ("setitem", lambda c: c.MODEL.BACKBONE.__setitem__("DEPTH", 1)),
        ("delattr", lambda c: delattr(c.MODEL, "NUM_CLASSES")),
        ("delitem", lambda c: c.MODEL.__delitem__("NUM_CLASSES")),
        ("update", lambda c: c.MODEL.update(NUM_CLASSES=1)),
        ("ior", lambda c: c.MODEL.__ior__({"NUM_CLASSES": 1})),
        ("setdefault", lambda c: c.MODEL.setdefault("NEW", 1)),
        ("pop", lambda c: c.MODEL.pop("NUM_CLASSES")),
        ("pop-default", lambda c: c.MODEL.pop("NOPE", None)),
        ("popitem", lambda c: c.MODEL.popitem()),
        ("clear", lambda c: c.MODEL.clear()),
        ("merge", lambda c: c.merge({"MODEL": {"NUM_CLASSES": 1}})),
        ("merge-nested", lambda c: c.MODEL.merge({"BACKBONE": {"DEPTH": 1}})),
        ("merge_from_list", lambda c: c.merge_from_list(["MODEL.BACKBONE.DEPTH", "1"])),
        ("merge_from_dotlist", lambda c: c.merge_from_dotlist(["SOLVER.LR=1"])),
    ]


@pytest.mark.parametrize(("name", "mutate"), _mutations(), ids=[n for n, _ in _mutations()])
def test_frozen_node_refuses_every_mutation(name: str, mutate) -> None:
    cfg = make_cfg()
    cfg.freeze()
    before = copy.deepcopy(cfg.dict())
    with pytest.raises(FrozenConfigError) as info:
        mutate(cfg)
    assert isinstance(info.value, AttributeError)
    assert "frozen" in str(info.value)
    assert cfg.dict() == before
    cfg.freeze(False)
    mutate(cfg)  # allowed once unfrozen


def test_frozen_error_names_the_full_key_path() -> None:
    cfg = make_cfg()
    cfg.freeze()
    with pytest.raises(FrozenConfigError, match=r"'MODEL\.BACKBONE\.DEPTH'"):
        cfg.MODEL.BACKBONE.DEPTH = 101
    with pytest.raises(FrozenConfigError, match=r"'MODEL\.BACKBONE\.DEPTH'"):
        cfg.merge_from_list(["MODEL.BACKBONE.DEPTH", "101"])


def test_freeze_covers_the_tree_and_nodes_attached_later_keep_their_own_state() -> None:
    cfg = make_cfg()
    assert not cfg.is_frozen()
    cfg.freeze()
    assert cfg.is_frozen() and cfg.MODEL.is_frozen() and cfg.MODEL.BACKBONE.is_frozen()
    cfg.freeze(False)
    assert not cfg.MODEL.BACKBONE.is_frozen()
    cfg.MODEL.BACKBONE.freeze()
    assert cfg.MODEL.BACKBONE.is_frozen() and not cfg.is_frozen()
    cfg.MODEL.NUM_CLASSES = 3  # the parent is not frozen
    assert cfg.MODEL.NUM_CLASSES == 3


def test_copy_of_frozen_config_is_frozen_and_independent() -> None:
    cfg = make_cfg()
    cfg.freeze()
    dup = cfg.copy()
    assert dup.is_frozen() and dup.MODEL.is_frozen()
    dup.freeze(False)
    dup.MODEL.NUM_CLASSES = 1
    assert cfg.MODEL.NUM_CLASSES == 100 and cfg.is_frozen()
    shallow = copy.copy(cfg)
    assert shallow.is_frozen() and shallow.MODEL is cfg.MODEL


# ---------------------------------------------------------------------- merging


def test_merge_is_recursive_and_copies_values() -> None:
    cfg = make_cfg()
    other = CN({"MODEL": {"BACKBONE": {"DEPTH": 101}, "NEW": {"x": [1]}}, "EXTRA": [1, 2]})
    cfg.merge(other)
    assert cfg.MODEL.BACKBONE == {"DEPTH": 101, "NORM": "BN"}
    assert cfg.MODEL.NUM_CLASSES == 100
    assert cfg.MODEL.NEW == {"x": [1]} and cfg.EXTRA == [1, 2]
    other.MODEL.NEW.x.append(2)
    other.EXTRA.append(3)
    assert cfg.MODEL.NEW.x == [1] and cfg.EXTRA == [1, 2]
    assert cfg.MODEL.NEW is not other.MODEL.NEW


def test_merge_replaces_node_with_value_and_value_with_node() -> None:
    cfg = CN({"A": {"x": 1}, "B": 2})
    cfg.merge({"A": 5, "B": {"y": 1}})
    assert cfg == {"A": 5, "B": {"y": 1}} and isinstance(cfg.B, CfgNode)


def test_merge_of_frozen_other_gives_unfrozen_nodes() -> None:
    other = CN({"A": {"x": 1}})
    other.freeze()
    cfg = CN()
    cfg.merge(other)
    cfg.A.x = 2
    assert other.A.x == 1


def test_merge_rejects_non_mapping() -> None:
    with pytest.raises(InvalidArgument):
        CN().merge([1, 2])  # type: ignore[arg-type]


def test_strict_merge_refuses_unknown_keys_and_changes_nothing() -> None:
    cfg = make_cfg()
    before = cfg.copy()
    with pytest.raises(ConfigKeyError) as info:
        cfg.merge({"NAME": "x", "MODEL": {"BACKBONE": {"DEPT": 1}}}, strict=True)
    assert "MODEL.BACKBONE.DEPT" in str(info.value) and "Did you mean 'DEPTH'" in str(info.value)
    assert cfg == before


# ---------------------------------------------------------------------- command-line overrides


def test_merge_from_list_evaluates_literals() -> None:
    cfg = make_cfg()
    cfg.merge_from_list(
        [
            "MODEL.NUM_CLASSES",
            "10",
            "MODEL.INPUT_SIZE",
            "(320, 320)",
            "MODEL.IN_FEATURES",
            "['res4']",
            "SOLVER.LR",
            "1e-3",
            "NEW.FLAG",
            "True",
            "NEW.NONE",
            "None",
            "NEW.WORD",
            "res5",
        ]
    )
    assert cfg.MODEL.NUM_CLASSES == 10
    assert cfg.MODEL.INPUT_SIZE == (320, 320)
    assert cfg.MODEL.IN_FEATURES == ["res4"]
    assert cfg.SOLVER.LR == 0.001
    assert cfg.NEW == {"FLAG": True, "NONE": None, "WORD": "res5"}
    assert isinstance(cfg.NEW, CfgNode)


def test_merge_from_list_follows_the_old_type() -> None:
    cfg = CN({"NAME": "abc", "LR": 0.5, "SIZE": (1, 2), "STEPS": [1], "N": 1})
    cfg.merge_from_list(["NAME", "123", "LR", "1", "SIZE", "[3, 4]", "STEPS", "(5, 6)"])
    assert cfg.NAME == "123"
    assert cfg.LR == 1.0 and isinstance(cfg.LR, float)
    assert cfg.SIZE == (3, 4)
    assert cfg.STEPS == [5, 6]
    cfg.merge_from_list(["N", 3, "D", {"x": 1}])  # Python values are checked the same way
    assert cfg.N == 3 and isinstance(cfg.D, CfgNode)
    with pytest.raises(InvalidConfigError, match="'N'.*an int"):
        cfg.merge_from_list(["N", 2.5])


def test_merge_from_list_errors() -> None:
    cfg = make_cfg()
    before = cfg.copy()
    with pytest.raises(InvalidConfigError, match="odd number"):
        cfg.merge_from_list(["MODEL.NUM_CLASSES"])
    with pytest.raises(InvalidArgument):
        cfg.merge_from_list("MODEL.NUM_CLASSES 10")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="'MODEL.NUM_CLASSES' holds a int"):
        cfg.merge_from_list(["MODEL.NUM_CLASSES.X", "1"])
    with pytest.raises(InvalidConfigError, match="not a valid config key"):
        cfg.merge_from_list(["MODEL..X", "1"])
    with pytest.raises(ConfigKeyError, match="Did you mean 'NUM_CLASSES'"):
        cfg.merge_from_list(["NAME", "ok", "MODEL.NUM_CLASES", "1"], strict=True)
    with pytest.raises(ConfigKeyError, match="'MODL'.*Did you mean 'MODEL'"):
        cfg.merge_from_list(["MODL.NUM_CLASSES", "1"], strict=True)
    assert cfg == before  # nothing applied when any override is refused


def test_merge_from_dotlist() -> None:
    cfg = make_cfg()
    cfg.merge_from_dotlist(["MODEL.NUM_CLASSES=10", "SOLVER.STEPS = [1, 2]", "NAME=a=b"])
    assert cfg.MODEL.NUM_CLASSES == 10 and cfg.SOLVER.STEPS == [1, 2] and cfg.NAME == "a=b"
    with pytest.raises(InvalidConfigError, match="key=value"):
        cfg.merge_from_dotlist(["MODEL.NUM_CLASSES"])
    with pytest.raises(ConfigKeyError, match="SOLVER.LRR"):
        cfg.merge_from_dotlist(["SOLVER.LRR=1"], strict=True)


def test_strict_mode_refuses_new_keys_everywhere() -> None:
    cfg = make_cfg()
    cfg.set_strict()
    assert cfg.is_strict() and cfg.MODEL.BACKBONE.is_strict()
    with pytest.raises(ConfigKeyError, match=r"'SOLVER\.LEARNIG_RATE'"):
        cfg.SOLVER.LEARNIG_RATE = 0.1
    with pytest.raises(ConfigKeyError, match="Did you mean 'DEPTH'"):
        cfg.MODEL.BACKBONE["DEPT"] = 1
    with pytest.raises(ConfigKeyError):
        cfg.merge({"NEW": 1})
    with pytest.raises(ConfigKeyError):
        cfg.merge_from_list(["MODEL.NEW", "1"])
    with pytest.raises(ConfigKeyError):
        cfg.update(NEW=1)
    cfg.SOLVER.LR = 0.2  # existing keys can change
    cfg.merge_from_list(["MODEL.BACKBONE.DEPTH", "101"])
    assert cfg.SOLVER.LR == 0.2 and cfg.MODEL.BACKBONE.DEPTH == 101
    cfg.merge({"NEW": 1}, strict=False)
    assert cfg.NEW == 1
    cfg.set_strict(False)
    cfg.OTHER = 2
    assert cfg.OTHER == 2


# ---------------------------------------------------------------------- YAML


def test_dump_returns_str_or_writes_stream() -> None:
    cfg = make_cfg()
    text = CN.dump(cfg)
    assert isinstance(text, str) and "NUM_CLASSES: 100" in text
    assert "INPUT_SIZE: (224, 224)" in text
    stream = io.StringIO()
    assert CN.dump(cfg, stream) is None
    assert stream.getvalue() == text
    assert cfg.dump() == text  # also callable on an instance
    assert CN.dump(cfg, explicit_start=True).startswith("---")
    assert isinstance(CN.dump(cfg, encoding="utf-8"), bytes)
    assert text.index("MODEL") < text.index("SOLVER") < text.index("NAME")  # order kept


def test_load_reads_python_literals_from_plain_scalars_only() -> None:
    cfg = CN.load(
        "SIZE: (224, 224)\n"
        "QUOTED: '(224, 224)'\n"
        'DQUOTED: "None"\n'
        "NONE: None\n"
        "SCI: 1e-3\n"
        "WORD: res5\n"
        "LIST: [1, 2]\n"
        "YAML_NULL: null\n"
        "ONE_TWO: 1, 2\n"
    )
    assert cfg.SIZE == (224, 224)
    assert cfg.QUOTED == "(224, 224)" and cfg.DQUOTED == "None"
    assert cfg.NONE is None and cfg.YAML_NULL is None
    assert cfg.SCI == 0.001
    assert cfg.WORD == "res5" and cfg.LIST == [1, 2] and cfg.ONE_TWO == (1, 2)


def test_load_does_not_evaluate_keys() -> None:
    cfg = CN.load("None: 1\nB:\n  - (1, 2): x\n")
    assert cfg == {"None": 1, "B": [{"(1, 2)": "x"}]}


def test_load_empty_and_non_mapping() -> None:
    assert CN.load("") == {} and isinstance(CN.load(""), CfgNode)
    with pytest.raises(InvalidConfigError, match="must be a mapping"):
        CN.load("- 1\n- 2\n")


def test_strings_that_look_like_literals_round_trip_as_strings() -> None:
    cfg = CN({"A": "(1, 2)", "B": "None", "C": "1", "D": "[1]", "E": "True", "F": "res"})
    assert CN.load(cfg.dump()) == cfg


def test_tuples_round_trip_as_tuples() -> None:
    cfg = CN(
        {
            "A": (224, 224),
            "B": ((1, 2), "x"),
            "C": (),
            "D": (1,),
            "E": ("a: b", "c # d"),  # cannot be a plain scalar
            "F": [(1, 2)],
            "G": (1.5, None, True),
        }
    )
    text = cfg.dump()
    assert "A: (224, 224)" in text
    back = CN.load(text)
    assert back == cfg
    assert all(type(back[k]) is tuple for k in "ABCDEG") and type(back.F[0]) is tuple
    flow = CN.dump(cfg, default_flow_style=True)
    assert CN.load(flow) == cfg


def test_dump_of_unrepresentable_value_names_the_key() -> None:
    cfg = make_cfg()
    cfg.MODEL.net = _Model(1.0)
    with pytest.raises(InvalidConfigError, match=r"_Model at key 'MODEL\.net'"):
        cfg.dump()


def test_save_and_open_binary_files(tmp_path: Path) -> None:
    cfg = CN({"NAME": "Zhào", "SIZE": (1, 2)})
    path = tmp_path / "bin.yaml"
    with open(path, "wb") as f:
        cfg.save(f)
    with open(path, "rb") as f:
        assert CN.open(f) == cfg
    assert CN.open(str(path)) == cfg


def test_save_encoding(tmp_path: Path) -> None:
    cfg = CN({"NAME": "Zhào"})
    path = tmp_path / "latin.yaml"
    cfg.save(path, encoding="latin-1")
    assert CN.open(path, encoding="latin-1") == cfg


def test_failed_save_leaves_no_file(tmp_path: Path) -> None:
    cfg = CN({"m": _Model(1.0)})
    path = tmp_path / "x.yaml"
    with pytest.raises(InvalidConfigError):
        cfg.save(path)
    assert not path.exists()


def test_round_trip_open_save_open(data_dir: Path) -> None:
    cfg = CN.open(data_dir / "example.yaml")
    out = data_dir / "saved.yaml"
    cfg.save(out)
    again = CN.open(out)
    assert again == cfg
    assert type(again.MODEL.INPUT_SIZE) is tuple
    again.save(out)
    assert CN.open(out) == cfg


def test_open_reports_yaml_syntax_errors_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("A: [1, 2\n", encoding="utf-8")
    with pytest.raises(yaml.YAMLError, match="broken.yaml"):
        CN.open(path)


# ---------------------------------------------------------------------- unsafe YAML


def test_unsafe_tag_is_refused_by_default(data_dir: Path) -> None:
    with pytest.raises(UnsafeYAMLError) as info:
        CN.open(data_dir / "unsafe-eval.yaml")
    error = info.value
    assert isinstance(error, yaml.YAMLError) and isinstance(error, ValueError)
    assert isinstance(error, ConfigError)
    message = str(error)
    assert "!!python/object/apply:eval" in message and "unsafe=True" in message
    assert "unsafe-eval.yaml" in message


def test_unsafe_tag_does_not_run_code(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    text = f"X: !!python/object/apply:eval [\"open({str(marker)!r}, 'w').write('ran')\"]\n"
    with pytest.raises(UnsafeYAMLError):
        CN.load(text)
    with pytest.raises(UnsafeYAMLError):
        HierarchicalCfgNode.open(io.StringIO(text))
    assert not marker.exists()
    for tag in ("!!python/name:os.system", "!!python/object/new:os.system ['true']"):
        with pytest.raises(UnsafeYAMLError):
            CN.load(f"X: {tag}\n")


def test_unsafe_tag_works_with_explicit_opt_in(data_dir: Path) -> None:
    cfg = CN.open(data_dir / "unsafe-eval.yaml", unsafe=True)
    assert cfg.INPUT_SIZE == (224, 224) and cfg.NAME == "unsafe"
    assert CN.load('A: !!python/object/apply:eval ["1 + 1"]', unsafe=True).A == 2


def test_other_unknown_tags_are_plain_yaml_errors() -> None:
    with pytest.raises(yaml.YAMLError) as info:
        CN.load("A: !custom 1\n")
    assert not isinstance(info.value, UnsafeYAMLError)


# ---------------------------------------------------------------------- pickling


def test_pickle_keeps_values_frozen_and_strict_state() -> None:
    cfg = make_cfg()
    cfg.set_strict()
    cfg.freeze()
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(cfg, protocol=protocol))
        assert back == cfg and type(back.MODEL.BACKBONE) is CfgNode
        assert back.is_frozen() and back.MODEL.BACKBONE.is_frozen() and back.is_strict()
        with pytest.raises(FrozenConfigError, match="MODEL.BACKBONE.DEPTH"):
            back.MODEL.BACKBONE.DEPTH = 1


def test_pickle_unfrozen_stays_unfrozen_and_paths_survive() -> None:
    cfg = make_cfg()
    back = pickle.loads(pickle.dumps(cfg))
    assert not back.is_frozen()
    back.MODEL.BACKBONE.DEPTH = 1
    with pytest.raises(ConfigKeyError, match="MODEL.BACKBONE.NOPE"):
        back.MODEL.BACKBONE["NOPE"]


@pytest.fixture(scope="module")
def spawn_context() -> multiprocessing.context.SpawnContext:
    """The "spawn" context, with multiprocessing's resource tracker (a helper process that
    lives as long as this one) started before the per-test guard against leaked children."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    return multiprocessing.get_context("spawn")


def test_pickle_across_a_spawned_process(spawn_context) -> None:
    cfg = make_cfg()
    cfg.model = _Model(2.0)
    cfg.freeze()
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn_context) as pool:
        frozen = pool.submit(operator.methodcaller("is_frozen"), cfg)
        size = pool.submit(operator.attrgetter("MODEL.INPUT_SIZE"), cfg)
        back = pool.submit(copy.copy, cfg)
        assert frozen.result(timeout=120) is True
        assert size.result(timeout=120) == (224, 224)
        returned = back.result(timeout=120)
    assert returned == cfg and returned.MODEL.BACKBONE.is_frozen()
    assert returned.model == _Model(2.0)


# ---------------------------------------------------------------------- property-based

_KEYS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
    lambda k: k not in {"__frozen__", "__strict__", "__keypath__"}
)
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | _TEXT
    | st.sampled_from(["(1, 2)", "None", "1e-3", "[1]", "'x'", "res5", "yes", "~", ""])
)


def _values(with_tuples: bool) -> st.SearchStrategy:
    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        containers = st.lists(children, max_size=3) | st.dictionaries(_KEYS, children, max_size=3)
        if with_tuples:
            containers = containers | st.lists(children, max_size=3).map(tuple)
        return containers

    return st.recursive(_SCALARS, extend, max_leaves=12)


_PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(st.dictionaries(_KEYS, _values(with_tuples=False), max_size=5))
def test_property_dict_round_trip(d: dict) -> None:
    cfg = CfgNode(d)
    assert cfg.dict() == d
    assert CfgNode(d, copy=False).dict() == d


@_PROPERTY
@given(st.dictionaries(_KEYS, _values(with_tuples=True), max_size=5))
def test_property_dump_load_round_trip(d: dict) -> None:
    cfg = CfgNode(d)
    assert CfgNode.load(CfgNode.dump(cfg)) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg


# ---------------------------------------------------------------------- HierarchicalCfgNode


def test_hierarchical_chain_across_folders(data_dir: Path) -> None:
    cfg = HierarchicalCfgNode.open(data_dir / "chain" / "child" / "child.yaml")
    assert cfg == {
        "MODEL": {"NAME": "resnet", "DEPTH": 101, "INPUT_SIZE": (224, 224), "NUM_CLASSES": 10},
        "SOLVER": {"LR": 0.01, "STEPS": [10, 20]},
        "SEED": 0,
        "NAME": "child",
    }
    assert "__BASE__" not in cfg and type(cfg.MODEL.INPUT_SIZE) is tuple
    middle = HierarchicalCfgNode.open(str(data_dir / "chain" / "base" / "middle.yaml"))
    assert middle.MODEL.DEPTH == 101 and "NUM_CLASSES" not in middle.MODEL
    assert not cfg.is_frozen()


def test_plain_open_keeps_base_key(data_dir: Path) -> None:
    cfg = CN.open(data_dir / "example-A.yaml")
    assert cfg.__BASE__ == "./example-B.yaml" and "B" not in cfg


def test_hierarchical_base_as_absolute_path_never_relative_to_cwd(
    data_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    absolute = other / "abs.yaml"
    absolute.write_text(f"__BASE__: {data_dir / 'example-B.yaml'}\nA: abs\n", encoding="utf-8")
    assert HierarchicalCfgNode.open(absolute) == {"A": "abs", "B": "in example-B.yaml"}
    # Not next to the file: relative to the file, then absolute only (as the manual says);
    # the working directory is never searched, so a config opens the same from anywhere.
    monkeypatch.chdir(data_dir)  # data_dir/example-B.yaml exists
    cwd_relative = other / "cwd.yaml"
    cwd_relative.write_text("__BASE__: example-B.yaml\nC: 1\n", encoding="utf-8")
    with pytest.raises(BaseConfigNotFoundError, match="relative to the file") as info:
        HierarchicalCfgNode.open(cwd_relative)
    assert str(other / "example-B.yaml") in str(info.value)


def test_hierarchical_relative_to_file_wins_over_cwd(data_dir: Path, monkeypatch) -> None:
    monkeypatch.chdir(data_dir)  # data_dir/example-B.yaml exists too
    sub = data_dir / "sub"
    sub.mkdir()
    (sub / "example-B.yaml").write_text("B: next to the file\n", encoding="utf-8")
    (sub / "top.yaml").write_text("__BASE__: example-B.yaml\n", encoding="utf-8")
    assert HierarchicalCfgNode.open(sub / "top.yaml") == {"B": "next to the file"}


def test_hierarchical_list_of_bases(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("A: 1\nN: {x: 1, y: 1}\n", encoding="utf-8")
    (tmp_path / "two.yaml").write_text("A: 2\nN: {y: 2}\n", encoding="utf-8")
    (tmp_path / "top.yaml").write_text(
        "__BASE__: [one.yaml, two.yaml]\nN: {z: 3}\n", encoding="utf-8"
    )
    cfg = HierarchicalCfgNode.open(tmp_path / "top.yaml")
    assert cfg == {"A": 2, "N": {"x": 1, "y": 2, "z": 3}}


def test_hierarchical_missing_base(tmp_path: Path) -> None:
    (tmp_path / "top.yaml").write_text("__BASE__: nowhere.yaml\n", encoding="utf-8")
    with pytest.raises(BaseConfigNotFoundError) as info:
        HierarchicalCfgNode.open(tmp_path / "top.yaml")
    assert isinstance(info.value, FileNotFoundError)
    assert "nowhere.yaml" in str(info.value) and "top.yaml" in str(info.value)


def test_hierarchical_bad_base_value(tmp_path: Path) -> None:
    (tmp_path / "top.yaml").write_text("__BASE__: 3\n", encoding="utf-8")
    with pytest.raises(InvalidConfigError, match="__BASE__ must be a path"):
        HierarchicalCfgNode.open(tmp_path / "top.yaml")


@pytest.mark.parametrize("name", ["a.yaml", "b.yaml", "self.yaml"])
def test_hierarchical_cycle_is_a_clear_error(data_dir: Path, name: str) -> None:
    with pytest.raises(InvalidConfigError, match="cycle") as info:
        HierarchicalCfgNode.open(data_dir / "cycle" / name)
    assert name in str(info.value)


def test_hierarchical_save_without_base_is_plain_save(tmp_path: Path) -> None:
    cfg = make_cfg()
    HierarchicalCfgNode.save(cfg, str(tmp_path / "plain.yaml"))
    assert CN.open(tmp_path / "plain.yaml") == cfg


@pytest.mark.parametrize("relative", [True, False])
def test_hierarchical_save_writes_only_differences(data_dir: Path, relative: bool) -> None:
    base_path = data_dir / "chain" / "child" / "child.yaml"
    cfg = HierarchicalCfgNode.open(base_path)
    cfg.MODEL.DEPTH = 152
    cfg.SOLVER.WARMUP = {"ITERS": 100}
    cfg.EXTRA = (1, 2)
    out_dir = data_dir / "experiments" / "run1"
    out_dir.mkdir(parents=True)
    save_path = out_dir / "cfg.yaml"
    HierarchicalCfgNode.save(cfg, str(save_path), str(base_path), base_path_relative=relative)

    raw = CN.open(save_path)
    expected_base = os.path.relpath(base_path, out_dir) if relative else os.path.abspath(base_path)
    assert raw == {
        "__BASE__": expected_base,
        "MODEL": {"DEPTH": 152},
        "SOLVER": {"WARMUP": {"ITERS": 100}},
        "EXTRA": (1, 2),
    }
    assert list(raw)[0] == "__BASE__"
    assert HierarchicalCfgNode.open(save_path) == cfg


def test_hierarchical_save_keeps_type_differences(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("A: 1\nB: [1, 2]\n", encoding="utf-8")
    cfg = CN({"A": True, "B": [1, 2]})
    HierarchicalCfgNode.save(cfg, tmp_path / "out.yaml", tmp_path / "base.yaml")
    assert CN.open(tmp_path / "out.yaml") == {"__BASE__": "base.yaml", "A": True}
    back = HierarchicalCfgNode.open(tmp_path / "out.yaml")
    assert back.A is True and back == cfg


def test_hierarchical_save_refuses_to_drop_base_keys(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("A: 1\nN: {x: 1, y: 2}\n", encoding="utf-8")
    cfg = CN({"A": 1, "N": {"x": 1}})
    with pytest.raises(InvalidConfigError, match="'N.y'"):
        HierarchicalCfgNode.save(cfg, tmp_path / "out.yaml", tmp_path / "base.yaml")
    assert not (tmp_path / "out.yaml").exists()


def test_hierarchical_round_trip_open_save_open(data_dir: Path) -> None:
    base = data_dir / "example-A.yaml"
    cfg = HierarchicalCfgNode.open(base)
    cfg.B = "changed"
    target = data_dir / "derived.yaml"
    HierarchicalCfgNode.save(cfg, target, base)
    assert CN.open(target) == {"__BASE__": "example-A.yaml", "B": "changed"}
    assert HierarchicalCfgNode.open(target) == cfg
