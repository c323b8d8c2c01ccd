"""The training loop in-process with a toy method: non-finite losses, accumulation, outputs,
stop signals, run_state.json, and resumes that have nothing left to train."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import signal

import pytest
import torch
from torch import nn

from contrastive.engine import ImageConfig, NonFiniteLossError, reset_accelerate_state, run, train
from contrastive.methods import Method, ParamGroup


@dataclasses.dataclass
class _Cfg(ImageConfig):
    data: str = "synthetic:n=64,size=16"
    encoder: str = "small_cnn"
    image_size: int = 16
    batch_size: int = 16
    epochs: int = 2
    num_workers: int = 0
    progress: bool = False
    mixed_precision: str = "no"
    save_every_steps: int = 2
    save_every_epochs: int = 0
    log_every: int = 1
    nan_at: int = -1  # the step whose loss is NaN
    signal_at: int = -1  # the optimiser step (0-based) whose forward sends ``signals``
    signals: str = ""  # e.g. "SIGTERM,SIGTERM"
    coupled: bool = True  # the toy's uses_in_batch_negatives (False: a per-sample loss)


class _Toy(Method):
    """Pulls the two views' features together; loss NaN at optimiser step ``nan_at``.

    Declares every loader input and a ``step_seen`` schedule; with ``frozen_steps`` its
    projection is a parameter group frozen for that many optimiser steps. It records what it
    received (labels, indices, the projection's weights)."""

    uses_in_batch_negatives = True
    needs = ("views", "labels", "indices")

    def __init__(self, nan_at: int, frozen_steps: int = 0, signal_at: int = -1,
                 signals: str = "") -> None:
        super().__init__()
        from contrastive.nn import create_encoder

        self.encoder = create_encoder("small_cnn")
        self.proj = nn.Linear(256, 4)
        self.nan_at, self.calls, self.frozen_steps = nan_at, 0, frozen_steps
        self.seen: list[dict] = []
        self.signal_at, self.signals = signal_at, [s for s in signals.split(",") if s]

    def schedules(self):
        return {"step_seen": lambda step, total: float(step), "progress": lambda s, t: s / t}

    def param_groups(self):
        if not self.frozen_steps:
            return []
        return [ParamGroup("proj", list(self.proj.parameters()), frozen_steps=self.frozen_steps)]

    def forward(self, batch):
        a, b = (nn.functional.normalize(self.encoder(v), dim=1) for v in batch["views"])
        loss = (a - b).pow(2).sum(1).mean() + (self.proj(a) - self.proj(b)).pow(2).mean()
        if self.calls == self.nan_at:
            loss = loss * float("nan")
        if int(batch["step_seen"]) == self.signal_at:
            for i, name in enumerate(self.signals):
                sig = getattr(signal, name)
                if i and sig == signal.SIGTERM and signal.getsignal(sig) == signal.SIG_DFL:
                    raise AssertionError("a repeated SIGTERM would kill the process")
                os.kill(os.getpid(), sig)
        call_index = torch.tensor(self.calls)  # a method-specific scalar: logged like the others
        self.calls += 1
        self.seen.append({"labels": batch["labels"].clone(), "indices": batch["indices"].clone(),
                          "proj": self.proj.weight.detach().clone(), "keys": sorted(batch)})
        return {"loss": loss, "pos_acc": torch.tensor(50.0), "call_index": call_index,
                "step_seen": torch.tensor(batch["step_seen"]), "embeddings": a.detach()}


def _pipeline(cfg):
    from contrastive.augment import get_pipeline

    return get_pipeline("mocov2", image_size=cfg.image_size)


def _build(cfg, data):
    toy = _Toy(cfg.nan_at, signal_at=cfg.signal_at, signals=cfg.signals)
    toy.uses_in_batch_negatives = cfg.coupled
    return toy


def _train(tmp_path, **kw):
    cfg = _Cfg(output_dir=str(tmp_path / "run"), **kw)
    return train(cfg, _build, _pipeline, recipe="toy")


def _run_state(tmp_path):
    return json.loads((tmp_path / "run" / "run_state.json").read_text())


def test_nonfinite_loss_stops_naming_the_step_and_keeps_good_checkpoint(tmp_path,
                                                                     fresh_accelerate):
    with pytest.raises(NonFiniteLossError, match=r"at step 2\. The last good checkpoint is "
                                                 r"step 2"):
        _train(tmp_path, nan_at=2, log_every=4)  # checked when step 4 would be saved
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["step_00000002"]  # nothing written from the broken weights
    assert not (tmp_path / "run" / "encoder.pt").exists()
    state = _run_state(tmp_path)  # what a scheduler reads (the launcher only says "1")
    assert state["state"] == "failed" and "non-finite loss" in state["error"]
    assert state["step"] == 2 and state["checkpoint"] == "checkpoints/step_00000002"


def test_nonfinite_loss_skip_continues(tmp_path, fresh_accelerate, caplog):
    caplog.set_level(logging.WARNING)
    result = _train(tmp_path, nan_at=2, on_nonfinite="skip")
    assert result.status == "completed" and result.step == 8
    assert "non-finite loss at step 2" in caplog.text and "skipping" in caplog.text
    payload = torch.load(result.encoder_path, weights_only=True)
    assert all(torch.isfinite(v).all() for v in payload["state_dict"].values()
               if v.is_floating_point())
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
             if x]
    assert all(math.isfinite(r["loss"]) for r in lines if "loss" in r)


@pytest.mark.parametrize("kw, expected", [
    # 4 steps/epoch: a 1-epoch warm-up is the whole of --steps 2
    (dict(steps=2, warmup_epochs=1), "lr warm-up of 4 steps (--warmup-epochs 1 x 4 steps/epoch)"
                                     " >= --steps 2: the whole run is warm-up"),
    (dict(steps=2, warmup_steps=1), None),  # a warm-up in steps that fits: nothing to say
    (dict(warmup_epochs=1), None),  # a budget in epochs
    # a warm-up in epochs that fits --steps 8: an INFO line with its share, not a warning
    (dict(steps=8, warmup_epochs=1), "lr warm-up of 4 steps (--warmup-epochs 1 x 4 "
                                     "steps/epoch) with --steps 8: the warm-up is in epochs, 50%"),
], ids=["epochs-cover-steps", "steps-fit", "epoch-budget", "epochs-fit"])
def test_a_warmup_that_does_not_fit_steps_is_logged_once(tmp_path, fresh_accelerate, caplog,
                                                         kw, expected):
    caplog.set_level(logging.INFO)
    _train(tmp_path, max_steps=1, **kw)
    warnings = [r for r in caplog.records if "warm-up" in r.getMessage()]
    if expected is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].levelno == (
            logging.WARNING if "whole run" in expected else logging.INFO)
        assert warnings[0].getMessage().startswith(expected)
        assert warnings[0].name == "contrastive.engine.trainer"


def test_a_method_span_covering_the_run_is_warned_once(tmp_path, fresh_accelerate, caplog,
                                                      monkeypatch):
    """A Method's settings in steps (DINO's teacher warm-up, frozen last layer): the one that
    covers the whole run (8 steps) is warned about, the one that fits is not."""
    monkeypatch.setattr(_Toy, "step_spans", lambda self: {"warmup_teacher_steps": 8,
                                                          "freeze_last_layer_steps": 7},
                        raising=False)
    caplog.set_level(logging.INFO)
    _train(tmp_path)
    spans = [r for r in caplog.records if "covers the whole run" in r.getMessage()]
    assert [r.levelno for r in spans] == [logging.WARNING]
    assert spans[0].getMessage().startswith("the method's warmup_teacher_steps 8 >= the run's 8 "
                                            "steps")


def test_accumulation_with_in_batch_negatives_is_refused_in_one_line(tmp_path, fresh_accelerate,
                                                                     capsys):
    argv = ["--output-dir", str(tmp_path / "run"), "--grad-accum-steps", "2", "--max-steps", "1"]
    with pytest.raises(SystemExit) as exc:
        run(_Cfg, _build, _pipeline, argv=argv, name="toy")
    assert str(exc.value) == (
        "toy: error: --grad-accum-steps 2 with _Toy: its loss couples the samples of a batch "
        "(in-batch negatives or batch statistics), so micro-batches would train a smaller batch, "
        "another experiment; pass --grad-cache-chunk N instead (the whole batch's exact "
        "gradient, the backbone run N samples at a time)")


def test_accumulation_of_a_per_sample_loss_counts_micro_batches_and_steps(tmp_path,
                                                                          fresh_accelerate):
    result = _train(tmp_path, grad_accum_steps=2, max_steps=3, coupled=False)
    assert result.status == "max_steps" and result.step == 3
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_00000003" / "meta.json")
                      .read_text())
    assert meta["micro_in_epoch"] == 6  # 2 micro-batches of 8 per optimiser step
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["resolved"]["per_process_micro_batch"] == 8
    assert config["resolved"]["grad_cache_chunk"] == 8  # accumulation runs through the cache


def test_the_optimiser_is_fused_by_default_and_a_resume_uses_its_own_setting(tmp_path,
                                                                               fresh_accelerate):
    """On the CPU the engine's SGD steps with torch's fused kernel unless --fused-optimizer
    false; config.json records the kernel used; the flag may change on a resume (the same
    update up to rounding), which then steps with the resumed run's setting."""
    _train(tmp_path, max_steps=2)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["fused_optimizer"] is None and config["resolved"]["optimizer_kernel"] == "fused"
    reset_accelerate_state()
    result = _train(tmp_path, max_steps=4, resume="auto", fused_optimizer=False)
    assert result.step == 4
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["resolved"]["optimizer_kernel"] == "for-loop"


def test_encoder_file_is_plain_backbone(tmp_path, fresh_accelerate):
    result = _train(tmp_path, max_steps=1)
    payload = torch.load(result.encoder_path, weights_only=True)
    from contrastive.nn import create_encoder

    assert payload["encoder"] == "small_cnn" and payload["step"] == 1
    assert payload["method"] == "_Toy" and payload["num_features"] == 256
    create_encoder("small_cnn").load_state_dict(payload["state_dict"], strict=True)


def test_every_scalar_the_method_returns_is_logged_as_a_window_mean(tmp_path, fresh_accelerate):
    _train(tmp_path, max_steps=4, log_every=2)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
             if x]
    records = [r for r in lines if "loss" in r]
    assert [r["step"] for r in records] == [2, 4]
    assert [r["call_index"] for r in records] == [0.5, 2.5]  # means of calls (0, 1) and (2, 3)
    assert all(r["pos_acc"] == 50.0 and "embeddings" not in r for r in records)


def test_schedules_are_evaluated_per_optimiser_step_passed_and_logged(tmp_path,
                                                                      fresh_accelerate):
    _train(tmp_path, max_steps=3, log_every=1, grad_accum_steps=2, coupled=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().split("\n")
             if x]
    records = [r for r in lines if "loss" in r]
    # the two micro-batches of optimiser step s (0-based) are trained as one batch through the
    # gradient cache: one forward call per step, which sees step_seen = s; the schedules'
    # values are logged under their names (8 steps in the run)
    assert [r["step_seen"] for r in records] == [0.0, 1.0, 2.0]
    assert [r["progress"] for r in records] == [0.0, 1 / 8, 2 / 8]
    assert [r["call_index"] for r in records] == [0.0, 1.0, 2.0]


def test_sigterm_saves_then_exits_75_with_run_state_and_resume_completes(tmp_path,
                                                                           fresh_accelerate):
    """A stop signal, repeated (Slurm signals every process and a launcher forwards a copy):
    the run saves after the current step, run() exits with 75 (stopped, resumable), and
    run_state.json says so; the resume then completes with exit status 0."""
    argv = ["--output-dir", str(tmp_path / "run"), "--signal-at", "2", "--signals",
            "SIGTERM,SIGTERM"]
    with pytest.raises(SystemExit) as stopped:
        run(_Cfg, _build, _pipeline, argv=argv, name="toy")
    assert stopped.value.code == 75
    state = _run_state(tmp_path)
    assert state["state"] == "stopped" and state["reason"] == "SIGTERM"
    assert state["step"] == 3 and state["exit_code"] == 75 and state["resumable"] is True
    assert state["checkpoint"] == "checkpoints/step_00000003"
    assert (tmp_path / "run" / state["checkpoint"] / "meta.json").is_file()
    # a late copy of the SIGTERM (after the loop, before the exit) must not kill the run: the
    # handler left behind ignores it, and is a Python handler (SIG_IGN would be inherited)
    late = signal.getsignal(signal.SIGTERM)
    assert late not in (signal.SIG_DFL, signal.SIG_IGN)
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: this test goes on
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    result = run(_Cfg, _build, _pipeline, argv=[*argv, "--resume", "auto"], name="toy")
    assert result.status == "completed" and result.step == 8 and result.steps_trained == 5
    state = _run_state(tmp_path)
    assert state["state"] == "completed" and state["step"] == 8 and state["exit_code"] == 0


def test_second_sigint_stops_at_once_and_is_recorded(tmp_path, fresh_accelerate):
    # a process started in the background by a non-interactive shell ignores SIGINT, and the
    # engine leaves an ignored signal ignored (StopRequests): give this one Python's default
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _train(tmp_path, signal_at=2, signals="SIGINT,SIGINT")
    finally:
        signal.signal(signal.SIGINT, old)
    state = _run_state(tmp_path)
    assert state["state"] == "failed" and "second SIGINT" in state["error"]
    assert state["checkpoint"] == "checkpoints/step_00000002"  # the last periodic one


def _snapshot(run_dir):
    """Every file's modification time and content hash."""
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns,
                                          hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_resume_with_nothing_left_to_train_changes_nothing(tmp_path, fresh_accelerate, caplog):
    """A requeued job whose run already reached --max-steps, or its last epoch, trains nothing
    and rewrites nothing (before: one more step, a new checkpoint, encoder.pt moved, duplicate
    kNN / metrics records each time); a larger --max-steps continues."""
    caplog.set_level(logging.INFO)
    run_dir = tmp_path / "run"
    _train(tmp_path, max_steps=3)
    for max_steps, epochs_done in ((3, False), (5, False), (0, True)):
        before = _snapshot(run_dir)
        caplog.clear()
        result = _train(tmp_path, max_steps=max_steps, resume="auto")
        if max_steps == 5:  # a larger --max-steps continues: 2 more steps, each logged once
            assert result.step == 5 and result.steps_trained == 2
            steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text()
                     .splitlines()]
            assert steps == [1, 2, 3, 4, 5]
            _train(tmp_path, resume="auto")  # to the last epoch (8 steps)
            continue
        assert _snapshot(run_dir) == before
        assert result.steps_trained == 0 and "nothing to train" in caplog.text
        assert ("reached its last epoch" in caplog.text) == epochs_done
        state = _run_state(tmp_path)
        assert state["state"] == "completed" and state["step"] == result.step


def test_the_batch_holds_exactly_the_needs_and_the_schedules(tmp_path, fresh_accelerate):
    """labels are the data set's class labels and indices its indices: two separate keys."""
    from contrastive.data import get_dataset

    made = []
    cfg = _Cfg(output_dir=str(tmp_path / "run"), max_steps=2)
    train(cfg, lambda c, data: made.append(_Toy(-1)) or made[-1], _pipeline, recipe="toy")
    data = get_dataset(cfg.data, "train")
    for seen in made[0].seen:
        assert seen["keys"] == ["indices", "labels", "progress", "step_seen", "views"]
        expected = [data[i][1] for i in seen["indices"].tolist()]
        assert seen["labels"].tolist() == expected and len(set(expected)) > 1
        assert seen["labels"].dtype == seen["indices"].dtype == torch.int64


def test_a_need_the_loader_cannot_provide_fails_before_training(tmp_path, fresh_accelerate):
    class NeedsText(_Toy):
        needs = ("views", "token_ids")

    with pytest.raises(ValueError, match=r"needs batch key\(s\) \['token_ids'\]"):
        train(_Cfg(output_dir=str(tmp_path / "run")), lambda c, data: NeedsText(-1), _pipeline,
              recipe="toy")


def test_a_frozen_parameter_group_does_not_move_for_its_steps(tmp_path, fresh_accelerate):
    made = []
    cfg = _Cfg(output_dir=str(tmp_path / "run"), max_steps=4, weight_decay=0.1)
    train(cfg, lambda c, data: made.append(_Toy(-1, frozen_steps=2)) or made[-1], _pipeline,
          recipe="toy")
    w = [s["proj"] for s in made[0].seen]  # the weights each step's forward saw
    # optimiser steps 0 and 1 drop its gradients (no weight decay, no momentum either), step 2
    # updates it
    assert torch.equal(w[0], w[1]) and torch.equal(w[1], w[2]) and not torch.equal(w[2], w[3])


def test_a_requeued_finished_run_writes_its_missing_encoder_record(tmp_path, fresh_accelerate):
    """Killed between its last checkpoint and encoder.pt: the resume with nothing to train writes
    the record (on 83e79be this path called a string and raised TypeError)."""
    from contrastive.eval.checkpoint import load_encoder

    _train(tmp_path, max_steps=2)
    (tmp_path / "run" / "encoder.pt").unlink()
    result = _train(tmp_path, max_steps=2, resume="auto")
    assert result.steps_trained == 0
    loaded = load_encoder(tmp_path / "run")
    assert loaded.kind == "encoder.pt" and loaded.setting("step") == 2
    assert loaded.image_size == 16 and loaded.mean is not None


def test_auto_precision_is_resolved_once_recorded_and_kept_on_resume(tmp_path, fresh_accelerate,
                                                                     monkeypatch, caplog):
    """``--mixed-precision auto`` is written to config.json (and the checkpoints) as the
    precision it resolved to; a resume with ``auto`` keeps the run's recorded precision even
    where the hardware would pick another, and says so."""
    from contrastive import hardware

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(hardware, "native_bf16_cpu", lambda: (False, "played: no native bf16"))
    caplog.set_level(logging.INFO)
    _train(tmp_path, mixed_precision="auto", max_steps=2, cpu=True)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["mixed_precision"] == "no"
    assert config["resolved"]["precision_reason"] == "auto: played: no native bf16"
    # a run started in bf16 (say, on a CPU with native bf16), resumed with auto on this one
    reset_accelerate_state()  # a new precision needs a new accelerator state
    _train(tmp_path / "b", mixed_precision="bf16", max_steps=1, cpu=True)
    caplog.clear()
    reset_accelerate_state()
    hardware.warn_if_emulated_bf16.cache_clear()  # warned once per process: here, again
    _train(tmp_path / "b", mixed_precision="auto", max_steps=2, cpu=True, resume="auto")
    config = json.loads((tmp_path / "b" / "run" / "config.json").read_text())
    assert config["mixed_precision"] == "bf16" and config["resolved"]["mixed_precision"] == "bf16"
    assert "the precision recorded by the run being resumed" in caplog.text
    assert "several times slower than fp32" in caplog.text  # kept, with the warning


def test_reset_accelerate_state_lets_one_process_start_a_run_in_another_precision(
        fresh_accelerate):
    """Two runs in one process (a notebook, a sweep): a second precision is refused by
    accelerate until the state is reset, then built as asked."""
    from accelerate import Accelerator

    Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="already been initialized"):
        Accelerator(cpu=True, mixed_precision="bf16")
    reset_accelerate_state()
    again = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=3)
    assert (again.mixed_precision, again.gradient_accumulation_steps) == ("bf16", 3)


def test_a_budget_in_steps_ends_inside_an_epoch_and_the_schedule_follows_it(tmp_path,
                                                                          fresh_accelerate):
    """--steps 6 with 4 steps per epoch: 6 steps (the second epoch cut short), the linear
    schedule reaching 0 at step 6, a checkpoint at the end, and a requeue with nothing to do."""
    result = _train(tmp_path, steps=6, epochs=1, lr_schedule="linear", warmup_steps=2,
                    lr_scaling="none", lr=0.1)
    assert result.step == 6 and result.epoch == 2 and result.status == "completed"
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in recs if "loss" in r]
    assert lrs == pytest.approx([0.0, 0.05, 0.1, 0.075, 0.05, 0.025])
    assert _run_state(tmp_path)["state"] == "completed"
    assert _train(tmp_path, steps=6, epochs=1, lr_schedule="linear", warmup_steps=2,
                  lr_scaling="none", lr=0.1, resume="auto").steps_trained == 0


def test_a_resume_keeps_the_best_value_its_step_and_its_artefacts(tmp_path, fresh_accelerate,
                                                                  monkeypatch):
    """``--keep-best``: the best value is checkpointed, so a lower value after a resume
    neither becomes the best nor overwrites ``best/``."""
    from contrastive.engine.kits import image as adapters

    values = iter([0.5, 0.9])  # epochs 1 and 2; every later evaluation scores 0.1

    class Scripted:
        name, per, every, at_start = "scripted", "epoch", 1, False

        def __call__(self, module, accelerator):
            return {"score": next(values, 0.1)}

    monkeypatch.setattr(adapters.ImageAdapter, "evaluators", lambda self, cfg, world: [Scripted()])
    _train(tmp_path, epochs=4, max_steps=8, keep_best="score", save_every_steps=4)
    best_file = tmp_path / "run" / "best" / "encoder.pt"
    written = best_file.read_bytes()
    first = torch.load(tmp_path / "run" / "checkpoints" / "step_00000008" / "best.pt",
                       weights_only=True)
    assert (first["value"], first["step"]) == (0.9, 8)
    reset_accelerate_state()
    _train(tmp_path, epochs=4, keep_best="score", save_every_steps=4, resume="auto")
    last = torch.load(tmp_path / "run" / "checkpoints" / "step_00000016" / "best.pt",
                      weights_only=True)
    assert (last["value"], last["step"]) == (0.9, 8)
    assert best_file.read_bytes() == written


def test_a_batch_larger_than_the_data_is_one_line(tmp_path):
    from tests.engine.test_init import _Cfg, _moco, _pipeline

    with pytest.raises(SystemExit) as stop:
        run(_Cfg, _moco, _pipeline, argv=["--batch-size", "64", "--output-dir", str(tmp_path / "run")],
            name="t")
    assert "fewer than one --batch-size 64: lower the batch size" in str(stop.value)
    assert "\n" not in str(stop.value)


def test_a_method_refusing_its_options_stops_in_one_line(tmp_path, fresh_accelerate):
    """A plain ValueError of the method's constructor (I-JEPA refusing a ViT with a class token,
    say) is the user's input: one line, the method's own message, no traceback."""
    def refusing(cfg, data):
        raise ValueError("_Toy: the encoder must have no class token: build it with "
                         "class_token=False")

    argv = ["--output-dir", str(tmp_path / "run"), "--max-steps", "1"]
    with pytest.raises(SystemExit) as exc:
        run(_Cfg, refusing, _pipeline, argv=argv, name="toy")
    assert str(exc.value) == ("toy: error: _Toy: the encoder must have no class token: build it "
                              "with class_token=False")
    assert exc.value.__cause__ is None and exc.value.__suppress_context__
