#!/usr/bin/env python
"""SimCSE (Gao et al. 2021, arXiv:2104.08821; princeton-nlp/SimCSE) through the training engine.

    # supervised, on the generated task's NLI triples, a small BERT from random init (CPU minutes)
    python recipes/simcse.py --mode sup --pooling avg --lr 1e-3 --steps 100 --batch-size 64 \\
        --layers 2 --hidden 64 --heads 2 --vocab-size 300 --output-dir runs/simcse_sup
    # the paper's supervised run: a downloaded BERT-base and SimCSE's NLI file, STS-B dev
    accelerate launch --multi_gpu --num_processes 2 recipes/simcse.py --mode sup \\
        --encoder hf:/path/to/bert-base-uncased --tokenizer /path/to/bert-base-uncased \\
        --data /path/to/nli_for_simcse.csv --eval /path/to/glue_data/STS-B \\
        --output-dir runs/sup_simcse_bert
    # unsupervised on wiki1m_for_simcse.txt (one sentence a line)
    python recipes/simcse.py --mode unsup --encoder hf:/path/to/bert-base-uncased \\
        --tokenizer /path/to/bert-base-uncased --data /path/to/wiki1m_for_simcse.txt \\
        --eval /path/to/glue_data/STS-B --output-dir runs/unsup_simcse_bert

Training is the engine's (:mod:`contrastive.engine`, the text adapter
:class:`~contrastive.engine.TextAdapter`): every engine flag works (``--max-steps``, ``--steps``,
``--output-dir``, ``--resume auto``, ``--mixed-precision auto``, ``--float64``, checkpoints,
SIGTERM -> exit 75, several processes with ``accelerate launch``: the method gathers the
positives and hard negatives with their gradient, so N processes train as one with the whole
batch). The optimiser is the official ``train.py``'s (the Hugging Face Trainer's defaults):
AdamW, betas 0.9 / 0.999, eps 1e-8, weight decay 0, linear decay to 0 without warm-up, gradient
norm clipped to 1.0.

Paper defaults per ``--mode`` (``--lr``, ``--batch-size``, ``--epochs`` left at 0 take them): sup
lr 5e-5, batch 512, 3 epochs; unsup lr 3e-5, batch 64, 1 epoch (README "Hyperparameters",
BERT-base; ``run_sup_example.sh``, ``run_unsup_example.sh``); max length 32, tau 0.05, [CLS]
pooling with the MLP (unsup: in training only). The default encoder is a small random BERT (not
the paper's, which starts from BERT-base): pass ``--encoder hf:FOLDER``.

Evaluation: STS Spearman (``--eval``: the generated task's graded pairs, or a GLUE STS-B folder)
before training, every ``--eval-every`` steps (the paper: 250) and at the end, into
``metrics.jsonl`` (``sts_spearman``); ``--keep-best sts_spearman`` (the default, as the official
``--metric_for_best_model stsb_spearman --load_best_model_at_end``) keeps the best evaluated
model in ``best/model``. Run folder: the engine's (``config.json``, ``metrics.jsonl``,
``checkpoints/``, ``run_state.json``) plus ``model/`` (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``simcse.json``: the evaluation pooling; the supervised MLP is the model's
pooler, as the authors' ``simcse_to_huggingface.py``), loadable with
``create_encoder("hf:OUT/model")`` and ``contrastive-sts-eval --model OUT/model``. Every field is
a flag: ``python recipes/simcse.py --help``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from contrastive.engine import (
    BertSizes,
    DataInfo,
    TextAdapter,
    TextConfig,
    bad_input,
    cli,
    help_field,
    override,
    parse_config,
    run,
)
from contrastive.methods import SimCSE
from contrastive.methods.simcse import POOLERS
from contrastive.nn.text_encoders import bert_options, check_safe_weights, hf_folder

#: the method's keyword arguments in the paper's setting (the default --mode sup): the one home
#: of these values (SimCSE.from_preset("sup") builds the same); the fields below default to them
PRESET = SimCSE.presets["sup"]

#: the paper's per-mode values (README "Hyperparameters", BERT-base)
PAPER = {"sup": dict(lr=5e-5, batch_size=512, epochs=3),
         "unsup": dict(lr=3e-5, batch_size=64, epochs=1)}


@dataclass
class SimCSEConfig(BertSizes, TextConfig):
    """SimCSE, supervised or unsupervised (see the module docstring for the sources)."""

    mode: str = help_field("sup", "sup | unsup (presets of SimCSE)", choices=("sup", "unsup"))
    data: str = override(
        "generated", "generated | a SimCSE .csv/.tsv (sent0,sent1[,hard_neg]) | a .txt (one "
        "sentence a line). generated: sup = (premise, entailment, contradiction) triples, "
        "unsup = the premises alone")
    n_train: int = help_field(20000, "generated training examples")
    hard_negatives: bool = help_field(True, "generated sup data: keep the contradiction as the "
                                      "hard negative")
    max_length: int = override(32, "tokens per sentence (paper 32)")
    eval_every: int = override(250, "STS evaluation every N steps (paper 250; 0 = at the "
                               "end only)")
    keep_best: str = override(
        "sts_spearman", "keep the model at the best value of this evaluator metric in best/ "
        "(the official --metric_for_best_model stsb_spearman); empty = off")
    # model
    encoder: str = help_field("bert", "bert (random init, sizes below) | hf:FOLDER (pretrained, "
                              "e.g. BERT-base)")
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    dropout: float = override(0.1, "the unsupervised positives' noise")
    pooling: str = help_field(
        PRESET["pooling"], "cls | cls_before_pooler | avg (official pooler_type)",
        choices=POOLERS)
    temperature: float = help_field(PRESET["temperature"], "tau (paper 0.05)")
    # optimisation: the official train.py (Hugging Face Trainer defaults)
    lr: float = override(0.0, "AdamW lr, absolute (0 = paper: sup 5e-5, unsup 3e-5)")
    batch_size: int = override(0, "GLOBAL examples per step (0 = paper: sup 512, unsup 64)")
    epochs: int = override(0, "epochs (0 = paper: sup 3, unsup 1)")
    optimizer: str = override("adamw", "AdamW (the Hugging Face Trainer's)")
    lr_scaling: str = override("none", "lr is absolute")
    lr_schedule: str = override("linear", "linear decay to 0 (the Trainer's default)")
    weight_decay: float = override(0.0, "AdamW weight decay (the Trainer's default 0)")
    betas: tuple[float, float] = override((0.9, 0.999), "AdamW betas (the Trainer's)")
    clip_grad_norm: float = override(1.0, "max gradient norm (the Trainer's 1.0; 0 = off)")
    num_workers: int = override(0, "loader workers (tokenising is cheap: 0 = in the main "
                                "process)")
    log_every: int = 50

    derived_fields: ClassVar[tuple[str, ...]] = ("lr", "batch_size", "epochs")

    def __post_init__(self) -> None:
        """The paper's per-mode lr, batch and epochs where left at 0."""
        for name, value in PAPER.get(self.mode, {}).items():
            if not getattr(self, name):
                setattr(self, name, value)

    def model_info(self) -> dict[str, Any]:
        """``model/simcse.json`` records the preset (``--mode``)."""
        return {"mode": self.mode}

    def validate(self) -> None:
        """The text checks, the encoder's name and the BERT's sizes."""
        super().validate()
        hf_folder(self.encoder)
        self.check_bert_sizes()


def training_data(cfg: SimCSEConfig) -> Any:
    """The training examples (``--data``), a :class:`~contrastive.data.text_batches.SentenceGroups`;
    a file's sentence count per example must fit ``--mode``."""
    from contrastive.data.text_batches import (
        SentenceGroups,
        nli_groups,
        read_sentence_file,
        read_simcse_csv,
    )

    if cfg.data == "generated":
        from contrastive.data.generated_text import generate_nli

        nli = generate_nli(cfg.n_train, seed=cfg.data_seed, split="train")
        if cfg.mode == "unsup":
            return SentenceGroups([(s,) for s in nli.premise])
        return nli_groups(nli, hard_negatives=cfg.hard_negatives)
    path = Path(cfg.data)
    if not path.is_file():
        raise FileNotFoundError(f"--data {cfg.data!r}: no such file; give 'generated', a SimCSE "
                                ".csv (sent0,sent1[,hard_neg]) or a .txt (one sentence a line)")
    data = read_sentence_file(path) if path.suffix.lower() == ".txt" else read_simcse_csv(path)
    if (cfg.mode == "unsup") != (data.size == 1):
        raise ValueError(f"--data {path} has {data.size} sentence(s) per example but --mode "
                         f"{cfg.mode}: unsup takes a .txt of sentences, sup a CSV of pairs/triples")
    return data


def method_kwargs(cfg: SimCSEConfig, vocab_size: int) -> dict[str, Any]:
    """SimCSE's keyword arguments: unsup with [CLS] uses the MLP in training only (the
    official ``--mlp_only_train``)."""
    kwargs = {} if hf_folder(cfg.encoder) else bert_options(**cfg.bert_sizes(),
                                                            vocab_size=vocab_size)
    return dict(encoder=cfg.encoder, pooling=cfg.pooling, temperature=cfg.temperature,
                mlp_only_train=cfg.mode == "unsup" and cfg.pooling == "cls",
                encoder_kwargs=kwargs)


def make() -> tuple[type[SimCSEConfig], Any, TextAdapter]:
    """(config class, build_method, adapter): what ``run`` needs (tests call it too)."""
    return SimCSEConfig, build_method, TextAdapter(training_data)


def build_method(cfg: SimCSEConfig, data: DataInfo) -> SimCSE:
    """SimCSE over the run's tokenizer."""
    return SimCSE(**method_kwargs(cfg, data.tokenizer.vocab_size))


def main(argv: list[str] | None = None) -> Any:
    """Parse ``argv``, refuse an ``hf:`` folder whose weights would run code to load (bad
    input: :func:`~contrastive.engine.cli`'s one line) and train; returns the
    :class:`~contrastive.engine.TrainResult`."""
    cls, build_method, adapter = make()
    cfg = parse_config(cls, argv, prog="simcse.py")
    folder = hf_folder(cfg.encoder)
    if folder:
        with bad_input():
            check_safe_weights(folder)
    return run(cls, build_method, adapter=adapter, argv=argv, name="simcse")


if __name__ == "__main__":
    sys.exit(cli(main, "simcse.py"))
