"""The exact relative change of softmax attention when one word moves: the brute-force side
of the certificates' tests (tests/test_softmax_joint.py, tests/test_verifiers.py)."""

from wsutils.maps import attention


def changes(X, W, norm, i, D):
    """``‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` for each row ``Δ`` of ``D`` (``B × d``) moved into
    word ``i`` of ``X``, for attention with ``norm``."""
    base = attention(X[None], W, normalisation=norm)[0]
    Xi = X.expand(D.shape[0], *X.shape).clone()
    Xi[:, i] += D
    moved = attention(Xi, W, normalisation=norm)
    return (moved - base).flatten(1).norm(dim=1) / base.norm()
