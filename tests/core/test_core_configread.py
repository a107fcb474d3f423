"""mi_core.configread: the one strict typed reader the plugins' config parsers share."""

from __future__ import annotations

import pytest

from mi_core.configread import REQUIRED, ConfigFields, is_generic_harmless
from mi_core.errors import ConfigError, DictionaryError


def test_no_coercion_bool_is_not_int_string_is_not_flag_float_is_not_int():
    f = ConfigFields({"b": True, "s": "false", "x": 2.7, "n": True}, "cfg.json")
    with pytest.raises(ConfigError, match=r"cfg.json: key 'b' = True: expected an integer, got bool"):
        f.integer("b")
    with pytest.raises(ConfigError, match=r"key 's' = 'false': expected true or false, got str"):
        f.flag("s")
    with pytest.raises(ConfigError, match=r"key 'x' = 2.7: expected an integer, got float"):
        f.integer("x")
    with pytest.raises(ConfigError, match=r"key 'n' = True: expected a number, got bool"):
        f.number("n")


def test_ranges_choices_and_missing_name_the_file_and_key():
    f = ConfigFields({"i": 0, "r": -1.5, "inf": float("inf"), "c": "z"}, "h.json")
    with pytest.raises(ConfigError, match=r"h.json: key 'i' = 0: must be >= 1"):
        f.integer("i")
    assert f.integer("i", minimum=0) == 0
    with pytest.raises(ConfigError, match=r"key 'r' = -1.5: must be a finite number > 0"):
        f.number("r", gt=0)
    with pytest.raises(ConfigError, match=r"key 'inf' = inf: must be a finite number"):
        f.number("inf")
    with pytest.raises(ConfigError, match=r"key 'c' = 'z': expected one of a, b"):
        f.text("c", choices=("a", "b"))
    with pytest.raises(ConfigError, match=r"h.json: required field 'gone' is missing"):
        f.integer("gone", REQUIRED)
    assert f.integer("gone", 7) == 7 and f.text("gone", None) is None


def test_error_class_is_a_parameter_and_fallback_fills_absent_keys():
    f = ConfigFields({"a": None}, "sae.json", error=DictionaryError, fallback={"a": 3})
    assert f.integer("a") == 3
    with pytest.raises(DictionaryError, match="sae.json: required field 'b' is missing"):
        f.integer("b")


def test_read_keys_are_tracked_and_unread_skips_generic_harmless_keys():
    f = ConfigFields({"used": 1, "other": 2, "attention_dropout": 0.1, "use_cache": True,
                      "is_encoder_decoder": True, "empty": None}, "c.json")
    f.integer("used")
    assert f.read == {"used"}
    # is_encoder_decoder is harmless only at its default (False); a null counts as absent.
    assert f.unread() == ["is_encoder_decoder", "other"]
    assert f.unread(harmless=["other"]) == ["is_encoder_decoder"]
    assert is_generic_harmless("is_encoder_decoder", False)
