"""mi_probing.store: a probe on an activation store sees exactly the stored tokens' activations
(compared with a direct capture, exact) and decodes a label aligned with them."""

from __future__ import annotations

import torch

import mi_core as mi
from mi_probing.store import fit_probe_on_store, store_activations
from tests.support.fake_backend import fake_model


def test_probe_on_store_reads_the_stored_tokens(tmp_path):
    model = fake_model(seed=0)
    hook = "blocks.1.hook_resid_post"
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(1, 40, (20, 8), generator=g)
    store = mi.cache_activations(model, rows, [hook], tmp_path / "acts", context_len=8,
                                 batch_size=20, verbose=False)
    x = store_activations(store, hook, limit=100)
    ref = model.forward(rows, mi.HookSpec().capture(hook))[hook].reshape(-1, 32)[:100]
    assert torch.equal(x, ref)
    # a label that is a linear function of the stored activations: a probe reading the
    # right rows decodes it far above its shuffled-label control; misaligned rows would not
    direction = torch.randn(32, generator=g)
    labels = (ref.float() @ direction > 0).long().tolist()
    result = fit_probe_on_store(store, hook, labels, cv=3, n_shuffles=2)
    assert result.score().selectivity > 0.2
