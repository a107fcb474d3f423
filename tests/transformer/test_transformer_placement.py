"""Placement: ``from_pretrained(device_map=, max_memory=, offload=)``.

On this CPU-only machine the machinery runs with maps onto "cpu" devices, CPU and disk
offload, and with fake accelerators for the assignment itself; a placed model must give the same
numbers as the unplaced one bit for bit (the same kernels run on the same device). The real
multi-device path runs where CUDA is (``test_cuda_*``, skipped without it).
"""

from __future__ import annotations

import re

import pytest
import torch

import mi_core as mi
from mi_core.plugin import Placement

from mi_transformer.placement import layout

_SPLIT = {"embed": "cpu", "blocks.0": "cpu", "blocks.1-2": "cpu:0", "unembed": "cpu:0"}
PLACEMENTS = {
    "map": dict(device_map=_SPLIT),
    "auto": dict(device_map="auto", max_memory={"cpu": "2GiB"}),
    "offload_cpu": dict(offload="cpu"),
    "offload_disk": dict(offload="disk"),
    "sequential_disk": dict(device_map="sequential", offload="disk"),
}


@pytest.fixture(scope="module")
def llama(tiny_llama) -> mi.MIModel:
    return mi.MIModel.from_pretrained(tiny_llama.path)


@pytest.mark.parametrize("how", PLACEMENTS)
def test_a_placed_model_gives_the_same_numbers(tiny_llama, llama, make_ids, how):
    """Logits, captures, an intervention, gradients and KV-cached generation."""
    placed = mi.MIModel.from_pretrained(tiny_llama.path, **PLACEMENTS[how])
    ids = make_ids(2, 9, seed=5)
    resid, pattern = mi.HookPoint.resid_post(1), mi.HookPoint.attn_pattern(2)

    def run(model: mi.MIModel) -> tuple[torch.Tensor, ...]:
        vec = torch.ones(model.hidden_size)
        hooks = mi.HookSpec().capture(resid).capture(pattern).intervene(
            mi.HookPoint.resid_pre(2), mi.Add(vec)).capture_grad(mi.HookPoint.resid_post(0))
        cache = model.forward(ids, hooks)
        cache.output[:, -1].logsumexp(-1).sum().backward()
        gen = model.generate(ids, max_new_tokens=4, stop_at_eos=False)
        return (cache.output.detach(), cache[resid].detach(), cache[pattern].detach(),
                cache.grad(mi.HookPoint.resid_post(0)), gen.tokens)

    for a, b in zip(run(llama), run(placed)):
        assert torch.equal(a.cpu(), b.cpu())


def test_captures_stay_on_their_points_device_and_cache_to_moves_them(tiny_llama, make_ids):
    model = mi.MIModel.from_pretrained(tiny_llama.path, device_map=_SPLIT)
    assert model.backend.layout.layers == (torch.device("cpu"),) * 3  # "cpu:0" is "cpu"
    cache = model.forward(make_ids(1, 4), mi.HookSpec().capture("blocks.2.hook_resid_post"))
    moved = cache.to("cpu")
    assert moved.output.device == torch.device("cpu") and moved.keys() == cache.keys()
    assert torch.equal(moved["blocks.2.hook_resid_post"], cache["blocks.2.hook_resid_post"])


def test_an_analysis_runs_unchanged_on_an_offloaded_model(tiny_llama, llama, make_ids):
    ids = make_ids(1, 6, seed=2)
    lens = mi.LogitLensAnalysis(k=3)
    placed = mi.MIModel.from_pretrained(tiny_llama.path, offload="disk")
    assert lens.run(llama, ids) == lens.run(placed, ids)


@pytest.mark.parametrize("kwargs, message", [
    (dict(device_map={"blocks.0-2": "cpu", "mlp": "cpu"}), "part 'mlp'"),
    (dict(device_map={"blocks.0-1": "cpu", "blocks.1-2": "cpu"}), "'blocks.0-1' and 'blocks.1-2' overlap"),
    (dict(device_map={"blocks.2-0": "cpu"}), "reversed"),
    (dict(device_map={"blocks.0-2": "cuda:7"}), "part 'blocks.0-2'.*cuda:7"),
    (dict(device_map={"blocks.0-2": "warp"}), "part 'blocks.0-2'.*warp"),
    (dict(device_map={"blocks.0-1": "cpu"}), r"no device for blocks \[2\]"),
    (dict(device_map={"blocks.0-3": "cpu"}), "'blocks.0-3': the model has blocks 0..2"),
    (dict(device_map="balanced_low_0"), "device_map must be"),
    (dict(offload="gpu"), "offload must be"),
    (dict(device_map="auto", max_memory={"cpu": "lots"}), r"max_memory\['cpu'\]"),
    (dict(device_map="auto", max_memory={"cpu": 1000}), "does not fit in max_memory"),
    (dict(max_memory={"cpu": "1GiB"}), "max_memory needs device_map"),
])
def test_a_bad_placement_is_an_input_error_naming_it(tiny_llama, kwargs, message):
    with pytest.raises(mi.InputError, match=message):
        mi.MIModel.from_pretrained(tiny_llama.path, **kwargs)


def test_disk_offload_of_weights_made_in_memory_is_refused(smollm2_gguf_path):
    with pytest.raises(mi.InputError, match="offload='disk'.*use offload='cpu'"):
        mi.MIModel.from_pretrained(smollm2_gguf_path, offload="disk")


def test_weight_processing_is_refused_on_an_offloaded_model(tiny_llama):
    with pytest.raises(mi.InputError, match="offloaded model"):
        mi.MIModel.from_pretrained(tiny_llama.path, offload="cpu", fold_ln=True)


def _fake(mode: str, budgets: dict[str, int], offload: str | None = None) -> Placement:
    """A Placement as check_placement makes it, for devices this machine lacks."""
    return Placement(mode, torch.device("cpu"), (),
                     tuple((torch.device(d), b) for d, b in budgets.items()), offload)


def test_sequential_fills_each_device_in_order_within_its_budget():
    got = layout(_fake("sequential", {"cuda:0": 350, "cuda:1": 1000, "cpu": 10**6}),
                 [100] * 8, 50, 60)
    # cuda:0 takes the embedding (50) and three blocks (350); cuda:1 the rest
    assert got.embed == torch.device("cuda:0")
    assert got.layers == (torch.device("cuda:0"),) * 3 + (torch.device("cuda:1"),) * 5
    assert got.unembed == torch.device("cuda:1")


def test_auto_balances_accelerators_when_no_budget_is_given(monkeypatch):
    import mi_transformer.placement as pl

    free = {torch.device("cuda:0"): 10**9, torch.device("cuda:1"): 10**9,
            torch.device("cpu"): 10**10}
    monkeypatch.setattr(pl, "free_memory", lambda: dict(free))
    got = layout(Placement("auto", torch.device("cpu")), [100] * 8, 50, 50)
    counts = {d: got.layers.count(d) for d in set(got.layers)}
    assert counts == {torch.device("cuda:0"): 4, torch.device("cuda:1"): 4}


def test_offloaded_blocks_take_no_device_budget():
    got = layout(_fake("sequential", {"cuda:0": 200, "cpu": 10**6}, offload="cpu"),
                 [10**5] * 4, 50, 60)
    assert set(got.layers) == {torch.device("cuda:0")} and got.offload == "cpu"


def test_a_backend_without_placement_refuses_it(monkeypatch, tiny_llama):
    """A loader that takes no ``placement=`` is a CapabilityError, not an unplaced load."""
    from mi_core import plugins
    from mi_core.registry import BackendSpec

    real = plugins.backends()

    def old_style(source, device, dtype):  # pragma: no cover - never called
        raise AssertionError("must not load")

    monkeypatch.setattr(plugins, "backends", lambda: {
        **real, "transformer": BackendSpec("transformer", old_style)})
    with pytest.raises(mi.CapabilityError, match=re.escape("cannot place")):
        mi.MIModel.from_pretrained(tiny_llama.path, offload="cpu")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_split_across_gpu_and_cpu_gives_the_cpu_numbers(tiny_llama, llama, make_ids):
    """Embedding and block 0 on the GPU, the rest on the CPU (and back): same logits as the
    CPU model within float32 kernel differences."""
    placed = mi.MIModel.from_pretrained(tiny_llama.path, device_map={
        "embed": "cuda:0", "blocks.0": "cuda:0", "blocks.1-2": "cpu", "unembed": "cuda:0"})
    ids = make_ids(2, 8)
    out = placed.forward(ids).output
    assert out.device.type == "cuda"
    assert (out.cpu() - llama.forward(ids).output).abs().max().item() < 1e-4


@cuda
def test_cuda_offload_cpu_runs_each_block_on_the_gpu(tiny_llama, llama, make_ids):
    placed = mi.MIModel.from_pretrained(tiny_llama.path, device="cuda", offload="cpu")
    ids = make_ids(2, 8)
    assert (placed.forward(ids).output.cpu() - llama.forward(ids).output).abs().max() < 1e-4


_MEMORY_PROBE = r"""
import json, sys, torch, mi_core as mi
from mi_core.plugin import get_plugin_manager
get_plugin_manager()  # the plugins' modules are imported before the baseline, not counted
import mi_transformer.model, mi_transformer.loader  # noqa: E401 (the backend's too)
def anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon"))
before = anon()
model = mi.MIModel.from_pretrained(sys.argv[1], dtype=torch.float32, **json.loads(sys.argv[2]))
model.forward(torch.randint(0, 1000, (1, 16)))
print(anon() - before)
"""


def test_disk_offload_holds_a_few_blocks_not_the_model(tmp_path):
    """8 blocks of 16.8 MB each in float32, bfloat16 on disk: loaded with offload="disk",
    a forward leaves anonymous memory (RssAnon, in a fresh process) under 4 blocks plus
    activations and half the resident model; the same load without offload holds all 8 (the measurement can fail)."""
    import json
    import os
    import subprocess
    import sys

    import transformers

    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=8, vocab_size=1000,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path)
    block = 4 * (4 * 512 * 512 + 3 * 512 * 2048)  # bytes of one block in float32

    def anon_growth(kwargs: dict) -> int:
        # one thread and one malloc arena: the measure is the weights held, not how many
        # per-thread arenas a loaded machine makes the allocator touch
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
        out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(tmp_path),
                              json.dumps(kwargs)], capture_output=True, text=True, check=True,
                             env=env)
        return int(out.stdout.split()[-1])

    offloaded, resident = anon_growth({"offload": "disk"}), anon_growth({})
    # alone this measures ~3 blocks; allocator slack on a loaded machine adds up to ~1 more
    assert offloaded < 4 * block + (8 << 20) and offloaded < resident / 2, (offloaded, block)
    assert resident > 7 * block, (resident, block)
