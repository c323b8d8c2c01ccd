"""Bad arguments raise ValueError naming the argument and the shapes seen."""

from __future__ import annotations

import pytest
import torch

from contrastive.losses import functional as LF
from contrastive.losses import get_loss


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: LF.infonce(r(4, 8), r(4, 8), temperature=0), r"`temperature`.*got 0"),
        (lambda: LF.infonce(r(4, 8), r(4, 8), reduction="avg"), r"`reduction`.*'avg'"),
        (lambda: LF.infonce(r(8), r(4, 8)), r"`query`.*\(N, D\).*\(8,\)"),
        (lambda: LF.infonce(r(4, 8), r(4, 7)), r"`key`.*query \(4, 8\) and key \(4, 7\)"),
        (lambda: LF.infonce(r(4, 8), r(3, 8)), r"`key`.*M >= N.*\(3, 8\)"),
        (lambda: LF.infonce(r(4, 8), r(4, 8), r(5, 7)), r"`negatives`.*\(5, 7\)"),
        (
            lambda: LF.infonce(r(4, 8), r(8, 8), positive_offset=5),
            r"`positive_offset`.*\[0, 4\].*5",
        ),
        (lambda: LF.infonce(r(4, 8), r(8, 8), positive_offset=-1), r"`positive_offset`"),
        (
            lambda: LF.infonce(r(4, 8), r(4, 8), positive_offset=1.5),
            r"`positive_offset` must be an int",
        ),
        (lambda: LF.infonce(r(4, 8), r(4, 8), r(5, 8), symmetric=True), r"`symmetric=True`"),
        (lambda: LF.infonce(r(4, 8), r(8, 8), symmetric=True), r"`symmetric=True`.*\(8, 8\)"),
        (lambda: LF.infonce(r(0, 8), r(0, 8)), r"`query` is empty"),
        (
            lambda: LF.infonce(torch.ones(4, 8, dtype=torch.long), r(4, 8)),
            r"`query`.*floating.*int64",
        ),
        (lambda: LF.ntxent(r(4, 8), r(5, 8)), r"`z1` and `z2`.*\(4, 8\).*\(5, 8\)"),
        (lambda: LF.ntxent(r(4, 8), r(4, 8), z1_all=r(8, 8)), r"both `z1_all` and `z2_all`"),
        (
            lambda: LF.ntxent(r(4, 8), r(4, 8), positive_offset=4),
            r"`positive_offset`.*needs `z1_all`",
        ),
        (
            lambda: LF.ntxent(r(4, 8), r(4, 8), z1_all=r(8, 8), z2_all=r(8, 7)),
            r"`z1_all` and `z2_all`.*\(8, 7\)",
        ),
        (
            lambda: LF.ntxent(r(4, 8), r(4, 8), z1_all=r(8, 8), z2_all=r(8, 8), positive_offset=6),
            r"`positive_offset`.*\[0, 4\]",
        ),
        (lambda: LF.ntxent(r(4, 8), r(4, 8), temperature=-1.0), r"`temperature`"),
        (lambda: LF.dcl(r(1, 8), r(1, 8)), r"at least 2 samples.*\(1, 8\)"),
        (lambda: LF.cosnce(r(1, 8), r(1, 8)), r"N >= 2.*\(1, 8\)"),
        (lambda: LF.cosnce(r(4, 8), r(4, 6)), r"`student` and `teacher`.*\(4, 8\).*\(4, 6\)"),
        (lambda: LF.cosnce(r(4, 8), r(4, 8), r(3, 2, 8)), r"`negatives`.*\(3, 2, 8\)"),
        (lambda: LF.cosnce(r(4, 8), r(4, 8), r(3, 7)), r"`negatives`.*\(3, 7\)"),
        (lambda: LF.cosnce(r(4, 8), r(4, 8), r(8)), r"`negatives`.*\(8,\)"),
        (lambda: LF.supcon(r(4, 8), torch.arange(4)), r"`features`.*\(N, V, D\).*\(4, 8\)"),
        (lambda: LF.supcon(r(4, 2, 8), torch.arange(3)), r"`labels`.*\(4,\).*\(3,\)"),
        (lambda: LF.supcon(r(4, 2, 8), torch.zeros(4)), r"`labels`.*integer.*float32"),
        (lambda: LF.supcon(r(1, 1, 8)), r"at least 2 views"),
        (
            lambda: LF.kd(r(4, 10), r(4, 11)),
            r"`student_logits` and `teacher_logits`.*\(4, 10\).*\(4, 11\)",
        ),
        (lambda: LF.kd(r(4, 10), r(4, 10), temperature=0.0), r"`temperature`"),
        (
            lambda: get_loss("infonce", temperature=0.001, learnable_temperature=True),
            r"max_logit_scale",
        ),
    ],
)
def test_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_module_forward_checks_shapes_too():
    with pytest.raises(ValueError, match=r"`key`"):
        get_loss("infonce")(r(4, 8), r(4, 9))


def test_tensor_temperature_is_accepted():
    q, k = r(4, 8), r(4, 8)
    torch.testing.assert_close(
        LF.infonce(q, k, temperature=torch.tensor(0.2)), LF.infonce(q, k, temperature=0.2)
    )
    with pytest.raises(ValueError, match="`temperature` tensor must hold one value"):
        LF.infonce(q, k, temperature=torch.ones(2))
