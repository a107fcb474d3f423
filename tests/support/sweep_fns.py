"""Module-level sweep functions for the sweep tests (worker processes and Ray actors import
them by name) and a runner script for the kill-and-resume test."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

#: jobs of the toy-model sweeps: a few token sequences of the toy checkpoint's vocabulary (11)
TOY_JOBS = [{"n": i, "ids": [i % 11, (3 * i + 1) % 11, (7 * i + 2) % 11, (5 * i + 4) % 11]}
            for i in range(24)]


def toy_reference(weights: dict[str, torch.Tensor], job: dict[str, Any]) -> dict[str, Any]:
    """What toy_logits must return, from the toy model's independent forward
    (tests.support.toy_checkpoint.toy_reference)."""
    from tests.support.toy_checkpoint import toy_reference as ref

    out = ref(weights, torch.tensor([job["ids"]]))
    return {"last_logits": out["logits"][0, -1].tolist(),
            "resid": out["blocks.1.hook_resid_post"][0, -1].tolist()}


def toy_logits(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    """Last-position logits and layer-1 residual of one token sequence."""
    from mi_core import HookSpec

    cache = model.forward(torch.tensor([job["ids"]]), HookSpec().capture("blocks.1.hook_resid_post"))
    return {"last_logits": cache.output[0, -1].tolist(),
            "resid": cache["blocks.1.hook_resid_post"][0, -1].tolist()}


def toy_logits_batched(model: Any, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """toy_logits for several equal-length sequences in one forward."""
    from mi_core import HookSpec

    cache = model.forward(torch.tensor([j["ids"] for j in jobs]),
                          HookSpec().capture("blocks.1.hook_resid_post"))
    return [{"last_logits": cache.output[b, -1].tolist(),
             "resid": cache["blocks.1.hook_resid_post"][b, -1].tolist()} for b in range(len(jobs))]


#: jobs seen by `counted_toy`, and the switch of `sometimes_fails` (module-level: a sweep
#: function's identity covers the values it closes over, not the globals it reads)
CALLS: list[list[int]] = []
STATE = {"fail": True}


def counted_toy(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    CALLS.append(job["ids"])
    return toy_logits(model, job)


def sometimes_fails(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    if STATE["fail"] and job["ids"][0] == 1:
        raise RuntimeError("transient")
    return toy_logits(model, job)


def tagged_fn() -> Any:
    """A partial bound to a set of strings and a dict: values whose iteration order depends
    on the hash seed (the identity test digests it in two processes)."""
    import functools

    return functools.partial(toy_logits, tags={"a", "b", "c", "d"}, cfg={"z": 1, "y": 2})


def fails_on_odd(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    if job["ids"][0] % 2:
        raise ValueError(f"odd first token {job['ids'][0]}")
    return toy_logits(model, job)


def slow_toy(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.005)
    return toy_logits(model, job)


def node_of(model: Any, job: dict[str, Any]) -> dict[str, Any]:
    """The Ray node this job ran on."""
    import ray

    time.sleep(0.2)  # long enough that both actors get work
    return {"node": ray.get_runtime_context().get_node_id()}


def main() -> None:
    """``python -m tests.support.sweep_fns MODEL STORE N``: a slow sweep to be killed."""
    from mi_core import run_sweep
    from tests.support.sweep_fns import slow_toy  # this module by its name, not as __main__

    model, store, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    run_sweep(slow_toy, [{"ids": [i % 11, 1, 2], "n": i} for i in range(n)], model=model,
              store=store, progress=False)
    os._exit(0)


if __name__ == "__main__":
    main()
