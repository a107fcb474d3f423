"""Functions in sweeps: a store's function identity covers what changes its results (source,
defaults, closed-over values, partial arguments, bound instances), digested stably (the same
in another process, whatever the hash seed); a resumed sweep whose function computes with
other values is refused, one with equal values resumes; a value that cannot be digested is a
SweepError naming it, before the store is touched."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import mi_core as mi
from mi_core.scale._identity import fn_identity
from tests.support import sweep_fns
from tests.support.sweep_fns import TOY_JOBS, toy_logits
from tests.support.toy_checkpoint import write_toy_checkpoint

ROOT = Path(__file__).parents[2]
JOBS = TOY_JOBS[:2]


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("toy") / "toy"
    write_toy_checkpoint(d)
    return d


def scaled_by(k):
    def fn(model, job):
        r = toy_logits(model, job)
        return {"x": [k * v for v in r["last_logits"]]}
    return fn


def with_default(model, job, k=2):
    return {"k": k}


class Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, model, job):
        return {"k": self.k}

    def run(self, model, job):
        return {"k": self.k}


def test_a_closure_over_k2_resumed_as_k3_is_refused(toy, tmp_path):
    store = tmp_path / "s"
    first = mi.run_sweep(scaled_by(2), JOBS, model=toy, store=store).results()
    with pytest.raises(mi.StoreError, match=r"another function .*its closed-over value 'k' "
                       r"changed"):
        mi.run_sweep(scaled_by(3), JOBS, model=toy, store=store)
    again = mi.run_sweep(scaled_by(2), TOY_JOBS[:3], model=toy, store=store)  # equal: resumes
    assert again.results()[:2] == first and len(again.results()) == 3


@pytest.mark.parametrize("make, other, what", [
    (lambda: with_default, lambda: functools.partial(with_default, k=3), r"partial keyword k"),
    (lambda: Scaler(2), lambda: Scaler(3), r"its bound instance"),
    (lambda: Scaler(2).run, lambda: Scaler(3).run, r"its bound instance"),
    (lambda: functools.partial(with_default, k=torch.ones(3)),
     lambda: functools.partial(with_default, k=torch.ones(3) * 2), r"partial keyword k"),
])
def test_defaults_partials_and_instances_are_part_of_the_identity(toy, tmp_path, make, other,
                                                                  what):
    store = tmp_path / "s"
    mi.run_sweep(make(), JOBS, model=toy, store=store)
    mi.run_sweep(make(), JOBS, model=toy, store=store)  # a new, equal object resumes
    with pytest.raises(mi.StoreError, match=what):
        mi.run_sweep(other(), JOBS, model=toy, store=store)


def test_a_changed_default_is_a_changed_function():
    def f(model, job, k=2):
        return k

    before = fn_identity(f)
    f.__defaults__ = (3,)
    after = fn_identity(f)
    assert before["source_hash"] == after["source_hash"]
    assert before["bound"]["default k"] != after["bound"]["default k"]


def test_digests_do_not_depend_on_object_identity_or_dict_order():
    def make(cfg):
        def fn(model, job):
            return cfg
        return fn

    a = fn_identity(make({"b": [1, 2.5, None], "a": {"x", "y"}, "t": torch.arange(3)}))
    b = fn_identity(make({"a": {"y", "x"}, "t": torch.arange(3), "b": [1, 2.5, None]}))
    c = fn_identity(make({"a": {"y", "x"}, "t": torch.arange(3.0), "b": [1, 2.5, None]}))
    assert a == b and a != c  # same content, other order: equal; another dtype: not


def test_the_digest_is_the_same_in_another_process_and_hash_seed():
    code = ("import json; from mi_core.scale._identity import fn_identity; "
            "from tests.support.sweep_fns import tagged_fn; "
            "print(json.dumps(fn_identity(tagged_fn()), sort_keys=True))")
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # not this process's seed
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                         capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
    here = fn_identity(sweep_fns.tagged_fn())
    assert json.loads(out) == here and here["bound"]  # sets of strings: order-independent


def test_a_value_that_cannot_be_digested_is_named_before_the_store_is_touched(toy, tmp_path):
    lock = threading.Lock()

    def locked(model, job):
        with lock:
            return toy_logits(model, job)

    with pytest.raises(mi.SweepError, match=r"locked closed-over 'lock' \(_thread\.lock\): it "
                       r"has no stable value.*pass this value in the jobs"):
        mi.run_sweep(locked, JOBS, model=toy, store=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_recursive_closures_and_nested_functions_are_digested(toy, tmp_path):
    def outer(k):
        def helper(x):
            return x * k

        def fn(model, job):
            return {"v": fn.__name__ and helper(1)}  # refers to itself and to a helper
        return fn

    assert fn_identity(outer(2)) == fn_identity(outer(2))
    assert fn_identity(outer(2)) != fn_identity(outer(3))  # k reached through `helper`
    run = mi.run_sweep(outer(2), JOBS, model=toy, store=tmp_path / "s")
    assert run.results()[0][1] == {"v": 2}
