"""Token positions: map character offsets to token indices (and back) for targeted analyses.

    python examples/token_positions.py [MODEL]
"""

from __future__ import annotations

import mi_core as mi
from mi_core.util.positions import token_to_char_span


def main(model: mi.MIModel | None = None) -> dict:
    if model is None:
        from _load import model_from_argv
        model = model_from_argv()
    text = "The Eiffel Tower is in Paris."
    chars = [text.index("Eiffel"), text.index("Tower") + 2, text.index("Paris"), len(text) - 1]
    convs = mi.convert_positions(model, text, chars)
    toks = model.to_str_tokens(model.to_tokens(text)[0])
    for c in convs:
        print(f"char {c.char_pos:2d} {text[c.char_pos]!r} -> token {c.token_index} "
              f"{toks[c.token_index]!r} span {c.span}")
    last = token_to_char_span(model, text, -1)
    print(f"last token covers characters {last}: {text[last[0]:last[1]]!r}")
    return {"indices": [c.token_index for c in convs]}


if __name__ == "__main__":
    main()
