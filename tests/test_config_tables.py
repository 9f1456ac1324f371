"""Config sections: one source per key (the dataclass fields), alike checks, docs that match.

Both ``profiling_chunk_config`` and ``dual_stream_config`` go through ``config_table``: the
same value (128.0, True, "1", 1e12, ...) meets the same rule in both, every problem is
reported at once, and each reads ``<section>.<key>=<value>: <fix>``. The docs' tables are
rendered from the same metadata and must be what the docs show.
"""

from __future__ import annotations

import re

import pytest
from vllm_ascend import config_table
from vllm_ascend.core.cpp_config import CONFIG_KEY as CPP_KEY
from vllm_ascend.core.cpp_config import CppConfig, CppConfigError, parse_cpp_config
from vllm_ascend.dual_stream.config import CONFIG_KEY as DS_KEY
from vllm_ascend.dual_stream.config import DualStreamConfig
from vllm_ascend_patchset import config_docs
from vllm_ascend_patchset.paths import ROOT

SECTIONS = {
    "cpp": (CppConfig, CPP_KEY, lambda raw: parse_cpp_config(raw), CppConfigError, "docs/cpp.md"),
    "dual-stream": (DualStreamConfig, DS_KEY, DualStreamConfig.from_dict, ValueError, "docs/dual-stream.md"),
}


def test_every_documented_section_is_checked():
    assert {doc for *_rest, doc in SECTIONS.values()} == set(config_docs.SECTIONS)
    for _section, _key, _parse, _error, doc in SECTIONS.values():
        assert config_docs.section_class(doc) is _section


@pytest.mark.parametrize("name", SECTIONS)
def test_the_docs_table_lists_the_keys_defaults_ranges_and_meanings_of_the_fields(name):
    section, _key, _parse, _error, doc = SECTIONS[name]
    expected = config_docs.render(section)
    assert config_docs.documented(doc) == expected, f"run make config-docs; {doc}'s table must read:\n" + "\n".join(
        expected
    )
    assert len(expected) == 2 + len(config_table.settings(section))


def test_upstreams_cpp_guide_gets_the_same_table():
    """The docs patch of patches/source/ gives upstream's CPP feature guide the table
    ``make config-docs`` renders (the additional_config reference links to it)."""
    text = (ROOT / "patches/source/0202-cpp-user-docs.patch").read_text()
    guide = text.split("+++ b/docs/source/user_guide/feature_guide/dynamic_chunk_pipeline_parallel.md\n", 1)[1]
    lines = [line[1:] for line in guide.splitlines() if line.startswith(("+", " "))]
    start = lines.index(config_docs.HEADER)
    end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or not lines[i].startswith("|"))
    expected = config_docs.render(CppConfig)
    assert lines[start:end] == expected, "patches/source/0202-cpp-user-docs.patch's table must read:\n" + "\n".join(
        expected
    )


def test_config_docs_rewrites_a_stale_table_and_keeps_the_rest(tmp_path):
    doc = "docs/dual-stream.md"
    (tmp_path / "docs").mkdir()
    original = (ROOT / doc).read_text()
    stale = original.replace("| `balance_threshold` | `1.0` |", "| `balance_threshold` | `2.0` |")
    assert stale != original
    (tmp_path / doc).write_text(stale)
    assert config_docs.write(doc, DualStreamConfig, root=tmp_path)
    assert (tmp_path / doc).read_text() == original
    assert not config_docs.write(doc, DualStreamConfig, root=tmp_path)


@pytest.mark.parametrize("name", SECTIONS)
def test_every_field_is_a_documented_setting(name):
    section = SECTIONS[name][0]
    fields = [f.name for f in section.__dataclass_fields__.values()]
    assert list(config_table.settings(section)) == fields
    for key, (_default, spec) in config_table.settings(section).items():
        assert spec.meaning and "|" not in spec.meaning, key


@pytest.mark.parametrize("name", SECTIONS)
def test_the_defaults_of_the_metadata_are_what_an_empty_section_gives(name):
    section, _key, parse, _error, _doc = SECTIONS[name]
    config = parse({})
    for key, (default, spec) in config_table.settings(section).items():
        expected = getattr(config, spec.default_from) if spec.default_from else default
        assert getattr(config, key) == expected, key
    assert parse(None) == config


@pytest.mark.parametrize("name", SECTIONS)
def test_every_unknown_key_is_reported_with_the_known_ones(name):
    section, key, parse, error, _doc = SECTIONS[name]
    with pytest.raises(error) as info:
        parse({"enabled": False, "enabeld": True, "zz_extra": 1, "aa_extra": None})
    message = str(info.value)
    assert message.startswith(f"{key}: 3 problems:")
    for unknown, value in (("enabeld", True), ("zz_extra", 1), ("aa_extra", None)):
        assert f"{key}.{unknown}={value!r}: not a known key" in message
    assert f"{key}.enabeld=True: not a known key; did you mean enabled?" in message  # a near spelling is named
    assert "zz_extra=1: not a known key\n" in message + "\n" and "did you mean" not in message.split("zz_extra")[1]
    assert message.endswith(f"\nThe keys of {key} are {', '.join(config_table.settings(section))}.")


@pytest.mark.parametrize("name", SECTIONS)
@pytest.mark.parametrize("slip", ["Enabled", "ENABLED", "enable", "en-abled"])
def test_a_key_in_another_case_or_spelling_names_the_known_key(name, slip):
    _section, key, parse, error, _doc = SECTIONS[name]
    with pytest.raises(error) as info:
        parse({slip: True})
    assert str(info.value).splitlines()[0] == f"{key}.{slip}=True: not a known key; did you mean enabled?"


@pytest.mark.parametrize("name", SECTIONS)
@pytest.mark.parametrize(
    "unknown, shown",
    [
        ("enabled\u200b", r"'enabled\u200b'"),  # zero-width space
        ("\ufeffenabled", r"'\ufeffenabled'"),  # byte order mark
        ("en\u00adabled", r"'en\xadabled'"),  # soft hyphen
        ("enabled\t", r"'enabled\t'"),
        ("enabled ", "'enabled '"),
    ],
    ids=["zero-width space", "BOM", "soft hyphen", "tab", "trailing space"],
)
def test_a_key_with_characters_that_do_not_show_is_escaped_and_the_known_key_named(name, unknown, shown):
    _section, key, parse, error, _doc = SECTIONS[name]
    with pytest.raises(error) as info:
        parse({unknown: True})
    line = str(info.value).splitlines()[0]
    assert line == f"{key}.{shown}=True: not a known key; did you mean enabled? Delete the characters that do not show"


@pytest.mark.parametrize("name", SECTIONS)
def test_a_key_that_does_not_read_as_written_is_quoted_without_a_guess_when_none_fits(name):
    _section, key, parse, error, _doc = SECTIONS[name]
    with pytest.raises(error) as info:
        parse({"zz\u200b": 1, "k" * 5000: 2, "": 3})
    lines = str(info.value).splitlines()
    assert f"  {key}.'zz\\u200b'=1: not a known key" in lines and f"  {key}.''=3: not a known key" in lines
    assert all(len(line) < 300 for line in lines) and not any("did you mean" in line for line in lines)


@pytest.mark.parametrize("name", SECTIONS)
def test_every_bad_value_is_reported_at_once(name):
    section, key, parse, error, _doc = SECTIONS[name]
    table = config_table.settings(section)
    raw = {k: "not a value" for k in table if table[k][1].kind is not str}
    with pytest.raises(error) as info:
        parse(raw)
    lines = str(info.value).splitlines()
    assert lines[0] == f"{key}: {len(raw)} problems:"
    assert [line.strip().split("=")[0] for line in lines[1:]] == [f"{key}.{k}" for k in raw]
    for line in lines[1:]:
        assert "='not a value': must be " in line and "(default " in line


def _keys_of_kind(kind):
    return [
        (name, key)
        for name, (section, *_rest) in SECTIONS.items()
        for key, (_default, spec) in config_table.settings(section).items()
        if spec.kind is kind and not spec.choices
    ]


def _parse(name, raw):
    return SECTIONS[name][2](raw)


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(int))
def test_an_integral_float_is_an_integer_in_every_section(name, key):
    spec = config_table.settings(SECTIONS[name][0])[key][1]
    value = float(min(max(128, spec.low or 0), spec.high or 128))  # 128.0, or the nearest bound
    parsed = getattr(_parse(name, {key: value}), key)
    assert parsed == int(value) and type(parsed) is int


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(int))
@pytest.mark.parametrize("bad", [12.5, True, "128", float("nan"), float("inf"), [1]])
def test_ints_refuse_alike(name, key, bad):
    section, section_key, parse, error, _doc = SECTIONS[name]
    spec = config_table.settings(section)[key][1]
    with pytest.raises(error) as info:
        parse({key: bad})
    assert str(info.value).startswith(f"{section_key}.{key}={bad!r}: must be {spec.expects()} (default ")


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(int))
def test_every_integer_key_has_a_finite_upper_bound_the_docs_show(name, key):
    """A window, a count or a token number past it cannot be meant, and would fail only later (a deque's
    maxlen overflows after the whole start-up profile ran); a key without its own bound takes the ceiling."""
    spec = config_table.settings(SECTIONS[name][0])[key][1]
    assert spec.high is not None and spec.high <= config_table.INT_CEILING
    assert spec.expects().startswith(f"an integer in [{spec.low:.0f}, {spec.high:.0f}]")


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(int) + _keys_of_kind(float))
@pytest.mark.parametrize(
    ("huge", "shown"),
    [(10**400, None), (-(10**5000), "<a negative integer of about 5000 digits>")],
    ids=["10**400", "-10**5000"],
)
def test_a_huge_integer_is_refused_in_one_short_line_naming_the_key(name, key, huge, shown):
    """JSON and the Python API put no limit on an integer's size, and str() refuses one past 4300 digits:
    every number key refuses it naming the key, in a line a person can read."""
    section, section_key, parse, error, _doc = SECTIONS[name]
    spec = config_table.settings(section)[key][1]
    with pytest.raises(error) as info:
        parse({key: huge})
    message = str(info.value)
    shown = shown or "<an integer of about 400 digits>"
    assert message.startswith(f"{section_key}.{key}={shown}: must be {spec.expects()} (default "), message
    assert len(message) < 300


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(int))
def test_a_huge_float_is_refused_by_every_integer_key(name, key):
    section, section_key, parse, error, _doc = SECTIONS[name]
    with pytest.raises(error, match=re.escape(f"{section_key}.{key}=1e+19: must be an integer in [")):
        parse({key: 1e19})


@pytest.mark.parametrize("name", SECTIONS)
def test_what_cannot_be_printed_in_full_is_shortened_in_every_message(name):
    section, section_key, parse, error, _doc = SECTIONS[name]
    huge = 10**5000
    with pytest.raises(error) as info:
        parse({"unknown": huge, huge: "x", "enabled": [huge], "other": "y" * 100_000})
    lines = str(info.value).splitlines()
    assert lines[0] == f"{section_key}: 4 problems:"
    assert f"  {section_key}.unknown=<an integer of about 5000 digits>: not a known key" in lines
    assert f"  {section_key}.<an integer of about 5000 digits>='x': not a known key" in lines
    assert f"  {section_key}.enabled=[<an integer of about 5000 digits>]: must be true or false (default false)" in (
        lines
    )
    assert all(len(line) < 300 for line in lines)
    with pytest.raises(error, match=re.escape(f"{section_key}=<an integer of about 5000 digits>: must be a JSON")):
        parse(huge)


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(float))
@pytest.mark.parametrize("bad", [True, "0.5", float("nan"), float("inf"), None])
def test_floats_refuse_alike(name, key, bad):
    section, section_key, parse, error, _doc = SECTIONS[name]
    spec = config_table.settings(section)[key][1]
    if bad is None and spec.nullable:
        assert getattr(parse({key: None}), key) is None
        return
    with pytest.raises(error) as info:
        parse({key: bad})
    assert str(info.value).startswith(f"{section_key}.{key}={bad!r}: must be {spec.expects()} (default ")


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(bool))
@pytest.mark.parametrize("bad", [1, 0, "true", None])
def test_bools_refuse_alike(name, key, bad):
    section, section_key, parse, error, _doc = SECTIONS[name]
    with pytest.raises(error, match=re.escape(f"{section_key}.{key}={bad!r}: must be true or false (default ")):
        parse({key: bad})


@pytest.mark.parametrize(("name", "key"), _keys_of_kind(int) + _keys_of_kind(float))
def test_ranges_hold_at_their_bounds_and_refuse_past_them(name, key):
    section, section_key, parse, error, _doc = SECTIONS[name]
    spec = config_table.settings(section)[key][1]
    kind = spec.kind
    step = 1 if kind is int else 1e-9
    if spec.low is not None:
        inside = spec.low + step if spec.low_open else spec.low
        assert getattr(parse({key: kind(inside)}), key) == kind(inside)
        outside = spec.low if spec.low_open else spec.low - step
        with pytest.raises(error, match=re.escape(f"{section_key}.{key}={kind(outside)!r}: must be ")):
            parse({key: kind(outside)})
    if spec.high is not None:
        assert getattr(parse({key: kind(spec.high)}), key) == kind(spec.high)
        with pytest.raises(error, match=re.escape(f"{section_key}.{key}={kind(spec.high + step)!r}: must be ")):
            parse({key: kind(spec.high + step)})


@pytest.mark.parametrize("name", SECTIONS)
@pytest.mark.parametrize("raw", [[True], "enabled", 1])
def test_a_section_that_is_not_an_object(name, raw):
    _section, key, parse, error, _doc = SECTIONS[name]
    with pytest.raises(error, match=re.escape(f"{key}={raw!r}: must be a JSON object such as")):
        parse(raw)


def test_the_expected_values_read_plainly():
    spec = config_table.Setting
    assert spec(int, "m", low=8, high=4096).expects() == "an integer in [8, 4096]"
    assert spec(int, "m", low=1, nullable=True).expects() == "an integer >= 1, or null"
    assert spec(float, "m", low=0, high=1, low_open=True).expects() == "a number in (0, 1]"
    assert spec(float, "m", low=0, low_open=True).expects() == "a number > 0"
    assert spec(str, "m", choices=("a", "b")).expects() == "one of 'a', 'b'"
    assert spec(bool, "m").expects() == "true or false"


@pytest.mark.parametrize("name", SECTIONS)
def test_keys_given_without_enabled_leave_the_feature_off_with_one_warning(name, caplog, monkeypatch):
    _section, key, parse, _error, _doc = SECTIONS[name]
    monkeypatch.setattr(config_table, "_WARNED_OFF", set())
    other = next(k for k in config_table.settings(_section) if k != "enabled")
    default = config_table.settings(_section)[other][0]
    with caplog.at_level("WARNING", logger="vllm_ascend.config_table"):
        assert not parse({}).enabled and not parse({"enabled": False, other: default}).enabled
        assert not [r for r in caplog.records if r.levelname == "WARNING"], "nothing to say: off as written"
        off = parse({other: default})
        parse({other: default})  # the engine parses its config again: no second warning
    assert not off.enabled
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert (
        warnings[0].startswith(f'[PatchSet] {key} sets {other} but not "enabled"') and '"enabled": true' in warnings[0]
    )


def test_a_section_refused_outside_a_gathering_raises_at_once():
    with pytest.raises(CppConfigError, match="first"):
        config_table.refuse(CppConfigError("first"))


def test_a_gathering_raises_every_refused_section_once_in_the_first_ones_type():
    with pytest.raises(CppConfigError) as error, config_table.sections_refused_together():
        config_table.refuse(CppConfigError("a: one"))  # kept, not raised
        config_table.refuse(ValueError("b: two"))
    assert str(error.value) == "a: one\nb: two"
    with config_table.sections_refused_together():
        pass  # nothing refused: nothing raised
    with pytest.raises(ValueError, match="alone"):
        config_table.refuse(ValueError("alone"))  # the gathering is over


def test_an_error_of_the_build_itself_propagates_and_ends_the_gathering():
    with pytest.raises(KeyError), config_table.sections_refused_together():
        config_table.refuse(ValueError("kept"))
        raise KeyError("upstream's own check")
    with pytest.raises(ValueError, match="at once"):
        config_table.refuse(ValueError("at once"))
