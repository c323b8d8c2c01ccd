"""Zero-shot classification and retrieval (contrastive.eval.zeroshot) on hand-made embeddings
whose answers are known, the run folder (nothing in it runs code) and the console script."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from contrastive.eval.zeroshot import (
    retrieval_recall,
    zero_shot_accuracy,
    zero_shot_classifier,
)

E = torch.eye(4, dtype=torch.float64)
ROOT = Path(__file__).resolve().parents[2]


def test_classifier_averages_normalised_prompt_embeddings():
    # class "a" prompts point to e0 (twice as long) and e1: the mean of the UNIT vectors is
    # (e0 + e1) / 2, normalised -> 45 degrees; averaging raw vectors would lean to e0.
    vectors = {"x a": 2 * E[0], "y a": E[1], "x b": E[2], "y b": 3 * E[3]}
    clf = zero_shot_classifier(lambda texts: torch.stack([vectors[t] for t in texts]), ["a", "b"],
                               ["x {}", "y {}"])
    s = 2 ** -0.5
    torch.testing.assert_close(clf, torch.tensor([[s, s, 0, 0], [0, 0, s, s]], dtype=torch.float64))


def test_nearest_class_top1_and_top5():
    clf = E[:3]  # three classes along e0, e1, e2
    images = torch.tensor([[5.0, 1, 0, 0], [0, 0.1, 2, 0], [0, 3, 2.9, 0], [1, 0, 0, 9]],
                          dtype=torch.float64)
    labels = torch.tensor([0, 2, 2, 1])
    # predictions 0, 2, 1 (3 > 2.9), 0 (e3 is orthogonal to all: the tie goes to class 0)
    acc = zero_shot_accuracy(images, labels, clf, topk=(1, 2, 5))
    assert acc["top1"] == 50.0 and "top5" not in acc  # k above the number of classes: left out
    # top-2: image 2 -> {1, 2} hit; image 3 ties {0, 1, 2} -> lowest two {0, 1}: label 1 hit
    assert acc["top2"] == 100.0
    with pytest.raises(ValueError, match="disagree"):
        zero_shot_accuracy(images, labels[:3], clf)


def test_retrieval_counts_any_caption_of_an_image():
    images = E[:3]  # image i along e_i
    # texts 0, 1 belong to image 0; text 2 to image 1; text 3 to image 2
    texts = torch.tensor([[0.2, 1, 0, 0], [1, 0, 0.1, 0], [0, 1, 0, 0], [0, 0.1, 1, 0]],
                         dtype=torch.float64)
    owner = torch.tensor([0, 0, 1, 2])
    r = retrieval_recall(images, texts, owner, ks=(1, 2))
    # image->text: image 0's best text is text 1 (its own, though text 0 is not near it): hit;
    # image 1's best is text 2 (hit); image 2's is text 3 (hit)
    assert r["image_to_text_R@1"] == 100.0
    # text->image: text 0 is nearest image 1 (miss at 1, hit at 2); others hit
    assert r["text_to_image_R@1"] == 75.0 and r["text_to_image_R@2"] == 100.0
    with pytest.raises(ValueError, match="image index"):
        retrieval_recall(images, texts, torch.tensor([0, 0, 1, 3]))


def test_a_caption_counts_only_for_its_own_image():
    images = E[:2]
    texts = torch.stack([E[1], E[0]])  # each image's nearest text belongs to the other one
    r = retrieval_recall(images, texts, torch.tensor([0, 1]), ks=(1,))
    assert r == {"image_to_text_R@1": 0.0, "text_to_image_R@1": 0.0}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A clip.pt + tokenizer/ as recipes/clip.py writes them (records.save_clip_record), of an
    untrained tiny CLIP on shapes-captions (the recipe itself: tests/recipes/test_clip_recipe.py)."""
    pytest.importorskip("transformers")
    from contrastive.data.captions import caption_tokenizer
    from contrastive.data.generated import shape_captions
    from contrastive.methods import CLIP
    from contrastive.records import save_clip_record

    out = tmp_path_factory.mktemp("clip") / "run"
    tok = caption_tokenizer(shape_captions(40, 0, "train"), vocab_size=200, max_length=12)
    model_cfg = dict(encoder="small_cnn", dim=8, text_kwargs=dict(
        num_layers=1, hidden_size=16, num_heads=2, vocab_size=tok.vocab_size,
        max_position_embeddings=12, pooling="mean"))
    torch.manual_seed(0)
    model = CLIP(**model_cfg)
    save_clip_record(out, model.state_dict(), {"model": model_cfg, "max_length": 12,
                                               "data": "shapes-captions:n=40,n_test=30",
                                               "image_size": 32}, tok)
    return out, model


def test_the_console_script_reads_a_run_and_equals_the_functions(tiny_run):
    out, model = tiny_run
    from contrastive.data.generated import SHAPE_CLASSES
    from contrastive.eval.zeroshot import evaluate_run, evaluate_shapes, load_clip_run

    again = evaluate_run([str(out), "--n-test", "30"])
    loaded, tok, _ = load_clip_run(out)
    direct = evaluate_shapes(loaded, tok, list(SHAPE_CLASSES), n=30)
    assert again == pytest.approx(direct)
    blob = torch.load(out / "clip.pt", weights_only=True)  # plain tensors and values only
    assert "logit_scale" in blob["state_dict"]


def test_console_script_is_declared():
    cfg = (ROOT / "setup.cfg").read_text()
    assert "contrastive-zeroshot = contrastive.eval.zeroshot:main" in cfg


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_run_file_that_needs_code_is_refused(tiny_run, tmp_path):
    out, _ = tiny_run
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_bytes((out / "tokenizer" /
                                                              "tokenizer.json").read_bytes())

    class Evil:
        def __reduce__(self):
            return (print, ("ran code",))

    (tmp_path / "clip.pt").write_bytes(pickle.dumps({"config": Evil()}))
    from contrastive.eval.zeroshot import load_clip_run

    with pytest.raises(pickle.UnpicklingError):
        load_clip_run(tmp_path)
