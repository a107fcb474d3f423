"""Where the work runs: ``local`` (this process), ``processes`` (a spawn pool on this machine,
one model per worker process) or ``ray`` (one model per Ray actor, on a cluster or a local
Ray). The driver is the only writer in every case: executors only compute and hand values
back. Tasks are ``task(model, payload) -> value`` for a module-level (importable) ``task``;
a task's exception comes back as its traceback text, never kills the run.

Ray is imported only by :class:`RayExecutor`, i.e. only when asked for.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from typing import Any, Callable, Iterable, Iterator, Sequence

from mi_core import plugin as sdk
from mi_core.plugin import ConfigError, MIError, MIModel, require_points
from mi_core.scale._common import SweepError

EXECUTORS = ("local", "processes", "ray")

#: (task id, payload) in; (task id, ok, value or error text) out
Task = tuple[int, Any]
Outcome = tuple[int, bool, Any]

_WORKER_MODELS: dict[tuple[str, str, str], Any] = {}


def _load(model_ref: str, device: str, dtype: str = "float32") -> Any:
    """The model of this worker process, loaded once per (source, device, dtype)."""
    key = (model_ref, device, dtype)
    if key not in _WORKER_MODELS:
        import torch

        _WORKER_MODELS[key] = MIModel.from_pretrained(model_ref, device=device,
                                                      dtype=getattr(torch, dtype))
    return _WORKER_MODELS[key]


def check_hooks(model: Any, hooks: Sequence[str]) -> None:
    """HookError naming the first of `hooks` the model lacks (before any job runs)."""
    if hooks:
        require_points(model, hooks)


def _run_task(task: Callable[[Any, Any], Any], model: Any, payload: Any) -> tuple[bool, Any]:
    try:
        return True, task(model, payload)
    except Exception as exc:  # a failing job is recorded, the sweep goes on
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        tb = traceback.format_exc(limit=-3)
        return False, f"{text}\n{tb}" if not isinstance(exc, MIError) else text


def _process_check(model_ref: str, device: str, dtype: str, hooks: Sequence[str],
                   threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    check_hooks(_load(model_ref, device, dtype), hooks)


def _process_task(model_ref: str, device: str, dtype: str, task: Callable[[Any, Any], Any],
                  payload: Any
                  ) -> tuple[bool, Any]:
    return _run_task(task, _load(model_ref, device, dtype), payload)


def ensure_shippable(task: Callable[..., Any], what: str) -> None:
    """SweepError unless `task` can be sent to another process by reference (a module-level
    function, or a functools.partial of one): lambdas and nested functions cannot."""
    try:
        pickle.dumps(task)
    except Exception as exc:
        raise SweepError(f"{what} {getattr(task, '__qualname__', task)!r} cannot be sent to "
                         f"worker processes ({exc}); define it at module level (in an "
                         f"importable module or the script's top level)") from None


class LocalExecutor:
    """In this process, in order, with one model."""

    name = "local"

    def __init__(self, model: Any, device: str = "cpu", dtype: str = "float32", **_: Any) -> None:
        self.model = model if isinstance(model, MIModel) else None
        self.model_ref = None if self.model is not None else os.fspath(model)
        self.device, self.dtype = device, dtype

    def start(self, hooks: Sequence[str]) -> None:
        t0 = time.perf_counter()
        if self.model is None:
            self.model = _load(self.model_ref, self.device, self.dtype)  # type: ignore[arg-type]
        check_hooks(self.model, hooks)
        self.timings = {"load_model": time.perf_counter() - t0}

    def run(self, task: Callable[[Any, Any], Any], tasks: Iterable[Task]) -> Iterator[Outcome]:
        for tid, payload in tasks:
            ok, value = _run_task(task, self.model, payload)
            yield tid, ok, value

    def close(self) -> None:
        pass


def _model_ref(model: Any, executor: str) -> str:
    if isinstance(model, MIModel):
        raise ConfigError(f"executor={executor!r} loads one model per worker: pass the model "
                          f"as a path or hub id (e.g. {model.source!r}), not a loaded MIModel")
    return os.fspath(model)


class ProcessExecutor:
    """A spawn-context process pool on this machine; each worker loads the model once.

    At most ``2 * workers`` tasks are in flight (a killed run loses only those); torch in
    each worker uses ``cpu_count // workers`` threads.
    """

    name = "processes"

    def __init__(self, model: Any, device: str = "cpu", workers: int | None = None,
                 dtype: str = "float32", **_: Any) -> None:
        self.model_ref = _model_ref(model, self.name)
        self.device, self.dtype = device, dtype
        self.workers = int(workers or max(1, min(4, os.cpu_count() or 1)))
        self.threads = max(1, (os.cpu_count() or 1) // self.workers)
        self.pool: Any = None

    def start(self, hooks: Sequence[str]) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        t0 = time.perf_counter()
        self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        # every worker loads the model (one load each: they are busy, so the pool spreads
        # them); the first also checks the hook names; all before any job is sent
        futs = [self.pool.submit(_process_check, self.model_ref, self.device, self.dtype,
                                 list(hooks) if i == 0 else [], self.threads)
                for i in range(self.workers)]
        for f in futs:
            f.result()
        self.timings = {"start_workers_and_load_models": time.perf_counter() - t0}

    def run(self, task: Callable[[Any, Any], Any], tasks: Iterable[Task]) -> Iterator[Outcome]:
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        ensure_shippable(task, "the job function")
        it = iter(tasks)
        pending: dict[Any, int] = {}
        exhausted = False
        while True:
            while not exhausted and len(pending) < 2 * self.workers:
                nxt = next(it, None)
                if nxt is None:
                    exhausted = True
                    break
                tid, payload = nxt
                fut = self.pool.submit(_process_task, self.model_ref, self.device, self.dtype, task,
                                       payload)
                pending[fut] = tid
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                tid = pending.pop(fut)
                try:
                    ok, value = fut.result()
                except BrokenProcessPool:
                    raise SweepError("a worker process died (out of memory, or killed); "
                                     "everything recorded so far is kept: re-run to resume") from None
                yield tid, ok, value

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


class RayExecutor:
    """One model per Ray actor: ``ray.init(address=...)`` when an address is given (argument
    or ``RAY_ADDRESS``), a new local Ray otherwise (``address="local"``: not a cluster found
    on this machine); an already initialised Ray is used as is.
    Each actor takes ``num_gpus=1`` when the cluster has GPUs (and loads the model on
    ``cuda``), else ``num_cpus=1``. Ray is shut down at the end only if it was started here.
    """

    name = "ray"

    def __init__(self, model: Any, device: str = "cpu", workers: int | None = None,
                 address: str | None = None, dtype: str = "float32", **_: Any) -> None:
        self.model_ref = _model_ref(model, self.name)
        self.device, self.dtype = device, dtype
        self.workers = workers
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.actors: list[Any] = []
        self.started_ray = False

    def start(self, hooks: Sequence[str]) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("executor='ray' needs Ray: pip install 'mi-core[ray]'") from None
        t0 = time.perf_counter()
        if not ray.is_initialized():
            # "local": a new local Ray, never a cluster someone else started on this machine
            ray.init(address=self.address or "local", include_dashboard=False,
                     log_to_driver=False)
            self.started_ray = True
        t1 = time.perf_counter()
        res = ray.cluster_resources()
        gpus = int(res.get("GPU", 0))
        n = int(self.workers or gpus or max(1, int(res.get("CPU", 1))))
        opts = {"num_gpus": 1, "num_cpus": 0} if gpus else {"num_cpus": 1}
        device = "cuda" if gpus else self.device
        actor_cls = ray.remote(**opts)(_RayWorker)
        self.actors = [actor_cls.remote(self.model_ref, device, self.dtype) for _ in range(n)]
        self.ray = ray
        for err in ray.get([a.check.remote(list(hooks) if i == 0 else [])
                            for i, a in enumerate(self.actors)]):
            if err is not None:  # (error class name, message) of an MIError in the actor
                cls = getattr(sdk, err[0], None)
                raise (cls if isinstance(cls, type) and issubclass(cls, MIError) else MIError)(
                    err[1])
        self.timings = {"ray_init": t1 - t0, "start_actors_and_load_models": time.perf_counter() - t1}

    def run(self, task: Callable[[Any, Any], Any], tasks: Iterable[Task]) -> Iterator[Outcome]:
        ray = self.ray
        task_ref = ray.put(task)
        it = iter(tasks)
        pending: dict[Any, tuple[int, Any]] = {}
        idle = list(self.actors) * 2  # two tasks per actor in flight
        exhausted = False
        while True:
            while not exhausted and idle:
                nxt = next(it, None)
                if nxt is None:
                    exhausted = True
                    break
                actor = idle.pop()
                ref = actor.run.remote(task_ref, nxt[1])
                pending[ref] = (nxt[0], actor)
            if not pending:
                return
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                tid, actor = pending.pop(ref)
                idle.append(actor)
                try:
                    ok, value = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    raise SweepError(f"a Ray worker died ({exc.__class__.__name__}); everything "
                                     f"recorded so far is kept: re-run to resume") from None
                yield tid, ok, value

    def close(self) -> None:
        if self.actors:
            for a in self.actors:
                self.ray.kill(a)
            self.actors = []
        if self.started_ray:
            self.ray.shutdown()
            self.started_ray = False


class _RayWorker:
    """The actor body (decorated with ``ray.remote`` by RayExecutor.start)."""

    def __init__(self, model_ref: str, device: str, dtype: str = "float32") -> None:
        self.model_ref, self.device, self.dtype = model_ref, device, dtype

    def check(self, hooks: Sequence[str]) -> tuple[str, str] | None:
        """Load the model, check `hooks`; an MIError comes back as (class name, message)."""
        try:
            check_hooks(_load(self.model_ref, self.device, self.dtype), hooks)
        except MIError as exc:
            return type(exc).__name__, str(exc)
        return None

    def run(self, task: Callable[[Any, Any], Any], payload: Any) -> tuple[bool, Any]:
        return _run_task(task, _load(self.model_ref, self.device, self.dtype), payload)


def make_executor(executor: str, model: Any, device: str = "cpu", workers: int | None = None,
                  address: str | None = None, dtype: str = "float32") -> Any:
    """`dtype`: the dtype name workers load a model given by path in (e.g. "bfloat16")."""
    if executor == "local":
        return LocalExecutor(model, device, dtype=dtype)
    if executor == "processes":
        return ProcessExecutor(model, device, workers, dtype=dtype)
    if executor == "ray":
        return RayExecutor(model, device, workers, address, dtype=dtype)
    raise ConfigError(f"unknown executor {executor!r}; one of {', '.join(EXECUTORS)}")
