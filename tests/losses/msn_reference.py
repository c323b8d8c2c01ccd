"""A float64 transcription of the MSN authors' loss (facebookresearch/msn ``src/losses.py``:
``init_msn_loss`` and ``distributed_sinkhorn``, one process) for the loss and method tests; not
a test module itself."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def authors_loss(anchors, targets, prototypes, num_views, tau=0.1, T=0.25, sinkhorn=True,
                 me_max=True):
    """src/losses.py, one process: init_msn_loss(num_views, tau, me_max) -> loss(...), its
    sharpen / snn / distributed_sinkhorn (use_dist False), transcribed."""
    softmax = torch.nn.Softmax(dim=1)

    def sharpen(p, T):
        sharp_p = p ** (1. / T)
        sharp_p /= torch.sum(sharp_p, dim=1, keepdim=True)
        return sharp_p

    def snn(query, supports, support_labels, temp=tau):
        query = F.normalize(query)
        supports = F.normalize(supports)
        return softmax(query @ supports.T / temp) @ support_labels

    def distributed_sinkhorn(Q, num_itr=3):
        Q = Q.T
        B, K = Q.shape[1], Q.shape[0]
        Q /= torch.sum(Q)
        for _ in range(num_itr):
            Q /= torch.sum(Q, dim=1, keepdim=True)
            Q /= K
            Q /= torch.sum(Q, dim=0, keepdim=True)
            Q /= B
        Q *= B
        return Q.T

    proto_labels = torch.eye(len(prototypes), dtype=prototypes.dtype)
    probs = snn(anchors, prototypes, proto_labels)
    with torch.no_grad():
        t = sharpen(snn(targets, prototypes, proto_labels), T=T)
        if sinkhorn:
            t = distributed_sinkhorn(t)
        t = torch.cat([t for _ in range(num_views)], dim=0)
    loss = torch.mean(torch.sum(torch.log(probs ** (-t)), dim=1))
    rloss = 0.
    if me_max:
        avg_probs = torch.mean(probs, dim=0)
        rloss = - torch.sum(torch.log(avg_probs ** (-avg_probs))) + math.log(float(len(avg_probs)))
    return loss, rloss
