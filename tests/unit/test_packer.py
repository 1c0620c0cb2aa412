"""The device packer: best fit, never above one GPU per device."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.core.catalog import DeviceSpec
from spawner.core.fragmentation import WEIGHT_SCALE, FragmentationWeights, TaskClass, node_fragmentation
from spawner.core.packer import DevicePacker, GPUDevice, devices_from_inventory


def packer(n=4, model="H100-80GB", nodes=1):
    devs = [GPUDevice(i, model, 81559, node=f"n{i % nodes}") for i in range(n)]
    return DevicePacker(devs)


def test_best_fit_fills_partial_devices_first():
    p = packer(4)
    a = p.place("a", 500)
    b = p.place("b", 250)
    assert a.shares[0][0] == b.shares[0][0]  # same device
    c = p.place("c", 1000)
    assert c.shares[0][0] != a.shares[0][0]
    d = p.place("d", 250)
    assert d.shares[0][0] == a.shares[0][0]  # exactly fills the partial device
    assert p.used(a.shares[0][0]) == 1000


def test_whole_gpus_on_one_node_and_release():
    p = packer(8, nodes=2)
    x = p.place("x", 4000)
    assert len(x.shares) == 4 and len({p.devices[i].node for i in x.device_indices}) == 1
    assert p.place("y", 8000) is None  # no node has 8 free devices
    p.release("x")
    assert p.free_milli() == 8000
    assert p.place("y", 4000) is not None


def test_model_constraint():
    p = DevicePacker([GPUDevice(0, "A100-40GB"), GPUDevice(1, "H100-80GB")])
    assert p.place("h", 500, {"H100-80GB"}).shares[0][0] == 1
    assert p.place("a", 1000, {"H200-141GB"}) is None


def test_adopt_refuses_overfull_devices():
    p = packer(1)
    p.adopt("a", [(0, 750)])
    try:
        p.adopt("b", [(0, 500)])
    except ValueError:
        pass
    else:
        raise AssertionError("adopting past 1000 milli must fail")
    assert p.used(0) == 750


def test_declared_inventory_expands():
    devs = devices_from_inventory([DeviceSpec("H100-80GB", 2, 81559), DeviceSpec("A100-40GB", 1, 40960)])
    assert [(d.index, d.model, d.source) for d in devs] == [
        (0, "H100-80GB", "declared"),
        (1, "H100-80GB", "declared"),
        (2, "A100-40GB", "declared"),
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("place"), st.sampled_from([125, 250, 300, 500, 750, 1000, 2000, 3000, 4000])),
            st.tuples(st.just("release"), st.integers(0, 50)),
        ),
        max_size=80,
    ),
    st.integers(1, 8),
    st.integers(1, 3),
)
def test_never_more_than_one_gpu_per_device(script, n, nodes):
    p = packer(n, nodes=nodes)
    placed: list[str] = []
    for op, arg in script:
        if op == "place":
            key = f"k{len(placed)}"
            free_before = p.free_milli()
            pl = p.place(key, arg)
            placed.append(key)
            if pl is not None:
                assert pl.milli == arg
                assert len({p.devices[i].node for i in pl.device_indices}) <= 1
                assert p.free_milli() == free_before - arg
            elif arg <= 1000:
                # Refused only when no single device has room.
                assert all(1000 - p.used(i) < arg for i in p.devices)
        elif placed:
            p.release(placed[arg % len(placed)])
        for i in p.devices:
            assert 0 <= p.used(i) <= 1000
        assert sum(p.used(i) for i in p.devices) == sum(pl.milli for pl in p.placements())


# -- node-level best fit and FGD ------------------------------------------------


def test_a_fresh_device_is_taken_on_the_fullest_node():
    # n0: 8 GPUs, one in use; n1: 8 GPUs untouched. A quarter that needs a fresh GPU
    # goes to n0 so that n1 stays empty for an 8-GPU request.
    devs = [GPUDevice(i, "G2", node="n0" if i < 8 else "n1") for i in range(16)]
    p = DevicePacker(devs)
    p.adopt("whole", [(8, 1000)])  # n1 is the partly used node now
    q = p.place("q", 250)
    assert p.devices[q.shares[0][0]].node == "n1"
    assert p.place("big", 8000).node == "n0"


def test_whole_gpu_requests_go_to_the_node_left_with_least_free():
    devs = [GPUDevice(i, "G2", node="big" if i < 8 else "small") for i in range(12)]
    p = DevicePacker(devs)
    x = p.place("x", 2000)
    assert {p.devices[i].node for i in x.device_indices} == {"small"}  # 4 free -> 2 left, not 8 -> 6
    assert p.place("y", 8000).node == "big"


@pytest.mark.parametrize("scoring", ["bestfit", "fgd"])
def test_find_on_a_large_cluster_looks_at_free_share_classes_not_devices(scoring):
    # 1,213 nodes: the query cost depends on distinct free shares and free-device counts only,
    # so the packer must answer the same on a cluster ten times larger (checked, not timed).
    devs = [GPUDevice(i, "G2", node=f"n{i // 8}") for i in range(8 * 1213)]
    p = DevicePacker(devs, scoring=scoring)
    for k in range(600):
        assert p.place(f"w{k}", 8000) is not None
    used_nodes = {pl.node for pl in p.placements()}
    assert len(used_nodes) == 600  # one node per request, never split
    one = p.place("one", 8000)
    assert one.node not in used_nodes
    p.place("q", 250)
    assert p.place("q2", 250).node == p.placement("q").node  # best fit keeps shares together


def _node_free(p: DevicePacker, node: str) -> list[int]:
    return [1000 - p.used(i) for i, d in p.devices.items() if d.node == node]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([100, 250, 320, 470, 500, 810, 1000, 2000, 4000]), min_size=1, max_size=40),
    st.dictionaries(st.sampled_from([100, 250, 470, 810, 1000, 2000, 4000, 8000]), st.integers(1, 50), min_size=1),
)
def test_fgd_picks_the_placement_with_least_fragmentation_growth(requests, popularity):
    workload = {TaskClass(m): float(w) for m, w in popularity.items()}
    devs = [GPUDevice(i, "G2", node=f"n{i // 4}") for i in range(12)]
    p = DevicePacker(devs, scoring="fgd", workload=workload)
    weights = FragmentationWeights(workload, ["G2"], 4)
    scaled = {c: max(1, round(w * WEIGHT_SCALE)) for c, w in weights.workload.items()}
    for n, milli in enumerate(requests):
        before = {node: node_fragmentation(_node_free(p, node), "G2", scaled) for node in ("n0", "n1", "n2")}
        # every feasible single placement, scored from the definition
        options = []
        for node in ("n0", "n1", "n2"):
            free = _node_free(p, node)
            if milli <= 1000:
                for j, f in enumerate(free):
                    if f >= milli:
                        after = free[:j] + [f - milli] + free[j + 1 :]
                        options.append(node_fragmentation(after, "G2", scaled) - before[node])
            elif sum(1 for f in free if f == 1000) >= milli // 1000:
                k = milli // 1000
                after, taken = [], 0
                for f in free:
                    if f == 1000 and taken < k:
                        after.append(0)
                        taken += 1
                    else:
                        after.append(f)
                options.append(node_fragmentation(after, "G2", scaled) - before[node])
        placed = p.place(f"r{n}", milli)
        if placed is None:
            assert not options
            continue
        after = node_fragmentation(_node_free(p, placed.node), "G2", scaled)
        assert after - before[placed.node] == pytest.approx(min(options))
        for i in p.devices:
            assert 0 <= p.used(i) <= 1000


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("place"), st.sampled_from([100, 250, 470, 810, 1000, 2000, 4000, 8000])),
            st.tuples(st.just("release"), st.integers(0, 80)),
        ),
        max_size=80,
    ),
    st.sampled_from(["bestfit", "fgd"]),
)
def test_a_request_is_refused_only_when_nothing_can_hold_it(script, scoring):
    # mixed nodes and models: 8 x G2, 4 x V100, 2 x T4 on one node, 2 x T4
    devs = [GPUDevice(i, "G2", node="a") for i in range(8)]
    devs += [GPUDevice(8 + i, "V100", node="b") for i in range(4)]
    devs += [GPUDevice(12 + i, "T4", node="c") for i in range(2)] + [
        GPUDevice(14 + i, "T4", node="d") for i in range(2)
    ]
    p = DevicePacker(devs, scoring=scoring)
    placed: list[str] = []
    for n, (op, arg) in enumerate(script):
        if op == "release":
            if placed:
                p.release(placed.pop(arg % len(placed)))
            continue
        key = f"k{n}"
        free = {i: 1000 - p.used(i) for i in p.devices}
        if arg <= 1000:
            possible = any(f >= arg for f in free.values())
        else:
            per_group: dict[tuple[str, str], int] = {}
            for i, d in p.devices.items():
                if free[i] == 1000:
                    per_group[(d.node, d.model)] = per_group.get((d.node, d.model), 0) + 1
            possible = any(n >= arg // 1000 for n in per_group.values())
        pl = p.place(key, arg)
        assert (pl is not None) == possible, (arg, free)
        if pl is not None:
            placed.append(key)
            assert len({(p.devices[i].node, p.devices[i].model) for i in pl.device_indices}) == 1
    assert p.free_milli() == sum(1000 - p.used(i) for i in p.devices)


def test_fewest_to_free_releases_in_order_only_what_makes_room_and_keeps_everything():
    packer = DevicePacker([GPUDevice(i, "H100") for i in range(2)])
    for key in ("a", "b"):
        assert packer.place(key, 1000) is not None
    before = {p.key: p.shares for p in packer.placements()}
    assert packer.fewest_to_free(["a", "b"], 1000) == ["a"]
    assert packer.fewest_to_free(["b", "a"], 2000) == ["b", "a"]
    assert packer.fewest_to_free(["a", "gone"], 2000) is None  # releasing a alone is not enough
    assert {p.key: p.shares for p in packer.placements()} == before  # a what-if only
