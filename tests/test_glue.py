"""wsutils.run.glue: many values glued in one call, as plain Python numbers."""

import math

import numpy as np
import pytest
import torch

from wsutils.run import glue as glue_module
from wsutils.run.glue import glue_values


def test_values_are_plain_numbers(monkeypatch):
    seen = {}
    monkeypatch.setattr("myst_nb.glue", lambda name, value, display: seen.update({name: value}))
    glue_values({"a": np.float64(1.5), "b": torch.tensor(2.0)}, c=np.int64(3), d=[1, 2], e=True)
    assert seen == {"a": 1.5, "b": 2.0, "c": 3, "d": [1, 2], "e": True}
    assert type(seen["a"]) is float and type(seen["b"]) is float and type(seen["c"]) is int


@pytest.mark.parametrize("bad", [math.nan, np.float64(np.inf), torch.tensor(float("nan"))])
def test_a_number_that_is_not_finite_is_refused(bad):
    with pytest.raises(ValueError, match="finite"):
        glue_module._plain("x", bad)


def test_a_name_given_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        glue_values({"a": 1}, a=2)
