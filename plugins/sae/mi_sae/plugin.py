"""Registration of mi-sae with mi-core (the same hooks a third-party plugin implements)."""

from __future__ import annotations

from mi_core import plugin_impl
from mi_core.plugin import DictionaryFormat


@plugin_impl
def mi_register_dictionary_formats() -> list[DictionaryFormat]:
    from mi_sae.formats import gemmascope, llamascope, saelens, sparsify

    return [saelens.FORMAT, gemmascope.FORMAT, sparsify.FORMAT, llamascope.FORMAT]
