"""No kill point loses the run (issue 12, section 3).

A kill is simulated by an exception that nothing in the save catches (``Killed``, a
``BaseException``) raised at one file-system step of a save: every ``mkdir``, write (half the
bytes reach the disk), fsync, rename and delete (part of the folder is gone) of
:class:`~contrastive.engine.checkpoint.CheckpointManager.save`, for a first save (which also
prunes the older checkpoint, ``keep_last=1``) and for a re-save of the same step. The next
start (:meth:`cleanup_partial` then ``--resume auto``) must find the newest complete checkpoint
and load exactly the state that was saved in it.

The same with the real trainer, once per data adapter (``moco_cifar``: images; ``clip``:
image-text pairs; ``simcse``: text; all tiny): killed at each step of a save, then ``--resume auto`` ends
bit-identical to the uninterrupted run (``slow``; one case in the default run: the kill between
the two renames of a re-save). Also: a torn last line of metrics.jsonl, an ``--output-dir`` that
is a file, read-only or on a full disk. The labelled-text adapter (``bert_finetune``) runs only
where its code path differs from the text one: the resumed data order, batch and evaluator
(the re-save kill and the torn line) and its artefacts (``model/classifier.json``,
``results.json``: the finished requeue); the checkpoint files and the folder errors are the
adapter's no business.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from contrastive.engine import checkpoint as ck
from contrastive.engine.checkpoint import (
    CheckpointManager,
    TrainState,
    find_latest,
    model_signature,
    resolve_resume,
    rng_digest,
    tensor_digest,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_safe_resume import CLIP, LABELLED, MOCO, SIMCSE, _run  # noqa: E402

OPS = ("_mkdir", "_write", "_fsync", "_replace", "_rmtree")


class Killed(BaseException):
    """The process died at this point (nothing in the save may catch it)."""


def _inject(monkeypatch, kill_at: int | None, armed=lambda: True) -> list[tuple[str, str]]:
    """Wrap each file-system step of a save; raise :class:`Killed` at the ``kill_at``-th one
    (counted while ``armed()``). Returns the log of the steps taken."""
    log: list[tuple[str, str]] = []
    for name in OPS:
        real = getattr(ck, name)

        def step(*args, _real=real, _name=name):
            if not armed():
                return _real(*args)
            k = len(log)
            log.append((_name, Path(args[0]).name))
            if k == kill_at:
                if _name == "_write":  # half the bytes reached the disk
                    _real(args[0], args[1][: len(args[1]) // 2])
                elif _name == "_rmtree":  # part of the folder is already deleted
                    files = sorted(p for p in Path(args[0]).rglob("*") if p.is_file())
                    for f in files[: len(files) // 2 + 1]:
                        f.unlink()
                raise Killed(f"{_name}({args[0]})")
            return _real(*args)

        monkeypatch.setattr(ck, name, step)
    return log


# ----------------------------------------------------------------------------------------------
# the checkpoint manager alone (a toy model): every step of a save


class _Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        self.register_buffer("queue", torch.randn(5, 4))


@pytest.fixture
def toy(fresh_accelerate):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = _Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _train_step(model, opt) -> None:
    model.net(torch.randn(8, 3)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    model.queue.add_(torch.rand(()))


def _snapshot(model, opt) -> tuple[str, str, str]:
    return tensor_digest(model.state_dict()), tensor_digest(opt.state_dict()), rng_digest()


def _save_with_kill(toy, root: Path, kind: str, kill_at: int | None, monkeypatch):
    """Save step 1, train, then save step 2 ("first") or save step 2 and save it again
    ("resave") with a kill at the ``kill_at``-th step of that last save. Returns the log of
    the steps taken, the state snapshots and the manager."""
    acc, model, opt = toy
    state = TrainState()
    mgr = CheckpointManager(acc, model, opt, state, root, keep_last=1,
                            meta={"signature": model_signature(model)})
    snaps = {}
    state.step = 1
    snaps[1] = _snapshot(model, opt)
    mgr.save()
    _train_step(model, opt)
    state.step = 2
    snaps[2] = _snapshot(model, opt)
    if kind == "resave":
        mgr.save()
    with monkeypatch.context() as m:
        log = _inject(m, kill_at)
        try:
            mgr.save()
        except Killed:
            pass
    return log, snaps, mgr


@pytest.mark.parametrize("kind", ["first", "resave"])
def test_kill_at_every_step_of_a_save_keeps_the_newest_complete_checkpoint(toy, tmp_path, kind,
                                                                         monkeypatch):
    acc, model, opt = toy
    log, _, _ = _save_with_kill(toy, tmp_path / "probe" / "checkpoints", kind, None,
                                monkeypatch)
    # the new checkpoint is complete once its meta.json is in place
    done = log.index(("_replace", "meta.json.part"))
    assert {op for op, _ in log} == set(OPS), log  # every kind of step is among those killed
    for kill_at in range(len(log)):
        run = tmp_path / f"{kind}{kill_at}"
        log_k, snaps, mgr = _save_with_kill(toy, run / "checkpoints", kind, kill_at,
                                                  monkeypatch)
        assert log_k == log[:kill_at + 1]
        where = f"killed at {log[kill_at]} (step {kill_at} of {log})"
        mgr.cleanup_partial()  # the next start
        latest = resolve_resume("auto", run)
        expected = 2 if kind == "resave" or kill_at > done else 1
        assert latest is not None and latest.name == f"step_{expected:08d}", where
        leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
        assert leftovers == [], f"{where}: {leftovers} left behind"
        _train_step(model, opt)  # move on, then come back
        torch.rand(3)
        mgr.load(latest)
        assert _snapshot(model, opt) == snaps[expected], where


def test_kill_between_the_renames_of_a_resave_keeps_the_checkpoint(toy, tmp_path, monkeypatch):
    """The re-save moves the old copy aside, then moves the new one in: a kill in between used
    to leave two complete copies that the next start deleted as "incomplete"."""
    acc, model, opt = toy
    root = tmp_path / "checkpoints"
    state = TrainState()
    mgr = CheckpointManager(acc, model, opt, state, root, keep_last=1,
                            meta={"signature": model_signature(model)})
    state.step = 3
    saved = _snapshot(model, opt)
    mgr.save()
    real_replace, calls = os.replace, []

    def replace(src, dst):  # the rename of the old copy succeeds, then the process dies
        calls.append((Path(src).name, Path(dst).name))
        if Path(src).name == "step_00000003":
            real_replace(src, dst)
            raise Killed("between the renames")
        return real_replace(src, dst)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", replace)
        with pytest.raises(Killed):
            mgr.save()
    assert ("step_00000003", ".tmp-old-step_00000003") in calls
    mgr.cleanup_partial()
    latest = resolve_resume("auto", tmp_path)
    assert latest == root / "step_00000003", sorted(p.name for p in root.iterdir())
    _train_step(model, opt)
    mgr.load(latest)
    assert _snapshot(model, opt) == saved


def test_auto_resume_never_starts_over_a_run(tmp_path):
    from contrastive.engine.checkpoint import RunFolderError

    (tmp_path / "checkpoints" / "step_00000004").mkdir(parents=True)  # no meta.json
    (tmp_path / "encoder.pt").write_bytes(b"weights")
    with pytest.raises(RunFolderError, match=r"no complete checkpoint.*delete .*encoder.pt"):
        resolve_resume("auto", tmp_path)
    (tmp_path / "other" / "checkpoints").mkdir(parents=True)
    (tmp_path / "other" / "metrics.jsonl").write_text("")  # no saved progress: a new run
    assert resolve_resume("auto", tmp_path / "other") is None


def test_torn_last_metrics_line_is_dropped(tmp_path, caplog):
    from contrastive.engine.run_folder import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)]
    path.write_text("\n".join(lines) + '\n{"step": 4, "lo')
    truncate_metrics(path, 2)
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"
    assert "not a complete JSON record" in caplog.text


# ----------------------------------------------------------------------------------------------
# the real trainer, per adapter: 8 steps (2 epochs of 4), a checkpoint every 3 steps + epoch ends

SAVES = ["--save-every-steps", "3", "--keep-last", "1"]
CASES = {"image": ("moco_cifar", [*MOCO, *SAVES]), "image-text": ("clip", [*CLIP, *SAVES]),
         "text": ("simcse", [*SIMCSE, *SAVES]),
         "labelled-text": ("bert_finetune", [*LABELLED, *SAVES])}
#: each recipe's main artefact (the file a requeued finished run rewrites when it is missing)
MAIN = {"moco_cifar": "encoder.pt", "clip": "clip.pt", "simcse": "model/simcse.json",
        "bert_finetune": "model/classifier.json"}


def _adapter_independent(case: tuple[str, list[str]]) -> None:
    """Skip the labelled-text case where the code path is the text adapter's (module
    docstring)."""
    if case[0] == "bert_finetune":
        pytest.skip("adapter-independent path, covered by the text case (simcse)")


def _with(case: tuple[str, list[str]], *extra: str) -> tuple[str, list[str]]:
    """(recipe, its arguments + ``extra``): the arguments of :func:`_run`."""
    return case[0], [*case[1], *extra]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request) -> tuple[str, list[str]]:
    """(recipe, its arguments) of one data adapter."""
    return CASES[request.param]


def _final(out: Path, step: int = 8):
    ckpt = out / "checkpoints" / f"step_{step:08d}"
    return load_file(str(ckpt / "model.safetensors")), torch.load(ckpt / "optimizer.bin",
                                                                  weights_only=True)


def _assert_same(ref: Path, out: Path) -> None:
    (ma, oa), (mb, ob) = _final(ref), _final(out)
    assert set(ma) == set(mb) and all(torch.equal(ma[k], mb[k]) for k in ma), "weights differ"
    assert "queue.queue" in ma or "logit_scale" in ma or "mlp.0.weight" in ma or "head.weight" in ma
    for pid, st in oa["state"].items():
        for name, value in st.items():
            assert torch.equal(value, ob["state"][pid][name]), f"optimizer {pid}.{name}"
    losses = [[(r["step"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").read_text()
                                                    .splitlines()) if "loss" in r]
              for d in (ref, out)]
    assert losses[0] == losses[1] and [s for s, _ in losses[1]] == list(range(1, 9))


@pytest.fixture(scope="module")
def reference(case, tmp_path_factory):
    recipe, args = case
    out = tmp_path_factory.mktemp("kill_ref") / "run"
    _run(recipe, [*args, "--output-dir", str(out)])
    return out


@pytest.fixture(scope="module")
def at_step_4(case, tmp_path_factory):
    """The same run stopped by --max-steps 4 (checkpoint step_00000004 only: --keep-last 1)."""
    recipe, args = case
    out = tmp_path_factory.mktemp("kill_at4") / "run"
    _run(recipe, [*args, "--max-steps", "4", "--output-dir", str(out)])
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000004"]
    return out


def _copy(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(src, out)
    return out


def test_resave_killed_between_renames_then_resume_is_exact(case, reference, at_step_4, tmp_path,
                                                             caplog):
    """The issue's case: --keep-last 1, a re-save of step 4 killed between its two renames (both
    copies complete), and a torn last line in metrics.jsonl. --resume auto continues from step 4
    (it used to delete both copies, start from step 0 and rewrite metrics.jsonl), and ends
    bit-identical to the uninterrupted run."""
    out = _copy(at_step_4, tmp_path)
    root = out / "checkpoints"
    os.replace(root / "step_00000004", root / ".tmp-old-step_00000004")
    shutil.copytree(root / ".tmp-old-step_00000004", root / ".tmp-step_00000004")
    metrics = out / "metrics.jsonl"
    before = metrics.read_text()
    metrics.write_text(before + '{"step": 5, "loss": 0.12')  # power loss mid-line
    caplog.clear()
    caplog.set_level(logging.INFO)
    result = _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    assert "recovered the complete checkpoint" in caplog.text
    assert "resumed from" in caplog.text and "at step 4" in caplog.text
    assert "dropping its last line" in caplog.text
    assert result.step == 8
    assert metrics.read_text().startswith(before), "records of steps 1-4 were rewritten"
    _assert_same(reference, out)


def test_torn_metrics_line_does_not_block_the_resume(case, reference, at_step_4, tmp_path, caplog):
    out = _copy(at_step_4, tmp_path)
    metrics = out / "metrics.jsonl"
    before = metrics.read_text()
    metrics.write_text(before + '{"step": 5, "loss": 0.12')  # a full disk cut the line short
    caplog.set_level(logging.INFO)
    _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    assert "dropping its last line" in caplog.text
    _assert_same(reference, out)


def test_resume_without_a_complete_checkpoint_does_not_start_over(case, at_step_4, tmp_path):
    """Both copies of the only checkpoint damaged: refuse (one line naming the fix) instead of
    training from step 0 over metrics.jsonl and encoder.pt."""
    _adapter_independent(case)
    out = _copy(at_step_4, tmp_path)
    (out / "checkpoints" / "step_00000004" / "meta.json").unlink()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as e:
        _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    msg = str(e.value.code)
    assert "\n" not in msg and "no complete checkpoint" in msg and "delete" in msg, msg
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "run_state.json"}
    assert after == {p: b for p, b in before.items() if p.name != "run_state.json"}


def _kill_in_save(m, save_step: int, kill_at: int | None) -> list[tuple[str, str]]:
    """Arm :func:`_inject` during the trainer's save of ``save_step`` only."""
    saving = {"on": False}
    real_save = CheckpointManager.save

    def save(self):
        saving["on"] = self.state.step == save_step
        try:
            return real_save(self)
        finally:
            saving["on"] = False

    m.setattr(CheckpointManager, "save", save)
    return _inject(m, kill_at, armed=lambda: saving["on"])


@pytest.mark.slow
@pytest.mark.parametrize("save_step", [3, 6])
def test_trainer_killed_at_every_step_of_a_save_resumes_exactly(case, reference, tmp_path, save_step,
                                                                monkeypatch):
    """Step 3: the first checkpoint of the run; step 6: a later one, which prunes step 4."""
    _adapter_independent(case)
    with monkeypatch.context() as m:
        log = _kill_in_save(m, save_step, None)
        _run(*_with(case, "--max-steps", str(save_step), "--output-dir",
                            str(tmp_path / "probe")))
    pruned = {"_rmtree"} if save_step == 6 else set()  # the first save deletes nothing
    assert {op for op, _ in log} == set(OPS) - {"_rmtree"} | pruned, log
    for kill_at in range(len(log)):
        out = tmp_path / f"k{kill_at}"
        with monkeypatch.context() as m:
            _kill_in_save(m, save_step, kill_at)
            with pytest.raises(Killed):
                _run(*_with(case, "--output-dir", str(out)))
        _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
        try:
            _assert_same(reference, out)
        except AssertionError as e:
            raise AssertionError(f"killed at {log[kill_at]} of the save at step {save_step}: "
                                 f"{e}") from None


# ----------------------------------------------------------------------------------------------
# the output folder: a file, read-only, a full disk -- one line, no traceback, nothing lost


def test_output_dir_that_is_a_file(tmp_path):
    out = tmp_path / "run"
    out.write_text("not a folder")
    with pytest.raises(SystemExit) as e:
        _run(*_with(CASES["image"], "--output-dir", str(out), "--resume", "auto"))
    msg = str(e.value.code)
    assert "\n" not in msg and "is a file, not a folder" in msg and "--output-dir" in msg
    assert out.read_text() == "not a folder"


def test_read_only_output_dir(case, at_step_4, tmp_path, monkeypatch):
    """A read-only folder (simulated: tests may run as root, which ignores permissions)."""
    _adapter_independent(case)
    out = _copy(at_step_4, tmp_path)
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if str(path).startswith(str(out)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(SystemExit) as e:
        _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    msg = str(e.value.code)
    assert "\n" not in msg and "Read-only file system" in msg and "writable" in msg, msg
    after = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    assert after == before  # nothing touched


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root ignores folder permissions")
def test_read_only_output_dir_by_permissions(case, at_step_4, tmp_path):
    _adapter_independent(case)
    out = _copy(at_step_4, tmp_path)
    os.chmod(out, 0o555)
    try:
        with pytest.raises(SystemExit) as e:
            _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
        assert "\n" not in str(e.value.code) and "writable" in str(e.value.code)
    finally:
        os.chmod(out, 0o755)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_full_disk_during_a_save(case, reference, at_step_4, tmp_path, monkeypatch):
    """ENOSPC while the checkpoint of step 6 is flushed (where a full disk often shows): one
    line naming the problem and the fix; the checkpoint of step 4 stays complete, and once
    there is space again --resume auto continues from it bit-identically."""
    _adapter_independent(case)
    out = _copy(at_step_4, tmp_path)
    real_fsync = os.fsync

    def full(fd):
        if "/checkpoints/.tmp-step_00000006" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", full)
        with pytest.raises(SystemExit) as e:
            _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    msg = str(e.value.code)
    assert "\n" not in msg and "no space left" in msg and "--output-dir" in msg, msg
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000004"]
    assert find_latest(root) == root / "step_00000004"
    _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    _assert_same(reference, out)


def test_a_finished_run_requeued_changes_nothing(case, reference, tmp_path, caplog):
    """A requeued job whose run already ended trains nothing and rewrites nothing; a missing
    main artefact (encoder.pt; clip.pt for image-text; model/ for text) is written at the run's
    last step."""
    out = _copy(reference, tmp_path)
    snapshot = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    caplog.set_level(logging.INFO)
    result = _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    assert result.steps_trained == 0 and "nothing to train" in caplog.text
    after = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == snapshot
    main = MAIN[case[0]]
    (out / main).unlink()
    result = _run(*_with(case, "--output-dir", str(out), "--resume", "auto"))
    assert result.steps_trained == 0 and result.encoder_path == out / main
    if main.endswith(".json"):  # text: model/simcse.json records the step
        assert json.loads((out / main).read_text())["step"] == 8
    else:
        assert torch.load(out / "encoder.pt", weights_only=True)["step"] == 8
    assert (out / main).is_file()
