"""VICRegL: optimiser steps against a float64 transcription of the authors' forward
(facebookresearch/VICRegL, main_vicregl.py at 803ae4c: ``VICRegL.forward``, ``global_loss``,
``local_loss``, ``_local_loss``, ``_vicreg_loss``, ``neirest_neighbores``; transforms.py's
``_location_to_NxN_grid``), alpha 1 against VICReg, bad batches, presets, and the engine's
refusal of gradient caching and accumulation."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from contrastive.engine.grad_cache import GradCacheError, check_grad_cache
from contrastive.methods import VICReg, VICRegL
from contrastive.nn import stage_features

STEP_TOL = dict(rtol=1e-9, atol=1e-12)  # float64, as tests/methods/test_moco.py argues


#: the registry's small CNN with two blocks: its last stage is a (N, 8, H / 2, W / 2) map
TINY = dict(encoder="small_cnn", encoder_kwargs=dict(widths=(4, 8)))


# --- the authors' code, transcribed (one process: gather_center is centring) -----------------

def grid_of(box, n):
    """transforms.py ``_location_to_NxN_grid(location, N, flip=False)``."""
    i, j, h, w = box
    sh, sw = h / n, w / n
    gx, gy = torch.zeros(n, n, dtype=torch.float64), torch.zeros(n, n, dtype=torch.float64)
    gx[0][0], gy[0][0] = i + sh / 2, j + sw / 2
    for k in range(1, n):
        gx[k][0], gy[k][0] = gx[k - 1][0] + sh, gy[k - 1][0]
    for m in range(1, n):
        gx[0][m], gy[0][m] = gx[0][m - 1], gy[0][m - 1] + sw
    for k in range(1, n):
        for m in range(1, n):
            gx[k][m], gy[k][m] = gx[k - 1][m] + sh, gy[k][m - 1] + sw
    return torch.stack([gx, gy], dim=-1)


def batched_index_select(inp, dim, index):
    for ii in range(1, len(inp.shape)):
        if ii != dim:
            index = index.unsqueeze(ii)
    expanse = list(inp.shape)
    expanse[0], expanse[dim] = -1, -1
    return torch.gather(inp, dim, index.expand(expanse))


def neirest_neighbores(input_maps, candidate_maps, distances, num_matches):
    batch_size = input_maps.size(0)
    if num_matches is None or num_matches == -1:
        num_matches = input_maps.size(1)
    topk_values, topk_indices = distances.topk(k=1, largest=False)
    topk_values, topk_indices = topk_values.squeeze(-1), topk_indices.squeeze(-1)
    sorted_values, sorted_values_indices = torch.sort(topk_values, dim=1)
    sorted_indices, sorted_indices_indices = torch.sort(sorted_values_indices, dim=1)
    mask = torch.stack([torch.where(sorted_indices_indices[i] < num_matches, True, False)
                        for i in range(batch_size)])
    topk_indices_selected = topk_indices.masked_select(mask).reshape(batch_size, num_matches)
    indices = torch.arange(0, topk_values.size(1)).unsqueeze(0).repeat(batch_size, 1)
    indices_selected = indices.masked_select(mask).reshape(batch_size, num_matches)
    return (batched_index_select(input_maps, 1, indices_selected),
            batched_index_select(candidate_maps, 1, topk_indices_selected))


def off_diagonal(x):
    n, m = x.shape
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


class Authors:
    inv_coeff, var_coeff, cov_coeff = 25.0, 25.0, 1.0

    def __init__(self, backbone, projector, maps_projector, alpha, num_matches, embedding_dim):
        self.backbone, self.projector = backbone, projector
        self.maps_projector, self.alpha = maps_projector, alpha
        self.num_matches, self.embedding_dim = num_matches, embedding_dim

    def _vicreg_loss(self, x, y):
        repr_loss = self.inv_coeff * F.mse_loss(x, y)
        x, y = x - x.mean(dim=0), y - y.mean(dim=0)
        std_x, std_y = torch.sqrt(x.var(dim=0) + 0.0001), torch.sqrt(y.var(dim=0) + 0.0001)
        std_loss = self.var_coeff * (torch.mean(F.relu(1.0 - std_x)) / 2
                                     + torch.mean(F.relu(1.0 - std_y)) / 2)
        x, y = x.permute((1, 0, 2)), y.permute((1, 0, 2))
        *_, sample_size, num_channels = x.shape
        non_diag_mask = ~torch.eye(num_channels, dtype=torch.bool)
        x = x - x.mean(dim=-2, keepdim=True)
        y = y - y.mean(dim=-2, keepdim=True)
        cov_x = torch.einsum("...nc,...nd->...cd", x, x) / (sample_size - 1)
        cov_y = torch.einsum("...nc,...nd->...cd", y, y) / (sample_size - 1)
        cov_loss = (cov_x[..., non_diag_mask].pow(2).sum(-1) / num_channels) / 2 + (
            cov_y[..., non_diag_mask].pow(2).sum(-1) / num_channels) / 2
        return repr_loss, std_loss, self.cov_coeff * cov_loss.mean()

    def _local_loss(self, maps_1, maps_2, location_1, location_2):
        inv_loss = var_loss = cov_loss = 0.0
        for kind in ("l2", "location"):  # l2_all_matches = 1: every feature match
            if kind == "l2":
                m1 = neirest_neighbores(maps_1, maps_2, torch.cdist(maps_1, maps_2), None)
                m2 = neirest_neighbores(maps_2, maps_1, torch.cdist(maps_2, maps_1), None)
            else:
                l1, l2 = location_1.flatten(1, 2), location_2.flatten(1, 2)
                m1 = neirest_neighbores(maps_1, maps_2, torch.cdist(l1, l2), self.num_matches[0])
                m2 = neirest_neighbores(maps_2, maps_1, torch.cdist(l2, l1), self.num_matches[1])
            inv_1, var_1, cov_1 = self._vicreg_loss(*m1)
            inv_2, var_2, cov_2 = self._vicreg_loss(*m2)
            var_loss = var_loss + (var_1 / 2 + var_2 / 2)
            cov_loss = cov_loss + (cov_1 / 2 + cov_2 / 2)
            inv_loss = inv_loss + (inv_1 / 2 + inv_2 / 2)
        return inv_loss, var_loss, cov_loss

    def local_loss(self, maps_embedding, locations):
        num_views = len(maps_embedding)
        inv_loss = var_loss = cov_loss = 0.0
        iter_ = 0
        for i in range(2):
            for j in np.delete(np.arange(np.sum(num_views)), i):
                inv, var, cov = self._local_loss(maps_embedding[i], maps_embedding[j],
                                                 locations[i], locations[j])
                inv_loss, var_loss, cov_loss = inv_loss + inv, var_loss + var, cov_loss + cov
                iter_ += 1
        return inv_loss / iter_, var_loss / iter_, cov_loss / iter_

    def global_loss(self, embedding):
        num_views = len(embedding)
        inv_loss, iter_ = 0.0, 0
        for i in range(2):
            for j in np.delete(np.arange(np.sum(num_views)), i):
                inv_loss = inv_loss + F.mse_loss(embedding[i], embedding[j])
                iter_ = iter_ + 1
        inv_loss = self.inv_coeff * inv_loss / iter_
        var_loss = cov_loss = 0.0
        iter_ = 0
        for i in range(num_views):
            x = embedding[i] - embedding[i].mean(dim=0)
            std_x = torch.sqrt(x.var(dim=0) + 0.0001)
            var_loss = var_loss + torch.mean(torch.relu(1.0 - std_x))
            cov_x = (x.T @ x) / (x.size(0) - 1)
            cov_loss = cov_loss + off_diagonal(cov_x).pow_(2).sum().div(self.embedding_dim)
            iter_ = iter_ + 1
        return inv_loss, self.var_coeff * var_loss / iter_, self.cov_coeff * cov_loss / iter_

    def forward(self, views, locations):
        embeddings, maps_embeddings = [], []
        for x in views:
            x = stage_features(self.backbone, x)[-1]  # resnet.py 283-299: maps and their mean
            representation = x.mean(dim=(2, 3))
            maps = x.flatten(2, 3).permute(0, 2, 1)
            embeddings.append(self.projector(representation))
            batch_size, num_loc, _ = maps.shape
            maps_embedding = self.maps_projector(maps.flatten(start_dim=0, end_dim=1))
            maps_embeddings.append(maps_embedding.view(batch_size, num_loc, -1))
        inv, var, cov = self.global_loss(embeddings)
        loss = self.alpha * (inv + var + cov)
        m_inv, m_var, m_cov = self.local_loss(maps_embeddings, locations)
        return loss + (1 - self.alpha) * (m_inv + m_var + m_cov)


# --- the tests -------------------------------------------------------------------------------

def _batch(g, n=4, sizes=(8, 8, 4)):
    """Views, and random crop boxes (N, V, 4) of a 40 x 40 image."""
    views = [torch.randn(n, 3, s, s, generator=g, dtype=torch.float64) for s in sizes]
    corner = torch.rand(n, len(sizes), 2, generator=g, dtype=torch.float64) * 20
    side = 8 + torch.rand(n, len(sizes), 2, generator=g, dtype=torch.float64) * 12
    return views, torch.cat([corner, side], dim=2)


def test_steps_match_a_transcription_of_the_authors_forward():
    torch.manual_seed(0)
    alpha, k, lr = 0.75, (5, 2), 0.05
    method = VICRegL(**TINY, dim=6, mlp_hidden=10, maps_dim=5, maps_hidden=7, alpha=alpha,
                     num_matches=k).double()
    ref = Authors(copy.deepcopy(method.encoder), copy.deepcopy(method.projector),
                  copy.deepcopy(method.maps_projector), alpha, k, 6)
    ref_params = [*ref.backbone.parameters(), *ref.projector.parameters(),
                  *ref.maps_projector.parameters()]
    start = [p.detach().clone() for p in method.parameters()]
    opt = torch.optim.SGD(method.parameters(), lr=lr)
    opt_ref = torch.optim.SGD(ref_params, lr=lr)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        views, boxes = _batch(g)
        out = method({"views": views, "crop_boxes": boxes})
        # the maps are 4 x 4 (8 px) and 2 x 2 (4 px), as the code's 7 x 7 and 3 x 3 grids
        locations = [torch.stack([grid_of(b.tolist(), v.shape[-1] // 2) for b in boxes[:, i]])
                     for i, v in enumerate(views)]
        loss = ref.forward(views, locations)
        for o, model in ((opt, out["loss"]), (opt_ref, loss)):
            o.zero_grad()
            model.backward()
            o.step()
        torch.testing.assert_close(out["loss"].detach(), loss.detach(), **STEP_TOL)
    ours = [*method.encoder.parameters(), *method.projector.parameters(),
            *method.maps_projector.parameters()]
    for a, b in zip(ours, ref_params, strict=True):
        torch.testing.assert_close(a, b, **STEP_TOL)
    assert max(float((p.detach() - q).abs().max())
               for p, q in zip(method.parameters(), start)) > 1e-3


def test_alpha_one_is_vicreg_with_half_the_covariance_and_needs_no_boxes(views):
    x1, x2 = views(n=6, size=6)
    torch.manual_seed(0)
    ours = VICRegL(**TINY, dim=6, mlp_hidden=10, alpha=1.0)
    torch.manual_seed(0)
    vicreg = VICReg(**TINY, dim=6, mlp_hidden=10, cov_coeff=0.5)
    assert ours.maps_projector is None
    out = ours({"views": [x1, x2]})
    torch.testing.assert_close(out["loss"], vicreg({"views": [x1, x2]})["loss"])
    assert "loss_local" not in out


def test_bad_batches_and_settings_raise_one_line_errors(views):
    x1, x2 = views(n=4, size=4)  # 2 x 2 maps
    method = VICRegL(**TINY, dim=6, mlp_hidden=10, maps_dim=5, maps_hidden=7,
                     num_matches=(2, 2))
    with pytest.raises(KeyError, match="crop_boxes"):
        method({"views": [x1, x2]})
    with pytest.raises(ValueError, match=r"crop_boxes'\] must be \(N, 2, 4\)"):
        method({"views": [x1, x2], "crop_boxes": torch.zeros(4, 3, 4)})
    boxes = torch.tensor([0.0, 0.0, 8.0, 8.0]).expand(4, 2, 4)
    assert torch.isfinite(method({"views": [x1, x2], "crop_boxes": boxes})["loss"])
    big = VICRegL(**TINY, dim=6, mlp_hidden=10, num_matches=(5, 2))
    with pytest.raises(ValueError, match="lower --num-matches"):
        big({"views": [x1, x2], "crop_boxes": boxes})
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="alpha"):
            VICRegL(**TINY, alpha=bad)


def test_presets_are_the_authors_resnet50_setting():
    p = VICRegL.presets["resnet50"]
    assert (p["encoder"], p["dim"], p["mlp_hidden"], p["maps_dim"], p["maps_hidden"],
            p["alpha"], p["num_matches"]) == ("torchvision:resnet50", 8192, 8192, 512, 512,
                                               0.75, (20, 4))


def test_engine_refuses_grad_cache_and_accumulation():
    method = VICRegL(**TINY, dim=6, mlp_hidden=10, maps_dim=5, maps_hidden=7)
    with pytest.raises(GradCacheError, match="batch statistics"):
        check_grad_cache(method, 0, 2)
    with pytest.raises(GradCacheError, match="no backbone the engine can cache"):
        check_grad_cache(method, 2, 1)
    assert check_grad_cache(method, 0, 1) == "plain"
