"""CfgNode and HierarchicalCfgNode under hostile or careless input: clear errors
that name the file and line, nothing executed, memory bounded by a documented limit."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import yaml
from easycore.common.config import (
    BaseConfigNotFoundError,
    CfgNode,
    HierarchicalCfgNode,
    InvalidConfigError,
    InvalidYAMLError,
    UnsafeYAMLError,
    yaml_io,
)


def alias_bomb(levels: int, fan: int = 9, flow: str = "{}") -> str:
    """``levels`` of anchors, each aliasing the one before ``fan`` times."""
    open_, close = flow
    lines = ["a0: &a0 {x: 1}"]
    for i in range(1, levels + 1):
        if open_ == "{":
            items = ", ".join(f"k{j}: *a{i - 1}" for j in range(fan))
        else:
            items = ", ".join(f"*a{i - 1}" for _ in range(fan))
        lines.append(f"a{i}: &a{i} {open_}{items}{close}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- 1: alias bombs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flow", ["{}", "[]"])
def test_alias_bomb_is_refused_before_it_expands(tmp_path: Path, flow: str) -> None:
    text = alias_bomb(8, flow=flow)  # about 740 bytes; 9**8 copies once expanded
    assert len(text) < 800
    with pytest.raises(InvalidYAMLError, match="more than 1,000,000 values") as info:
        CfgNode.load(text)
    assert "line " in str(info.value) and "MAX_VALUES" in str(info.value)
    path = tmp_path / "bomb.yaml"
    path.write_text(text, encoding="utf-8")
    for opener in (CfgNode.open, HierarchicalCfgNode.open):
        with pytest.raises(InvalidConfigError, match="bomb.yaml"):
            opener(path)


def test_alias_limit_is_the_documented_setting(monkeypatch) -> None:
    text = alias_bomb(3)  # 1 + 3 levels of 9 keys: about 1700 values expanded
    assert CfgNode.load(text).a3.k8.k0.k0.x == 1
    monkeypatch.setattr(yaml_io, "MAX_VALUES", 1000)
    with pytest.raises(InvalidConfigError, match="more than 1,000 values"):
        CfgNode.load(text)


def test_ordinary_aliases_and_merge_keys_still_work() -> None:
    cfg = CfgNode.load(
        "BASE: &base {LR: 0.1, STEPS: [1, 2]}\nA: *base\nB:\n  <<: *base\n  LR: 0.2\n"
    )
    assert cfg.A == {"LR": 0.1, "STEPS": [1, 2]}
    assert cfg.B == {"LR": 0.2, "STEPS": [1, 2]}
    cfg.A.LR = 5  # each alias is a copy in the config
    assert cfg.BASE.LR == 0.1


@pytest.mark.parametrize("text", ["A: &a [1, *a]\n", "A: &a {B: *a}\n"])
def test_recursive_alias_is_refused(text: str) -> None:
    with pytest.raises(InvalidConfigError, match="line 1.*recursive"):
        CfgNode.load(text)


# ---------------------------------------------------------------- 2: every load failure


def test_deep_nesting_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("A: " + "[" * 1000 + "]" * 1000 + "\n", encoding="utf-8")
    with pytest.raises(InvalidConfigError, match=r"deep\.yaml.*line 1.*nested") as info:
        CfgNode.open(path)
    assert not isinstance(info.value, RecursionError)


def test_nesting_past_the_limit_is_refused_with_its_line() -> None:
    text = "A:\n" + "".join("  " * i + f"K{i}:\n" for i in range(1, 150)) + "  " * 150 + "V: 1\n"
    with pytest.raises(InvalidConfigError, match="nested more than 100 levels"):
        CfgNode.load(text)


def test_over_long_integer_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("A: 1\nB: " + "9" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(InvalidConfigError, match=r"big\.yaml, line 2") as info:
        CfgNode.open(path)
    assert "digits" in str(info.value)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("A: 1\nB: [1, 2\n", 3),  # scanner/parser: the flow list never ends
        ("A: 1\nB: c: d\n", 2),  # a mapping value where none may start
        ("A: 1\n\tB: 2\n", 2),  # a tab as indentation
        ("A: 1\nB: *nowhere\n", 2),  # an undefined alias
        ("A: 1\nD: 2023-13-45\n", 2),  # a date that does not exist
    ],
)
def test_yaml_errors_name_the_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InvalidConfigError, match=rf"bad\.yaml, line {line}\b") as info:
        CfgNode.open(path)
    assert isinstance(info.value, ValueError)


def test_yaml_errors_are_still_yaml_errors() -> None:
    with pytest.raises(yaml.YAMLError):
        CfgNode.load("A: [1, 2\n")


def test_undecodable_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"A: caf\xe9\n")
    with pytest.raises(InvalidConfigError, match=r"latin\.yaml"):
        CfgNode.open(path)
    with pytest.raises(InvalidConfigError, match=r"latin\.yaml"):
        CfgNode.open(open(path, "rb"))


def test_unsafe_tags_stay_refused_by_default() -> None:
    text = "A: !!python/object/apply:eval ['1 + 1']\n"
    with pytest.raises(UnsafeYAMLError):
        CfgNode.load(text)
    assert CfgNode.load(text, unsafe=True).A == 2  # the manual's example, opted in


# ---------------------------------------------------------------- 3: duplicate keys


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("A: 1\nB: 0\nA: 2\n", encoding="utf-8")
    with pytest.raises(InvalidYAMLError, match=r"dup\.yaml, line 3") as info:
        CfgNode.open(path)
    assert "duplicate key 'A'" in str(info.value) and "first at line 1" in str(info.value)


def test_repeated_mapping_is_refused_not_half_dropped() -> None:
    text = "MODEL:\n  A: 1\nSOLVER:\n  LR: 1\nMODEL:\n  B: 2\n"
    with pytest.raises(InvalidConfigError, match="duplicate key 'MODEL' at line 5.*line 1"):
        CfgNode.load(text)
    with pytest.raises(InvalidConfigError, match="duplicate key 'X'"):
        CfgNode.load("M: {X: 1, Y: 2, X: 3}\n")


def test_merge_keys_may_still_be_overridden() -> None:
    cfg = CfgNode.load("B: &b {X: 1, Y: 1}\nC:\n  <<: *b\n  X: 2\n")
    assert cfg.C == {"X": 2, "Y": 1}


# ---------------------------------------------------------------- 4: typed overrides


def typed_cfg() -> CfgNode:
    return CfgNode(
        {
            "MODEL": {"NUM_CLASSES": 10, "NAME": "resnet", "SIZE": (224, 224), "PRETRAINED": True},
            "SOLVER": {"LR": 0.1, "STEPS": [1, 2]},
            "EMPTY": None,
        }
    )


@pytest.mark.parametrize(
    ("key", "value", "holds"),
    [
        ("MODEL.NUM_CLASSES", "ten", "an int"),
        ("MODEL.NUM_CLASSES", "2.5", "an int"),
        ("MODEL.NUM_CLASSES", "True", "an int"),
        ("SOLVER.LR", "abc", "a float"),
        ("SOLVER.LR", "[1]", "a float"),
        ("MODEL.SIZE", "big", "a tuple"),
        ("SOLVER.STEPS", "3", "a list"),
        ("MODEL.PRETRAINED", "3", "a bool"),
    ],
)
def test_override_that_does_not_fit_is_refused(key: str, value: str, holds: str) -> None:
    cfg = typed_cfg()
    before = cfg.copy()
    with pytest.raises(InvalidConfigError, match=f"cannot set '{key}'.*holds {holds}"):
        cfg.merge_from_list(["SOLVER.LR", "0.5", key, value])
    assert cfg == before  # nothing applied
    with pytest.raises(InvalidConfigError, match=f"'{key}'"):
        cfg.merge_from_dotlist([f"{key}={value}"])


def test_sub_node_cannot_become_a_scalar() -> None:
    cfg = typed_cfg()
    with pytest.raises(InvalidConfigError, match="'MODEL' is a config node.*MODEL.NUM_CLASSES"):
        cfg.merge_from_list(["MODEL", "3"])
    sub = CfgNode({"A": {"B": {"C": 1}}})
    with pytest.raises(InvalidConfigError, match="'A.B' is a config node"):
        sub.A.merge_from_list(["B", "x"])
    assert isinstance(cfg.MODEL, CfgNode)


def test_overrides_are_coerced_to_the_old_type() -> None:
    cfg = typed_cfg()
    cfg.merge_from_list(
        [
            "MODEL.NUM_CLASSES", "20",
            "MODEL.NAME", "123",
            "MODEL.SIZE", "[320, 320]",
            "MODEL.PRETRAINED", "false",
            "SOLVER.LR", "1",
            "SOLVER.STEPS", "(3, 4)",
            "EMPTY", "[1]",
        ]
    )  # fmt: skip
    assert cfg.MODEL.NUM_CLASSES == 20
    assert cfg.MODEL.NAME == "123"
    assert cfg.MODEL.SIZE == (320, 320) and cfg.MODEL.PRETRAINED is False
    assert cfg.SOLVER.LR == 1.0 and type(cfg.SOLVER.LR) is float
    assert cfg.SOLVER.STEPS == [3, 4] and cfg.EMPTY == [1]
    cfg.merge_from_list(["SOLVER.LR", "nan"])
    assert math.isnan(cfg.SOLVER.LR)


def test_none_fits_every_key_including_str() -> None:
    cfg = typed_cfg()
    cfg.merge_from_list(["MODEL.NAME", "None", "MODEL.NUM_CLASSES", "None", "SOLVER", "None"])
    assert cfg.MODEL.NAME is None and cfg.MODEL.NUM_CLASSES is None and cfg.SOLVER is None
    cfg = typed_cfg()
    cfg.merge_from_list(["MODEL.NAME", "'None'"])  # quoted: the text
    assert cfg.MODEL.NAME == "None"


# ---------------------------------------------------------------- 5: tuples in flow lists


def test_tuples_inside_a_flow_list() -> None:
    cfg = CfgNode.load("SIZES: [(224, 224), (320, 320)]\nNESTED: [[(1, 2)], 3, 'a']\n")
    assert cfg.SIZES == [(224, 224), (320, 320)]
    assert cfg.NESTED == [[(1, 2)], 3, "a"]
    assert CfgNode.load(cfg.dump()) == cfg


def test_flow_list_that_is_no_literal_is_refused_clearly() -> None:
    with pytest.raises(InvalidConfigError, match=r"line 2.*\[\(1, 2\), res4\]"):
        CfgNode.load("A: 1\nB: [(1, 2), res4]\n")


def test_tuple_in_a_flow_mapping_is_refused_clearly() -> None:
    with pytest.raises(InvalidConfigError, match="line 1.*block style"):
        CfgNode.load("M: {SIZE: (224, 224), N: 1}\n")


# ---------------------------------------------------------------- 6: __BASE__


def test_base_constant_is_public() -> None:
    assert HierarchicalCfgNode.__BASE__ == "__BASE__"


def test_nested_base_is_refused(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("X: 1\n", encoding="utf-8")
    (tmp_path / "top.yaml").write_text("MODEL:\n  __BASE__: b.yaml\n  A: 1\n", encoding="utf-8")
    with pytest.raises(InvalidConfigError, match=r"top\.yaml.*'MODEL\.__BASE__'"):
        HierarchicalCfgNode.open(tmp_path / "top.yaml")


def test_relative_base_of_a_nameless_stream_is_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "b.yaml").write_text("X: 1\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BaseConfigNotFoundError, match="absolute path"):
        HierarchicalCfgNode.open(io.StringIO("__BASE__: b.yaml\n"))
    absolute = io.StringIO(f"__BASE__: {tmp_path / 'b.yaml'}\nY: 2\n")
    assert HierarchicalCfgNode.open(absolute) == {"X": 1, "Y": 2}


# ---------------------------------------------------------------- 7: copy=False


def test_copy_false_shares_every_value_and_makes_nodes_of_dicts() -> None:
    steps, obj = [1, 2], object()
    source = {"STEPS": steps, "SUB": {"OBJ": obj, "DEEP": {"L": steps}}}
    cfg = CfgNode(source, copy=False)
    assert cfg.STEPS is steps and cfg.SUB.OBJ is obj and cfg.SUB.DEEP.L is steps
    assert isinstance(cfg.SUB, CfgNode) and cfg.SUB is not source["SUB"]  # as documented
    cfg.SUB.NEW = 1
    assert "NEW" not in source["SUB"]
    copied = CfgNode(source)
    assert copied.STEPS is not steps and copied.SUB.DEEP.L is not steps
