"""Issue 14, items 4, 6, 7 and 8 for the weight samplers (wsutils.weights): weights are a
function of the seed alone, seeds and sizes are checked, not truncated or wrapped, sizes that
cannot fit are refused before allocating, and a missing GPU is a clear error."""

import numpy as np
import pytest
import torch

import wsutils as ws
from wsutils import weights
from wsutils.estimators.rf import rf_weight_block
from wsutils.generalization import rf_blocks
from wsutils.run import device as wsdevice
from wsutils.run.device import DoesNotFit


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_weights_depend_on_the_seed_not_on_the_dtype(dtype):
    """Today float32 draws other normals than float64 (sample_W differs by up to 1.39)."""
    for sample in (
        lambda **kw: ws.sample_W(48, seed=3, **kw),
        lambda **kw: ws.sample_V(7, 3, 4, seed=5, **kw),
        lambda **kw: ws.sample_X(6, 5, seed=1, **kw),
        lambda **kw: ws.sample_Vs(3, 4, 2, seed=2, **kw)[1],
        lambda **kw: weights.gaussian((5, 4), 2.0, seed=9, **kw),
    ):
        low, high = sample(dtype=dtype), sample()
        assert low.dtype == dtype and high.dtype == torch.float64
        assert torch.equal(low, high.to(dtype))


def test_float32_draws_are_a_function_of_the_seed_alone():
    """The two float32-normal samplers (blocks-mode RF, the generalization experiment's
    blocked V) give the same numbers in every dtype."""
    b32 = rf_weight_block(9, 4, 3, 2, seed=7, dtype=torch.float32)
    assert torch.equal(rf_weight_block(9, 4, 3, 2, seed=7, dtype=torch.float64), b32.double())
    g32 = dict(rf_blocks(10, 3, 2, seed=4, block_rows=4, dtype=torch.float32))
    g64 = dict(rf_blocks(10, 3, 2, seed=4, block_rows=4, dtype=torch.float64))
    for start in g32:
        assert torch.equal(g64[start], g32[start].double())


@pytest.mark.parametrize(
    "seed, error",
    [
        (-1, ValueError),
        (2**64 - 1, ValueError),
        (2**63, ValueError),
        (1.7, TypeError),
        (2.0, TypeError),
        (True, TypeError),
        ("3", TypeError),
    ],
)
def test_bad_seeds_are_refused(seed, error):
    """Today −1 draws exactly the weights of 2**64 − 1 and 1.7 those of 1."""
    for sample in (
        lambda: ws.sample_W(3, seed=seed),
        lambda: ws.sample_X(2, 3, seed=seed),
        lambda: ws.sample_V(2, 2, 3, seed=seed),
        lambda: ws.sample_Vs(2, 3, 2, seed=seed),
        lambda: weights.gaussian((2,), 1.0, seed=seed),
    ):
        with pytest.raises(error, match="seed"):
            sample()


def test_seed_range_edges():
    top = 2**63 - 1
    assert torch.equal(ws.sample_W(3, seed=np.int64(top)), ws.sample_W(3, seed=top))
    with pytest.raises(ValueError, match="seed \\+ L − 1"):
        ws.sample_Vs(2, 3, 2, seed=top)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(d=2.7), TypeError, "d must be an integer"),
        (dict(d=True), TypeError, "d must be an integer"),
        (dict(d=-3), ValueError, "positive"),
    ],
)
def test_sizes_are_not_truncated(kwargs, error, match):
    with pytest.raises(error, match=match):
        ws.sample_W(seed=0, **kwargs)
    with pytest.raises(TypeError, match="shape\\[1\\] must be an integer"):
        weights.gaussian((2, 2.7), 1.0, seed=0)


def test_sizes_that_cannot_fit_are_refused_before_allocating():
    with pytest.raises(DoesNotFit, match=r"needs about .* GiB of memory.*available") as err:
        ws.sample_V(10**9, 100, 768, seed=0)
    assert isinstance(err.value, ValueError) and isinstance(err.value, MemoryError)
    with pytest.raises(DoesNotFit, match="DRF layers"):
        ws.sample_Vs(1000, 768, 3, seed=0)
    with pytest.raises(DoesNotFit):
        weights.gaussian((10**6, 10**6), 1.0, seed=0)


def test_the_memory_check_uses_the_available_memory(monkeypatch):
    shape = (4096, 4096)  # 128 MiB of float64 normals
    monkeypatch.setattr(wsdevice, "available_memory", lambda device=None: 100 * 2**20)
    with pytest.raises(DoesNotFit, match="0.125 GiB.*0.0977 GiB"):
        weights.gaussian(shape, 1.0, seed=0)
    monkeypatch.setattr(wsdevice, "available_memory", lambda device=None: 2**30)
    assert weights.gaussian(shape, 1.0, seed=0).shape == shape


def test_available_memory_is_a_positive_number():
    free = wsdevice.available_memory()
    assert free is None or free > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is visible")
def test_cuda_without_a_gpu_is_a_clear_error():
    """Today torch's 'Torch not compiled with CUDA enabled' AssertionError."""
    with pytest.raises(ValueError, match="none is visible.*device='cpu'"):
        ws.sample_W(3, seed=0, device="cuda")
    with pytest.raises(ValueError, match="none is visible"):
        ws.sample_Vs(2, 3, 2, seed=0, device="cuda:0")


def test_cuda_without_a_gpu_is_a_clear_error_anywhere(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="none is visible"):
        ws.sample_X(2, 3, seed=0, device="cuda")
    assert ws.sample_X(2, 3, seed=0, device="auto").device.type == "cpu"
