"""The GPU path: every heavy function honours ``device`` (checked on the CPU here, and on CUDA
where one is visible), and ``pick_device`` chooses and validates devices."""

import numpy as np
import pytest
import torch
from justified import assert_justified

import wsutils as ws
from wsutils.run.device import describe_device, pick_device

n, d = 6, 4


def _run(device):
    X = ws.sample_X(n, d, seed=0, device=device)
    V = ws.sample_V(n * d, n, d, seed=1, device=device)
    Vs = ws.sample_Vs(n, d, 2, seed=2, device=device)
    W = ws.sample_W(d, seed=3, device=device)
    outs = {
        "X": X,
        "V": V,
        "Vs[1]": Vs[1],
        "W": W,
        "rf": ws.rf(X, V),
        "drf": ws.drf(X, Vs),
        "raf": ws.raf(X, W),
        "relu_attention": ws.relu_attention(X, W),
    }
    r = ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=5, starts=2, seed=0, device=device)
    return outs, r


def test_explicit_cpu_device_is_honoured_and_changes_nothing():
    on_cpu, r_cpu = _run("cpu")
    default, r_default = _run(None)
    for name, t in on_cpu.items():
        assert t.device.type == "cpu", name
        assert torch.equal(t, default[name]), name
    assert r_cpu.value == r_default.value and r_cpu.row == r_default.row
    np.testing.assert_array_equal(r_cpu.Delta, r_default.Delta)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")
def test_cuda_gives_the_cpu_numbers():
    on_gpu, r_gpu = _run("cuda")
    on_cpu, r_cpu = _run("cpu")
    for name, t in on_gpu.items():
        assert t.device.type == "cuda", name
        torch.testing.assert_close(t.cpu(), on_cpu[name], rtol=1e-10, atol=1e-12)
    # the two searches are different floating-point computations and need not follow one
    # path (issue 23 item 13): each answer is the float64 relative change at its own Δ,
    # evaluated on the CPU, and lies in the ball
    X, W = on_cpu["X"], on_cpu["W"]
    for r in (r_gpu, r_cpu):
        assert_justified(r, lambda Z: ws.raf(Z, W.to(Z.device)), X)


def test_pick_device():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device().type == expected and pick_device(None).type == expected
    assert pick_device("cpu") == torch.device("cpu")
    assert describe_device("cpu").startswith("cpu (")
    with pytest.raises(ValueError, match="not a torch device"):
        pick_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no.*visible|none is visible"):
            pick_device("cuda")
