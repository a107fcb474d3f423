"""docs/BACKENDS.md's per-family config key tables are generated from the parsers' registry;
this fails when a family's keys change without the documentation
(fix: python -m mi_transformer.keytable docs/BACKENDS.md)."""

from __future__ import annotations

from pathlib import Path

from mi_transformer.config import FAMILIES
from mi_transformer.keytable import BEGIN, END, key_table_markdown

DOC = Path(__file__).parents[2] / "docs" / "BACKENDS.md"


def test_backends_md_key_tables_match_the_family_registry():
    text = DOC.read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == key_table_markdown()


def test_every_family_is_in_the_key_table():
    table = key_table_markdown()
    for model_type in FAMILIES:
        assert f"| `{model_type}` |" in table


def test_parsers_read_only_the_keys_their_family_declares(tiny):
    """A parser that reads a key missing from its Family.reads would let that key through
    undocumented; run each tiny config through its parser and compare."""
    from mi_transformer.config import ConfigReader

    from tests.support.tiny_families import FAMILIES as TINY

    for name, (model_type, _) in TINY.items():
        family = FAMILIES.get(tiny(name).config["model_type"])
        if family is None:
            continue
        r = ConfigReader(tiny(name).config, "config.json")
        family.parse(r)
        undeclared = r.read - family.reads - {"model_type"}
        assert not undeclared, (name, sorted(undeclared))


def test_backends_md_hook_table_matches_the_models():
    """The "Hook points per family" block is what the families' tiny checkpoints report
    (fix: python -m tests.support.hook_table docs/BACKENDS.md)."""
    from tests.support import hook_table

    text = DOC.read_text()
    block = text[text.index(hook_table.BEGIN):text.index(hook_table.END) + len(hook_table.END)]
    assert block == hook_table.hook_table_markdown(hook_table.family_rows())


def test_every_family_has_a_row_in_the_hook_table():
    """A new family needs a tiny checkpoint in tests/support (or a WRAPPERS entry) so that
    its hook points are documented."""
    from tests.support import hook_table

    from mi_transformer.config.families_tl import MODEL_TYPE as TL_INTERNAL

    built = {mt for _, mt, _ in hook_table.tiny_configs()} | set(hook_table.WRAPPERS)
    # the plugin-internal HookedTransformer(cfg) checkpoint has no transformers class to
    # build a tiny one; its hook points are TransformerLens' own, checked key for key in
    # tests/tl/test_tl_from_config.py
    assert set(FAMILIES) - {TL_INTERNAL} <= built, sorted(set(FAMILIES) - built)

