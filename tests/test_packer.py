"""The device packer: best fit, never above one GPU per device."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spawner.catalog import DeviceSpec
from spawner.packer import DevicePacker, GPUDevice, devices_from_inventory


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
        (0, "H100-80GB", "declared"), (1, "H100-80GB", "declared"), (2, "A100-40GB", "declared")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("place"), st.sampled_from([125, 250, 300, 500, 750, 1000, 2000, 3000, 4000])),
    st.tuples(st.just("release"), st.integers(0, 50)),
), max_size=80), st.integers(1, 8), st.integers(1, 3))
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
