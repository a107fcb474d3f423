"""``model.tokenizer.apply_chat_template`` (mi_core.tl.chat_template) renders and tokenizes
exactly as transformers' ``apply_chat_template`` on the same files: SmolLM2-135M-Instruct's GGUF
(its ``tokenizer.chat_template`` metadata) and a tiny checkpoint directory whose template uses
the sandbox's globals (``raise_exception``, ``namespace``, ``tojson``, loop controls, the
``{% generation %}`` tag, ``trim_blocks`` / ``lstrip_blocks``); templates from
``chat_template.jinja`` / ``additional_chat_templates/`` / a list in ``tokenizer_config.json``
are chosen as transformers chooses them; hostile templates stay in the sandbox; no template is
a typed ValueError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.plugin import HFTokenizer
from mi_core.tl.chat_template import ChatTemplateError
from mi_core.tl.errors import TLTokenizerError, TLTypeError, TLValueError
from mi_core.tl.tokenizer import TLTokenizer

jinja2 = pytest.importorskip("jinja2")
transformers = pytest.importorskip("transformers")

SYSTEM = {"role": "system", "content": "Be brief."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [SYSTEM, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Say <|im_end|> <s> literally"},
     {"role": "assistant", "content": "The answer is "}],
]

# A template exercising transformers' environment: trim_blocks / lstrip_blocks (indented tags,
# newlines after tags), raise_exception, namespace, loop controls, tojson without HTML escapes,
# the {% generation %} tag, a keyword argument (`persona`), bos/eos tokens, reasoning aliases.
TINY_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(users=0) %}
{% if tools %}
    {{ '<|system|>tools: ' + tools | tojson + eos_token }}
{% endif %}
{% for m in messages %}
    {% if m['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('unknown role ' + m['role']) }}
    {% endif %}
    {% if m['role'] == 'user' %}{% set ns.users = ns.users + 1 %}{% endif %}
    {% if loop.index0 > 6 %}{% break %}{% endif %}
    {% if m['role'] == 'assistant' %}
<|assistant|>{% if m.reasoning_content is defined %}[{{ m.reasoning_content }}]{% endif %}
{% generation %}{{ m['content'] | trim }}{% endgeneration %}{{ eos_token }}
    {% else %}
<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|assistant|>{{ persona | default('') }}
{% endif %}
{{ '' if ns.users else raise_exception('no user message') }}"""


def _tiny_tokenizer(directory: Path) -> None:
    """A byte-level BPE tokenizer.json that adds BOS itself, with chat special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [m["content"] for c in CONVERSATIONS for m in c] + ["The capital of France"]
    tok.train_from_iterator(corpus * 5, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 0)])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))


def _config(directory: Path, **extra) -> None:
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "pad_token": "</s>",
         **extra}))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny Llama checkpoint (config, weights) with the tokenizer and TINY_TEMPLATE in its
    tokenizer_config.json."""
    d = tmp_path_factory.mktemp("chat") / "tiny"
    _tiny_tokenizer(d)
    _config(d, chat_template=TINY_TEMPLATE)
    vocab = json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]
    cfg = transformers.LlamaConfig(vocab_size=len(vocab) + 5, hidden_size=16, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=32,
                                   max_position_embeddings=256)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def _pair_dir(directory: Path):
    """(transformers' tokenizer, ours) of a checkpoint directory."""
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    return hf, TLTokenizer(HFTokenizer.from_directory(directory))


def _same_everywhere(hf, ours, conversations, **kw) -> None:
    """Text, ids and the padded batch agree for each conversation, with and without the
    generation prompt, and continuing the final message."""
    for conv in conversations:
        for opts in ({"add_generation_prompt": False}, {"add_generation_prompt": True},
                     {"continue_final_message": True}):
            text = hf.apply_chat_template(conv, tokenize=False, **opts, **kw)
            assert ours.apply_chat_template(conv, tokenize=False, **opts, **kw) == text
            ids = hf.apply_chat_template(conv, return_dict=False, **opts, **kw)
            assert ours.apply_chat_template(conv, **opts, **kw) == ids
            assert ids == hf(text, add_special_tokens=False)["input_ids"]
    ref = hf.apply_chat_template(conversations, padding=True, return_tensors="pt",
                                 add_generation_prompt=True, **kw)
    out = ours.apply_chat_template(conversations, padding=True, return_tensors="pt",
                                   return_dict=True, add_generation_prompt=True, **kw)
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(out[key], ref[key]), key


# -- the embedded SmolLM2 GGUF -----------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_pair(smollm2_gguf_path):
    """transformers' tokenizer of the GGUF (``gguf_file=``; ~4 s) and ours of the same file."""
    from mi_core.gguf import read_gguf_header
    from mi_transformer.gguf.tokenizer import gguf_tokenizer

    hf = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf_path.parent),
                                                    gguf_file=smollm2_gguf_path.name)
    return hf, TLTokenizer(gguf_tokenizer(read_gguf_header(smollm2_gguf_path)))


def test_smollm2_gguf_template_renders_and_tokenizes_as_transformers(smollm2_pair) -> None:
    hf, ours = smollm2_pair
    assert ours.chat_template == hf.chat_template and "<|im_start|>" in ours.chat_template
    _same_everywhere(hf, ours, CONVERSATIONS)
    # one conversation with return_tensors: [1, seq]; return_dict: ids and mask
    ids = ours.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True,
                                   return_tensors="pt")
    assert ids.shape[0] == 1 and ids.dtype == torch.long
    assert ids[0].tolist() == hf.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True,
                                                     return_dict=False)
    assert ours.decode(ids[0]).endswith("<|im_start|>assistant\n")


def test_tokenizer_object_given_to_hooked_transformer_keeps_its_template(smollm2_pair) -> None:
    """``HookedTransformer(model, tokenizer=hf)`` rewrites the tokenizer through a temporary
    directory; its chat template comes along."""
    from mi_core.tl.hf_objects import mi_tokenizer

    hf, _ = smollm2_pair
    ours = TLTokenizer(mi_tokenizer(hf))
    _same_everywhere(hf, ours, CONVERSATIONS[:2])


# -- a tiny checkpoint directory -----------------------------------------------------------------
def test_tiny_directory_template_renders_and_tokenizes_as_transformers(tiny_dir) -> None:
    hf, ours = _pair_dir(tiny_dir)
    _same_everywhere(hf, ours, CONVERSATIONS)
    tools = [{"type": "function", "function": {"name": "f", "description": "a < b & c > 'd'",
                                               "parameters": {"type": "object"}}}]
    reasoning = [CONVERSATIONS[0][0], {"role": "assistant", "content": "ok", "thinking": "hm"}]
    for kw in ({"tools": tools}, {"persona": "Ada"}):  # tojson unescaped; template keywords
        _same_everywhere(hf, ours, CONVERSATIONS[:2], **kw)
    _same_everywhere(hf, ours, [reasoning])
    with pytest.raises(jinja2.exceptions.TemplateError, match="unknown role tool"):
        hf.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="unknown role tool") as err:
        ours.apply_chat_template([{"role": "tool", "content": "x"}])
    assert isinstance(err.value, (mi.TokenizerError, jinja2.exceptions.TemplateError))


def test_mi_model_and_hooked_transformer_expose_apply_chat_template(tiny_dir) -> None:
    from mi_core.tl import HookedTransformer

    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    conv = CONVERSATIONS[1]
    ref = hf.apply_chat_template(conv, add_generation_prompt=True, return_dict=False)
    model = mi.MIModel.from_pretrained(tiny_dir)
    ids = model.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt")
    assert ids.tolist() == [ref]
    assert model.apply_chat_template(conv, tokenize=False) == hf.apply_chat_template(
        conv, tokenize=False)
    tl = HookedTransformer.from_pretrained(str(tiny_dir))
    assert tl.tokenizer.apply_chat_template(conv, add_generation_prompt=True) == ref
    assert tl.tokenizer.get_chat_template() == TINY_TEMPLATE


def test_template_sources_are_chosen_as_transformers_chooses(tmp_path) -> None:
    """chat_template.jinja beats tokenizer_config.json; with additional_chat_templates/ the
    templates are named ("default" = the .jinja file); a list in tokenizer_config.json is
    named templates; chat_template= picks one by name or is a template itself; tools pick
    ``tool_use``."""
    base = tmp_path / "base"
    _tiny_tokenizer(base)
    conv = CONVERSATIONS[0]
    cases = {
        "jinja": ({"chat_template": "CONFIG"}, {"chat_template.jinja": "JINJA{{ bos_token }}"}),
        "named": ({}, {"chat_template.jinja": "DEF",
                       "additional_chat_templates/tool_use.jinja": "TOOLS",
                       "additional_chat_templates/rag.jinja": "RAG"}),
        "list": ({"chat_template": [{"name": "default", "template": "D"},
                                    {"name": "tool_use", "template": "T"}]}, {}),
    }
    for name, (config, files) in cases.items():
        d = tmp_path / name
        shutil.copytree(base, d)
        _config(d, **config)
        for rel, text in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        hf, ours = _pair_dir(d)
        assert ours.chat_template == hf.chat_template, name
        for kw in ({}, {"tools": [{"name": "f"}]}, {"chat_template": "rag"},
                   {"chat_template": "literal {{ messages[0].content }}"}):
            assert ours.apply_chat_template(conv, tokenize=False, **kw) == \
                hf.apply_chat_template(conv, tokenize=False, **kw), (name, kw)


def test_no_template_is_a_value_error_as_in_transformers(tmp_path) -> None:
    d = tmp_path / "none"
    _tiny_tokenizer(d)
    _config(d)
    hf, ours = _pair_dir(d)
    assert ours.chat_template is None
    with pytest.raises(ValueError):
        hf.apply_chat_template(CONVERSATIONS[0])
    with pytest.raises(TLTokenizerError, match="no chat template") as err:
        ours.apply_chat_template(CONVERSATIONS[0])
    assert isinstance(err.value, mi.TokenizerError) and isinstance(err.value, ValueError)
    # an explicit template, or one assigned to the attribute, still works
    assert ours.apply_chat_template(CONVERSATIONS[0], chat_template="{{ messages|length }}",
                                    tokenize=False) == "1"
    ours.chat_template = "{{ eos_token }}"
    assert ours.apply_chat_template(CONVERSATIONS[0], tokenize=False) == "</s>"


def test_bad_arguments_raise_the_kinds_transformers_raises(smollm2_pair) -> None:
    hf, ours = smollm2_pair
    conv = CONVERSATIONS[1]
    cases = [((conv,), {"add_generation_prompt": True, "continue_final_message": True},
              ValueError, TLValueError),
             (([],), {}, ValueError, TLValueError),
             ((["not a message"],), {}, TypeError, TLTypeError),
             (([{"role": "user"}],), {"continue_final_message": True}, ValueError, TLValueError)]
    for args, kw, builtin, ours_kind in cases:
        with pytest.raises(builtin):
            hf.apply_chat_template(*args, tokenize=False, **kw)
        with pytest.raises(ours_kind):
            ours.apply_chat_template(*args, tokenize=False, **kw)
        assert issubclass(ours_kind, builtin) and issubclass(ours_kind, mi.InputError)
    with pytest.raises(TLValueError, match="not supported"):
        ours.apply_chat_template(conv, return_assistant_tokens_mask=True, return_dict=True)
    with pytest.raises(TLValueError, match="padding=True"):
        ours.apply_chat_template(CONVERSATIONS, return_tensors="pt")


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__ }}",                # dunder access
    "{{ messages.append(1) }}",                        # mutating a list (immutable sandbox)
    "{{ ''.__class__.__base__.__subclasses__() }}",    # the classic escape
    "{% set ns = namespace(__init__=1) %}",            # underscore names on a namespace
    "{{ raise_exception('stop') }}",
    "{% for %}",                                       # does not compile
])
def test_hostile_or_broken_templates_stay_in_the_sandbox(smollm2_pair, template) -> None:
    hf, ours = smollm2_pair
    with pytest.raises(jinja2.exceptions.TemplateError):
        hf.apply_chat_template(CONVERSATIONS[0], chat_template=template, tokenize=False)
    with pytest.raises(ChatTemplateError) as err:
        ours.apply_chat_template(CONVERSATIONS[0], chat_template=template, tokenize=False)
    assert isinstance(err.value, jinja2.exceptions.TemplateError)


def test_template_sees_plain_data_only(smollm2_pair) -> None:
    """Rich objects in messages reach the template as placeholders (transformers' rule)."""
    hf, ours = smollm2_pair
    conv = [{"role": "user", "content": "x", "image": torch.zeros(2)}]
    template = "{{ messages[0].image }}|{{ messages[0].content }}"
    assert ours.apply_chat_template(conv, chat_template=template, tokenize=False) == \
        hf.apply_chat_template(conv, chat_template=template, tokenize=False) == "<Tensor>|x"


def test_hub_downloads_fetch_the_template_files() -> None:
    from mi_core import plugins

    assert {"chat_template.jinja", "additional_chat_templates/*.jinja"} <= \
        set(plugins.hub_file_patterns())
