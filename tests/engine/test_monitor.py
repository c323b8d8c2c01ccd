"""The kNN evaluator is contrastive-knn-eval's computation, run on the live encoder."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from contrastive.engine.kits.image import KNNEvaluator
from contrastive.eval.knn import knn_accuracy


def _hand_knn(bank, bank_y, queries, query_y, k, t, c):
    correct = 0
    for q, y in zip(queries, query_y):
        sims = [(float(q @ b) / (q.norm() * b.norm()).item(), int(lab)) for b, lab in zip(bank, bank_y)]
        sims.sort(key=lambda s: -s[0])
        scores = [0.0] * c
        for s, lab in sims[:k]:
            scores[lab] += math.exp(s / t)
        correct += int(max(range(c), key=lambda i: scores[i]) == int(y))
    return 100.0 * correct / len(queries)


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_weighted_knn_equals_hand_loop(k, backend):
    g = torch.Generator().manual_seed(0)
    bank, queries = torch.randn(40, 6, generator=g), torch.randn(15, 6, generator=g)
    bank_y, query_y = torch.randint(0, 4, (40,), generator=g), torch.randint(0, 4, (15,), generator=g)
    got = knn_accuracy(bank, bank_y, queries, query_y, k=k, temperature=0.1, num_classes=4,
                       backend=backend, chunk_size=4)["top1"]
    assert got == pytest.approx(_hand_knn(bank, bank_y, queries, query_y, k, 0.1, 4))


def test_monitor_separable_data_single_process():
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(1)
    y = torch.arange(60) % 3
    x = torch.eye(3)[y] * 5 + torch.randn(60, 3, generator=g)
    data = TensorDataset(x, y)
    knn = KNNEvaluator(data, data, k=5, t=0.1, max_bank=30, num_classes=3, batch_size=7)
    assert len(knn.bank_set) == 30 and len(knn.query_set) == 60
    assert knn.top1(lambda v: v, acc) > 90.0
    assert knn.top1(lambda v: torch.ones_like(v), acc) < 50.0  # a collapsed encoder


def test_monitor_figure_equals_contrastive_knn_eval(tmp_path):
    """Same encoder, data, crop size and batch size: the monitor's top-1 is the command's."""
    from accelerate import Accelerator

    from contrastive.augment import get_pipeline
    from contrastive.data import get_dataset
    from contrastive.eval.checkpoint import load_encoder
    from contrastive.eval.runner import knn_eval
    from contrastive.nn import create_encoder
    from contrastive.records import EncoderRecord

    data, size, norm = "shapes:n=96,n_test=48,size=16", 16, {"mean": (0.5,) * 3, "std": (0.25,) * 3}
    torch.manual_seed(3)
    enc = create_encoder("small_cnn").eval()
    EncoderRecord.from_module(enc, "small_cnn", image_size=size, **norm).save(tmp_path / "encoder.pt")
    cli = knn_eval(load_encoder(tmp_path / "encoder.pt"), data, k=10, temperature=0.1,
                   image_size=size, batch_size=32, num_workers=0, **norm)["top1"]
    tf = get_pipeline("eval", image_size=size, **norm)
    knn = KNNEvaluator(get_dataset(data, "train", transform=tf), get_dataset(data, "test", transform=tf),
                       k=10, t=0.1, batch_size=32, num_classes=10)
    method = torch.nn.Module()
    method.encoder = enc  # the evaluator reads the method's backbone, as the loop hands it
    top1 = knn(method, Accelerator(cpu=True))["knn_top1"]
    assert top1 == cli and 10.0 < top1 < 100.0  # neither chance-only nor degenerate


def test_the_knn_monitor_does_not_change_training(tmp_path, fresh_accelerate):
    """kNN at the start and after each epoch (its loader with a worker process) leaves the
    trained weights bit-identical: no draw from the training's generators."""
    from safetensors.torch import load_file

    from contrastive.augment import get_pipeline
    from contrastive.engine import ImageConfig, train
    from contrastive.methods import SimCLR

    def run(out, knn_every):
        cfg = ImageConfig(data="shapes:n=32,n_test=16,size=16", encoder="small_cnn", image_size=16,
                          batch_size=16, epochs=2, num_workers=1, progress=False,
                          mixed_precision="no", save_every_epochs=0, log_every=1,
                          knn_every=knn_every, knn_k=5, output_dir=str(tmp_path / out))
        return train(cfg, lambda c, data: SimCLR(encoder=c.encoder, dim=8, mlp_hidden=16),
                     lambda c: get_pipeline("simclr", image_size=c.image_size), recipe="knn-test")

    with_knn, without = run("knn", 1), run("plain", 0)
    assert [step for step, _ in with_knn.history("knn_top1")] == [0, 2, 4]
    assert not without.history("knn_top1")
    a, b = (load_file(str(r.checkpoint / "model.safetensors")) for r in (with_knn, without))
    assert all(torch.equal(a[k], b[k]) for k in a)
