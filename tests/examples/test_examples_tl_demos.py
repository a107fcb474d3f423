"""TransformerLens' own demo notebooks run cell by cell under ``from mi_core.tl import ...``
(the imports and the loading lines changed, nothing else) and show what TransformerLens shows
on the same weights.

The notebooks' code cells are stored verbatim in ``tests/examples/tl_demos/*.json``, from
TransformerLensOrg/TransformerLens tag v2.18.0, commit
589acd47c7a4e100754f16a840f73229d56e8196 (each file names its source). Each cell runs on
TransformerLens (the reference: its own conversion, processing and defaults on the same files,
tests.support.tl_demo_models) and on the port (tests.support.tl_demos, which rewrites
``transformer_lens`` to ``mi_core.tl`` in import lines and the loading lines below); every
printed number is compared to 1e-4 relative (or one unit of the last printed digit, the
rounding of a printed figure), every plotted array to 1e-4 of its largest value, the value
each cell shows as text, and an error where TransformerLens raises one must be of the same
kind.

Models (no hub here): ``gpt2-small`` is SmolLM2-135M-Instruct (the trained model this project
ships, GGUF saved as an HF directory); where a cell loops a library call over every layer and
head (the patching demos) SmolLM2 cut to its first 3 layers (the same trained weights); the
demos' second models (distilgpt2, attn-only-2l, gpt2-xl) a GPT-2-shaped tiny model with random
weights and SmolLM2's tokenizer. What each demo trims or skips, and why, is in ``DEMOS``;
trims apply to both sides alike.
"""

from __future__ import annotations

import os

import pytest

from tests.support import tl_demos as td
from tests.support.tl_demo_models import reset_tl, tl_checkpoints, tl_model  # noqa: F401

pytest.importorskip("transformer_lens")
pytestmark = pytest.mark.slow

SETUP = "Colab / IPython setup: pip installs and notebook magics, nothing to compare"
HUB = "downloads another model from the hub (no hub here)"
RUNTIME = "runtime: the same code on fewer iterations (2-core CI)"


def _load(model: str, name: str, rest: str = "") -> tuple[str, str]:
    """(the reference's line, the port's line) loading checkpoint `name` as `model`; both
    keep the random state (tests.support.tl_demos.same_rng: TransformerLens draws random
    numbers while building a model, which would shift the cells' later draws)."""
    return (f'with _same_rng(): {model} = _reference("{name}")',
            f"with _same_rng(): {model} = HookedTransformer.from_pretrained("
            f"CHECKPOINTS[{name!r}]{rest})")


DEMOS = {
    "Main_Demo": td.Demo(
        "Main_Demo",
        loads={17: ('model = HookedTransformer.from_pretrained("gpt2-small", device=device)',
                    *_load("model", "smollm2", ", device=device")),
               52: ('distilgpt2 = HookedTransformer.from_pretrained("distilgpt2", '
                    'device=device)', *_load("distilgpt2", "gpt2", ", device=device"))},
        trims=[(37, "for layer in tqdm.tqdm(range(model.cfg.n_layers)):",
                "for layer in tqdm.tqdm(range(1)):", RUNTIME + ": layer 0 only"),
               (44, "batch_size = 10", "batch_size = 2", RUNTIME),
               (124, "max_new_tokens=50", "max_new_tokens=8", RUNTIME)],
        # 116-120: the full OV circuit W_E @ OV @ W_U of SmolLM2 holds two [30, 9, 49152, 64]
        # factors (3.4 GB each); tests/tl compares the same cells on the GPT-2-shaped model
        skip={4: SETUP, 116: "the full OV circuit's factors take 7 GB on SmolLM2 (memory)",
              117: "uses cell 116", 118: "uses cell 116", 120: "uses cell 116", 137: HUB,
              144: HUB, 146: "plots cell 144's results"}),
    "Exploratory_Analysis_Demo": td.Demo(
        "Exploratory_Analysis_Demo",
        # refactor_factored_attn_matrices=True is refused on rotary models by TransformerLens
        # itself (and by the port, test_tl_hooked_transformer): SmolLM2 loads without it
        loads={18: ('model = HookedTransformer.from_pretrained(\n    "gpt2-small",\n'
                    '    center_unembed=True,\n    center_writing_weights=True,\n'
                    '    fold_ln=True,\n    refactor_factored_attn_matrices=True,\n)',
                    *_load("model", "smollm2",
                           ", center_unembed=True, center_writing_weights=True, fold_ln=True"))},
        trims=[(c, "for layer in range(model.cfg.n_layers):", "for layer in range(2):",
                RUNTIME) for c in (62, 67, 73, 79, 85)],
        skip={6: SETUP}),
    "Activation_Patching_in_TL_Demo": td.Demo(
        "Activation_Patching_in_TL_Demo",
        loads={14: ('model = HookedTransformer.from_pretrained("gpt2-small")',
                    *_load("model", "smollm2_3l")),
               34: ('attn_only = HookedTransformer.from_pretrained("attn-only-2l")',
                    *_load("attn_only", "gpt2"))},
        trims=[(19, "DO_SLOW_RUNS = True", "DO_SLOW_RUNS = False", RUNTIME),
               (34, "batch = 4\nseq_len = 20", "batch = 2\nseq_len = 10", RUNTIME)],
        skip={4: SETUP}),
    "Head_Detector_Demo": td.Demo(
        "Head_Detector_Demo",
        loads={18: ('model = HookedTransformer.from_pretrained("gpt2-small", device=device)',
                    *_load("model", "smollm2", ", device=device"))},
        trims=[(49, "for i in tqdm(range(100)):", "for i in tqdm(range(2)):", RUNTIME)],
        skip={5: SETUP}),
    "Attribution_Patching_Demo": td.Demo(
        "Attribution_Patching_Demo",
        loads={12: ('model = HookedTransformer.from_pretrained("gpt2-small")',
                    *_load("model", "smollm2_3l")),
               56: ('gpt2_xl = HookedTransformer.from_pretrained("gpt2-xl")',
                    *_load("gpt2_xl", "gpt2"))},
        # TransformerLens (2.18 as 3.x) refuses a hook at hook_attn_in / hook_mlp_in while
        # use_attn_in / use_hook_mlp_in are off, and cell 18's filter ("_input" not in the
        # name) selects them: there the notebook fails, and every attribution cell after it
        # with a NameError. The filter leaves those two switched-off points out (on both
        # sides), so the attribution analysis itself is compared.
        trims=[(18, 'filter_not_qkv_input = lambda name: "_input" not in name',
                'filter_not_qkv_input = lambda name: "_input" not in name and not '
                'name.endswith(("attn_in", "mlp_in"))',
                "TransformerLens refuses the notebook's filter (hooks at switched-off "
                "points)")],
        # Cells 37 and 51 read GPT-2 small's layers 5-11: on the 3-layer trim both sides raise
        # the same error kind (IndexError, KeyError), which is what they compare. The trim is
        # kept: cells 43 and 47 run (3 x 15 + 5 x 9) forwards of 8 prompts per layer on each
        # side, and the 12 layers these cells read would make the demo ~4x as long.
        skip={4: SETUP, 52: RUNTIME + " (activation patching of every head and position, "
              "which the Activation Patching demo covers)", 54: "uses cell 52"}),
}


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_port_changes_only_imports_and_loading_lines(name):
    """Cell by cell, the port is the notebook with its ``transformer_lens`` imports and its
    loading lines replaced; nothing else differs (the trims, applied to both sides, aside)."""
    demo = DEMOS[name]
    trimmed = {**dict(td.notebook(name)["cells"])}
    for cell, old, new, _why in demo.trims:
        trimmed[cell] = trimmed[cell].replace(old, new)
    imports = 0
    for cell, port, _ in td.prepare(demo, "mi"):
        original = trimmed[cell]
        if cell in demo.loads:
            original = original.replace(demo.loads[cell][0], demo.loads[cell][2])
        for a, b in zip(original.split("\n"), port.split("\n"), strict=True):
            if a != b:
                assert "transformer_lens" in a and b.lstrip().startswith(
                    ("from mi_core.tl", "import mi_core.tl")), (cell, a, b)
                imports += 1
    assert imports > 0

@pytest.fixture(scope="module")
def references(tl_checkpoints):  # noqa: F811
    """checkpoint name -> TransformerLens' model of it, built once for all the demos (none of
    them edits weights; hooks and switches are reset before each demo)."""
    built: dict = {}

    def get(kind: str):
        if kind not in built:
            built[kind] = tl_model(tl_checkpoints[kind])
        reset_tl(built[kind])
        return built[kind]

    return get


#: the demos compared in every run; the others take minutes each on 2 cores (TransformerLens'
#: side above all) and run with MI_TL_DEMOS=1 (docs/TRANSFORMERLENS.md)
EVERY_RUN = {"Head_Detector_Demo"}


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demo_shows_what_transformerlens_shows(name, tl_checkpoints, references):  # noqa: F811
    if name not in EVERY_RUN and not os.environ.get("MI_TL_DEMOS"):
        pytest.skip(f"{name} takes minutes on 2 cores: run with MI_TL_DEMOS=1")
    demo = DEMOS[name]
    paths = {k: str(v) for k, v in tl_checkpoints.items()}
    theirs = td.run_cells(td.prepare(demo, "tl"), {"_reference": references})
    ours = td.run_cells(td.prepare(demo, "mi"), {"CHECKPOINTS": paths})
    problems = td.compare(ours, theirs, figure_rel=demo.figure_rel)
    assert not problems, "\n".join(p[:600] for p in problems)
    seen = td.counted(theirs)
    print(f"{name}: compared {seen}")  # shown with -s / -rP
    assert seen["numbers"] + seen["figures"] > 0, seen  # the comparison compared something
