"""YAML files a person edits: one-line errors, and no key silently given twice."""

import pytest

from platforms.yamlfile import YamlSyntaxError, read_yaml


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    """PyYAML keeps the last of two equal keys silently: a config with period_ms twice ran at
    the second value without a word."""
    f = tmp_path / "c.yaml"
    f.write_text("period_ms: 100\npolicy: maxfreq\nthermal:\n  margin_c: 5\n  margin_c: 6\n")
    with pytest.raises(
        YamlSyntaxError, match=r"line 5, column 3: .*'margin_c' given twice \(first at line 4\)"
    ):
        read_yaml(f)
    f.write_text("a: &base {x: 1, y: 2}\nb:\n  <<: *base\n  x: 3\n")  # a merge may be overridden
    assert read_yaml(f) == {"a": {"x": 1, "y": 2}, "b": {"x": 3, "y": 2}}
