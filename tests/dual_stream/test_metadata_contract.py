"""The splitter's field lists against AscendMetadata in the tree we ship.

attention_v1.py imports torch_npu kernels and does not import on CPU, so its source is
parsed: an upstream field the splitter does not know (or a known one that went away)
fails here, by name, instead of being copied unsplit into both micro-batches.
"""

from __future__ import annotations

import ast
import dataclasses

import conftest
from vllm_ascend.dual_stream.split import HANDLED_FIELDS, KNOWN_FIELDS, PASSTHROUGH_FIELDS, REQUIRED_DEFAULT_FIELDS
from vllm_ascend_patchset import contracts

from dual_stream.batches import FakeAscendMetadata, FakeAttentionState

ATTENTION_V1 = conftest.ASSEMBLED / "vllm_ascend" / "attention" / "attention_v1.py"
MASK_MODULE = conftest.ASSEMBLED / "vllm_ascend" / "attention" / "attention_mask.py"


_class = contracts.class_def


def ascend_metadata_fields() -> list[str]:
    return contracts.ascend_metadata_fields(ATTENTION_V1)


def test_every_ascend_metadata_field_is_handled_passed_through_or_required_default():
    upstream = ascend_metadata_fields()
    assert len(upstream) > 10, "AscendMetadata not found or not a dataclass of annotated fields"
    unknown = [name for name in upstream if name not in KNOWN_FIELDS]
    assert not unknown, f"AscendMetadata has new field(s) {unknown}: decide how dual_stream/split.py splits them"
    gone = sorted(KNOWN_FIELDS - set(upstream))
    assert not gone, f"AscendMetadata no longer has {gone}: update dual_stream/split.py"


def test_the_port_contract_reads_the_field_sets_the_splitter_uses():
    """``make port`` checks another upstream against split.py's literals; they must be these sets."""
    sets = contracts.splitter_field_sets(conftest.ROOT / "vllm_ascend_overlay" / contracts.SPLITTER)
    assert sets == {
        "HANDLED_FIELDS": HANDLED_FIELDS,
        "PASSTHROUGH_FIELDS": PASSTHROUGH_FIELDS,
        "REQUIRED_DEFAULT_FIELDS": frozenset(REQUIRED_DEFAULT_FIELDS),
    }
    assert contracts.metadata_contract(ATTENTION_V1.parents[1], conftest.ROOT / "vllm_ascend_overlay") == [
        contracts.ContractResult(
            "AscendMetadata fields",
            True,
            f"{len(ascend_metadata_fields())} fields, all known",
            "attention/attention_v1.py",
        )
    ]


def test_field_sets_do_not_overlap():
    assert not HANDLED_FIELDS & PASSTHROUGH_FIELDS
    assert not (HANDLED_FIELDS | PASSTHROUGH_FIELDS) & set(REQUIRED_DEFAULT_FIELDS)


def test_the_test_metadata_has_exactly_the_upstream_fields():
    assert [f.name for f in dataclasses.fields(FakeAscendMetadata)] == ascend_metadata_fields()


def test_the_test_states_are_the_upstream_attention_states():
    cls = _class(ast.parse(ATTENTION_V1.read_text()), "AscendAttentionState")
    names = [node.targets[0].id for node in cls.body if isinstance(node, ast.Assign)]
    assert names == [state.name for state in FakeAttentionState]


def test_the_mask_is_batch_independent_so_passing_it_through_is_sound():
    """get_attention_mask takes no batch argument and the builder passes none."""
    builder = _class(ast.parse(MASK_MODULE.read_text()), "AttentionMaskBuilder")
    method = next(n for n in builder.body if isinstance(n, ast.FunctionDef) and n.name == "get_attention_mask")
    assert [a.arg for a in method.args.args] == ["self", "causal", "model_config"]
    calls = [
        node
        for node in ast.walk(ast.parse(ATTENTION_V1.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get_attention_mask"
    ]
    assert calls, "AscendAttentionMetadataBuilder no longer calls get_attention_mask"
    for call in calls:
        assert [ast.unparse(a) for a in call.args] == ["common_attn_metadata.causal", "self.model_config"]
