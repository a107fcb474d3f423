"""A two-node local Ray cluster (``ray.cluster_utils.Cluster``) for the Ray executor tests.

Import the fixture into a test module (``from tests.support.ray_cluster import ray_cluster``).
It skips only when Ray is not installed or cannot start a cluster on this machine, saying
why; it always shuts the cluster down (no leaked raylets)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """The address of a running 2-node cluster (1 CPU each, small object stores). Module
    scope: each module importing the fixture gets its own, shut down when the module ends,
    so two clusters never run at once."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'mi-core[ray]')")
    from ray.cluster_utils import Cluster

    # the nodes' workers import the tests' functions and this checkout's packages
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([old] if old else []))
    small = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
    cluster = None
    try:
        try:
            cluster = Cluster(initialize_head=True, head_node_args=small)
            cluster.add_node(**small)
            cluster.wait_for_nodes()
        except Exception as exc:  # noqa: BLE001 - the one condition we skip on
            if cluster is not None:
                cluster.shutdown()
            pytest.skip(f"Ray cannot start a local cluster on this machine: {exc}")
        yield cluster.address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
