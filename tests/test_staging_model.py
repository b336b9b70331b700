"""hpcbench.staging.model: the arithmetic of the staging-time model on small layouts (hand-computed numbers)."""
from __future__ import annotations

import math

import pytest

from hpcbench.staging.model import Layout, System, node_rate, pipelined, predict, predict_all, weak_scaling
from hpcbench.staging.probe import node_rates

# 100 GB raw per instance packed to 20 GB; rates in GB/s
RAW, PACKED = 100e9, 20e9
SYS = System(fs_GBps=10, fabric_GBps=5, write_GBps=2, decompress_GBps=4)


def test_layout_shapes() -> None:
    assert Layout(4, 2).shape() == (2, 2)  # 2 instances of 2 nodes: 2 nodes share each shard-set
    assert Layout(8, 8).shape() == (1, 8)
    assert Layout(2, 4).shape() == (1, 2)  # 2 instances per node: every node needs it all, all nodes share
    for bad in (Layout(5, 2), Layout(2, 3), Layout(0, 1)):
        with pytest.raises(ValueError):
            bad.shape()


def test_packed_phases_on_a_cluster() -> None:
    p = predict(RAW, PACKED, Layout(4, 2), SYS, "packed")
    # read once: 20 GB / 10 GB/s; fabric: a node's set is 10 GB packed, it gets the other half
    assert p.shared_read_bytes == PACKED
    assert p.phases == pytest.approx({"read": 2.0, "fabric": 1.0, "decompress": 12.5, "write": 25.0})
    assert p.total_s == pytest.approx(25.0)  # pipelined: the slowest phase
    assert p.bottleneck() == "write"


def test_independent_and_copy_read_once_per_instance() -> None:
    ind = predict(RAW, PACKED, Layout(4, 2), SYS, "independent")
    cp = predict(RAW, PACKED, Layout(4, 2), SYS, "copy")
    assert ind.shared_read_bytes == 2 * PACKED and ind.phases["read"] == pytest.approx(4.0)
    assert ind.phases["fabric"] == 0 and ind.phases["decompress"] == pytest.approx(12.5)
    assert cp.shared_read_bytes == 2 * RAW and cp.phases["read"] == pytest.approx(20.0)
    assert cp.phases["decompress"] == 0 and cp.total_s == pytest.approx(25.0)


def test_shared_cpu_adds_local_phases_and_overhead() -> None:
    s = System(fs_GBps=10, fabric_GBps=5, write_GBps=2, decompress_GBps=4, overhead_s=0.5, shared_cpu=True)
    p = predict(RAW, PACKED, Layout(4, 2), s, "packed")
    assert p.total_s == pytest.approx(0.5 + 1.0 + 12.5 + 25.0)


def test_client_limit_bounds_a_nodes_read() -> None:
    s = System(fs_GBps=10, fabric_GBps=5, write_GBps=2, decompress_GBps=4, client_GBps=1)
    # packed: each of 4 nodes reads 5 GB at 1 GB/s, more than 20 GB / 10 GB/s
    assert predict(RAW, PACKED, Layout(4, 2), s, "packed").phases["read"] == pytest.approx(5.0)


def test_weak_scaling_copy_grows_packed_stays_flat() -> None:
    s = System(fs_GBps=1, fabric_GBps=50, write_GBps=20, decompress_GBps=40)
    curve = weak_scaling(RAW, PACKED, 2, [1, 2, 4], s)
    assert curve["copy"] == pytest.approx([100.0, 200.0, 400.0])  # read-bound: K x raw
    assert curve["independent"] == pytest.approx([20.0, 40.0, 80.0])
    assert curve["packed"] == pytest.approx([20.0, 20.0, 20.0])  # 20 GB read once, whatever K
    assert set(predict_all(RAW, PACKED, Layout(2, 1), s)) == {"packed", "independent", "copy"}


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="fs_GBps"):
        System(fs_GBps=0, fabric_GBps=1, write_GBps=1, decompress_GBps=1)
    with pytest.raises(ValueError, match="decompress_GBps"):
        System(fs_GBps=1, fabric_GBps=1, write_GBps=1, decompress_GBps=math.nan)
    with pytest.raises(ValueError, match="method"):
        predict(RAW, PACKED, Layout(2, 1), SYS, "rsync")


def test_node_rate_is_threads_up_to_the_cores_a_node_has() -> None:
    assert node_rate(0.5, 2, math.inf) == pytest.approx(1.0)  # a cluster node: its threads run in parallel
    assert node_rate(0.5, 8, 4) == pytest.approx(2.0)  # more threads than cores: the cores bound it
    assert node_rate(0.5, 2, 2 / 8) == pytest.approx(0.125)  # 8 emulated nodes on 2 cores: a quarter core each
    with pytest.raises(ValueError, match="cores_per_node"):
        node_rate(0.5, 2, 0)


def test_pipeline_fill_and_drain() -> None:
    assert pipelined([2.0, 6.0], 1) == pytest.approx(8.0)  # one unit: the stages run one after the other
    assert pipelined([2.0, 6.0], 2) == pytest.approx((8.0 + 6.0) / 2)
    assert pipelined([2.0, 6.0], 10**9) == pytest.approx(6.0)  # many units: the slowest stage
    assert pipelined([], 3) == 0.0


def test_chunk_sets_the_pipelining_units() -> None:
    # packed, 4 nodes in 2 instances: each reader reads 20 GB / 4 = 5 GB; 2.5 GB chunks: 2 rounds
    s = System(fs_GBps=10, fabric_GBps=5, write_GBps=2, decompress_GBps=4, shared_cpu=True, chunk_bytes=2.5e9)
    p = predict(RAW, PACKED, Layout(4, 2), s, "packed")
    local = 1.0 + 12.5 + 25.0
    assert p.total_s == pytest.approx((2.0 + local + local) / 2)
    # copy pipelines file by file: 10 files, 2 nodes per instance: 5 units per node
    cp = predict(RAW, PACKED, Layout(4, 2), s, "copy", files=10)
    assert cp.total_s == pytest.approx((20.0 + 25.0 + 4 * 25.0) / 5)
    with pytest.raises(ValueError, match="chunk_bytes"):
        System(fs_GBps=1, fabric_GBps=1, write_GBps=1, decompress_GBps=1, chunk_bytes=-1)


def test_node_rates_from_the_real_path_probe() -> None:
    pr = {"copy_path_GBps_thread": 1.0, "stage_path_GBps_thread": 0.5, "fabric_GBps": 4.0}
    r = node_rates(pr, threads=2, cores_per_node=0.5)  # half a core per node
    assert r["write_GBps"] == pytest.approx(0.5) and r["fabric_GBps"] == pytest.approx(2.0)
    # packed path 0.25 GB/s per node = write 0.5 GB/s + decompression: 1/0.25 - 1/0.5 = 2 s/GB
    assert r["decompress_GBps"] == pytest.approx(0.5)
    assert 1 / r["write_GBps"] + 1 / r["decompress_GBps"] == pytest.approx(1 / 0.25)
    fast = node_rates(pr | {"stage_path_GBps_thread": 2.0}, threads=1, cores_per_node=4)
    assert fast["decompress_GBps"] == math.inf  # packed no slower than a plain write: nothing extra
