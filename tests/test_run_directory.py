"""A run directory's training state resumes only into the run that made it: ``run.json`` records the run, and a run
by other options (recipe, data, slice, head) stops with one error naming the fields that differ."""
import json
import os

from unittest import mock

import numpy as np
import pytest

from otzoo import cli
from training.recipes import classification, few_shot, run_directory
from training.recipes.common import preset_spec
from training.recipes.run_directory import (
    RUN_FILE,
    TRAINING_STATE,
    ResumeMismatchError,
    claim_run_directory,
    run_identity,
)
from training.tuning import search
from zoo.preset_format import PresetFormatError

GAP = "resnet20_gap_fashion_mnist"
FEW_SHOT = "resnet20_emd_fewshot_fashion_mnist"


def _state(out, name="backup"):
    """Training state in ``out``: a file inside ``name`` (a folder) or ``name`` itself (a file)."""
    path = out / name
    if "." in name:
        path.write_bytes(b"weights")
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "latest.weights.h5").write_bytes(b"weights")


def _recorded(out):
    return json.loads((out / RUN_FILE).read_text())


def test_a_directory_resumes_only_the_run_it_records(tmp_path, capsys):
    ten, sixty = (run_identity(preset_spec(GAP, epochs=epochs), limit=None) for epochs in (10, 60))
    out = tmp_path / "run"
    claim_run_directory(str(out), ten)  # a new directory: created and recorded
    assert _recorded(out) == ten

    _state(out)
    claim_run_directory(str(out), ten)  # the same run: resumed
    with pytest.raises(ResumeMismatchError) as error:
        claim_run_directory(str(out), sixty)
    assert "recipe.epochs: 10 there, 60 here" in str(error.value) and str(error.value).startswith("`out_dir` ")
    assert error.value.option_message().startswith(f"--out {out} holds the training state (backup)")
    assert _recorded(out) == ten  # a refusal changes nothing

    other_slice = run_identity(preset_spec(GAP, epochs=10), limit=512)
    with pytest.raises(ResumeMismatchError, match="options.limit: null there, 512 here"):
        claim_run_directory(str(out), other_slice)

    os.remove(out / RUN_FILE)  # state from before runs recorded themselves: resumed, with a line, and recorded
    claim_run_directory(str(out), sixty)  # but for the trainer of its backup, not known
    assert "whose run is not recorded" in capsys.readouterr().out
    assert _recorded(out) == {key: value for key, value in sixty.items() if key != "trainer"}

    (out / "backup" / "latest.weights.h5").unlink()  # an empty backup folder holds nothing to resume
    claim_run_directory(str(out), ten)
    assert _recorded(out) == ten


def test_the_error_names_four_differences_and_counts_the_rest(tmp_path):
    out = tmp_path / "run"
    first = run_identity(preset_spec(GAP), limit=None)
    claim_run_directory(str(out), first)
    _state(out)
    other = run_identity(preset_spec(GAP, epochs=3, seed=4, batch_size=32, learning_rate=0.5, momentum=0.5),
                         limit=100)
    with pytest.raises(ResumeMismatchError) as error:
        claim_run_directory(str(out), other)
    assert len(error.value.differences) == 6
    assert str(error.value).count(" there, ") == 4 and "and 2 more" in str(error.value)


class _Stop(Exception):
    """Raised in place of the data and model set-up: the run got past its directory's check."""


@pytest.fixture
def stopped_after_claim(monkeypatch):
    """Runs that stop right after claiming their directory (the data and model set-up before it is a stand-in)."""
    def claim_then_stop(*args, **kwargs):
        run_directory.claim_run_directory(*args, **kwargs)
        raise _Stop

    for module in (classification, few_shot, search):
        monkeypatch.setattr(module, "claim_run_directory", claim_then_stop)
    monkeypatch.setattr(classification, "training_setup", lambda *args, **kwargs: mock.MagicMock())
    monkeypatch.setattr(few_shot, "training_setup", lambda *args, **kwargs: mock.MagicMock())


def _tuning_data(examples):
    """A stand-in for the search's data: ``examples`` training images (and as many validation images)."""
    def data(limit, validation_fraction, seed):
        part = (np.zeros((examples, 28, 28, 1), np.float32), np.zeros(examples, np.int32))
        return part, part, "a stand-in split"
    return data


def test_otzoo_train_resume_with_other_options_is_one_line_naming_out(tmp_path, capsys, stopped_after_claim):
    """The record a run of ``otzoo train`` writes is the one the same command computes again (it resumes), and the
    command with another --epochs refuses the directory in one line, exit status 2, before reading any data."""
    out = tmp_path / "run"
    with pytest.raises(_Stop):
        cli.main(["train", GAP, "--epochs", "2", "--limit", "256", "--out", str(out)])
    _state(out)  # killed after its first epoch's backup
    with pytest.raises(_Stop):  # the same options: past the check
        cli.main(["train", GAP, "--epochs", "2", "--limit", "256", "--out", str(out), "--resume"])
    capsys.readouterr()
    assert cli.main(["train", GAP, "--epochs", "3", "--limit", "256", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"otzoo train: error: --out {out} holds the training state (backup) of another run")
    assert "recipe.epochs: 2 there, 3 here" in err


def test_a_backup_resumes_only_under_the_trainer_that_wrote_it(tmp_path, monkeypatch):
    """``run.json`` records the trainer (``model.fit`` or the multi-worker loop, whose backups the other cannot
    read): a run by the other one is refused, naming it and how to resume. A record of an earlier otzoo, without a
    trainer, resumes as before."""
    from training.distributed import strategies

    spec = preset_spec(GAP, epochs=2)
    assert run_identity(spec, limit=None)["trainer"] == run_directory.MODEL_FIT == run_directory.current_trainer()
    monkeypatch.setattr(strategies, "_MULTI_WORKER", [object()])  # the process made its MultiWorkerMirroredStrategy
    looped = run_identity(spec, limit=None)
    assert looped["trainer"] == run_directory.MULTI_WORKER_LOOP
    monkeypatch.setattr(strategies, "_MULTI_WORKER", [])
    fitted = run_identity(spec, limit=None)

    out = tmp_path / "run"
    claim_run_directory(str(out), looped)
    _state(out)
    claim_run_directory(str(out), looped)  # the same trainer: resumed
    with pytest.raises(ResumeMismatchError) as error:
        claim_run_directory(str(out), fitted)
    assert error.value.differences == ['trainer: "multi_worker_loop" there, "model.fit" here (resume it with '
                                       '--workers N or under its TF_CONFIG cluster, as it began)']
    assert _recorded(out) == looped

    old = {key: value for key, value in looped.items() if key != "trainer"}  # an earlier otzoo's record
    (out / RUN_FILE).write_text(json.dumps(old))
    claim_run_directory(str(out), fitted)
    # its trainer stays unknown: a resume under the wrong one (refused by the backup's reader) leaves the other open
    assert _recorded(out) == old
    claim_run_directory(str(out), looped)
    assert _recorded(out) == old


def test_otzoo_train_refuses_a_backup_of_the_other_trainer_before_any_work(tmp_path, capsys, monkeypatch,
                                                                          stopped_after_claim):
    """A run begun with ``--workers 2`` (the multi-worker loop's checkpoints) resumed without it, or the reverse,
    failed once the data were read and the model built, with an error naming ``directory`` or ``backup_dir``; it is
    one line naming --out and --workers now, before any worker starts."""
    def no_cluster(*args, **kwargs):
        raise AssertionError("workers were launched")

    monkeypatch.setattr(cli, "run_cluster", no_cluster)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    out = tmp_path / "run"
    command = ["train", GAP, "--epochs", "2", "--limit", "256", "--out", str(out)]
    with pytest.raises(_Stop):
        cli.main(command)
    assert _recorded(out)["trainer"] == "model.fit"
    _state(out)
    capsys.readouterr()
    assert cli.main(command + ["--workers", "2", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"otzoo train: error: --out {out}: its backup was written by model.fit (one process: otzoo train "
                   "without --workers), which this run, trained by the multi-worker loop (otzoo train --workers N, or "
                   "a TF_CONFIG cluster), cannot read; resume it without --workers, as it began, or train into "
                   "another --out")

    record = _recorded(out)
    record["trainer"] = "multi_worker_loop"  # as the workers of `otzoo train --workers 2` record it
    (out / RUN_FILE).write_text(json.dumps(record))
    assert cli.main(command + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"otzoo train: error: --out {out}: its backup was written "
                                                         "by the multi-worker loop")
    assert "resume it with --workers N or under its TF_CONFIG cluster, as it began" in err
    with pytest.raises(AssertionError, match="workers were launched"):  # the same trainer: past the check
        cli.main(command + ["--workers", "2", "--resume"])
    del record["trainer"]  # an earlier otzoo's record: resumed as before
    (out / RUN_FILE).write_text(json.dumps(record))
    with pytest.raises(_Stop):
        cli.main(command + ["--resume"])


def test_a_few_shot_run_keeps_its_pretrained_backbone_for_its_own_run_only(tmp_path, stopped_after_claim):
    """A few-shot run resumes from its pre-trained backbone and meta-training checkpoints as well as its backup:
    another number of pre-training epochs or episodes refuses them."""
    out = tmp_path / "run"
    with pytest.raises(_Stop):
        few_shot.train(FEW_SHOT, str(out), epochs=2, episodes=100)
    _state(out, few_shot.PRETRAINED_FILE)
    _state(out, few_shot.META_CHECKPOINTS)
    with pytest.raises(_Stop):
        few_shot.train(FEW_SHOT, str(out), epochs=2, episodes=100)
    with pytest.raises(ResumeMismatchError) as error:
        few_shot.train(FEW_SHOT, str(out), epochs=2, episodes=200)
    assert error.value.state == [few_shot.PRETRAINED_FILE, few_shot.META_CHECKPOINTS]
    assert error.value.differences == ["recipe.meta_episodes: 100 there, 200 here"]


def test_otzoo_tune_resumes_the_same_search_only(tmp_path, capsys, monkeypatch, stopped_after_claim):
    """``otzoo tune --resume`` continues a search by its own settings (more --trials allowed); another --epochs is
    one line naming --out; with --overwrite the search restarts, whatever its tuner/ held."""
    monkeypatch.setattr(classification, "tuning_data", _tuning_data(512))  # where the search reads its data
    mpw, out = "resnet20_mpw_fashion_mnist", tmp_path / "tune"
    command = ["tune", mpw, "--limit", "512", "--epochs", "1", "--out", str(out)]
    with pytest.raises(_Stop):
        cli.main(command + ["--trials", "3"])
    _state(out, "tuner")
    with pytest.raises(_Stop):
        cli.main(command + ["--trials", "6", "--resume"])
    capsys.readouterr()
    other = ["tune", mpw, "--limit", "512", "--epochs", "2", "--out", str(out), "--trials", "3"]
    assert cli.main(other + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"otzoo tune: error: --out {out} holds the training state")
    assert "options.epochs: 1 there, 2 here" in err
    with pytest.raises(_Stop):  # a new search in the same directory
        cli.main(other + ["--overwrite"])
    assert _recorded(out)["options"]["epochs"] == 2


def test_a_search_whose_trials_left_the_weight_decay_out_is_not_resumed(tmp_path, capsys, monkeypatch,
                                                                         stopped_after_claim):
    """An earlier otzoo's trials left the recipe's weight decay out (its ``run.json`` records no
    ``options.weight_decay``): continuing its search would rank trials of two objectives together, so ``--resume``
    refuses it in one line; a search on a small backbone, which has no weight decay, records 0."""
    monkeypatch.setattr(classification, "tuning_data", _tuning_data(512))
    mpw, out = "resnet20_mpw_fashion_mnist", tmp_path / "tune"
    command = ["tune", mpw, "--limit", "512", "--epochs", "1", "--trials", "2", "--out", str(out)]
    with pytest.raises(_Stop):
        cli.main(command)
    _state(out, "tuner")
    record = _recorded(out)
    assert record["options"]["weight_decay"] == 0.0005
    del record["options"]["weight_decay"]
    (out / RUN_FILE).write_text(json.dumps(record))
    capsys.readouterr()
    assert cli.main(command + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "options.weight_decay: absent there, 0.0005 here" in err
    with pytest.raises(_Stop):
        cli.main(command + ["--backbone", "small_convnet", "--out", str(tmp_path / "quick")])
    assert _recorded(tmp_path / "quick")["options"]["weight_decay"] == 0.0


def test_a_refused_command_leaves_the_run_record_as_it_was(tmp_path, capsys, monkeypatch, stopped_after_claim):
    """A search refused for its input (too few training images left) leaves ``run.json`` as it was, so the search
    recorded there still resumes (the record used to be replaced before the data were checked)."""
    mpw, out = "resnet20_mpw_fashion_mnist", tmp_path / "tune"
    monkeypatch.setattr(classification, "tuning_data", _tuning_data(512))
    command = ["tune", mpw, "--limit", "512", "--epochs", "1", "--trials", "2", "--out", str(out)]
    with pytest.raises(_Stop):
        cli.main(command)
    _state(out, "tuner")
    before = (out / RUN_FILE).read_bytes()
    monkeypatch.setattr(classification, "tuning_data", _tuning_data(80))
    assert cli.main(["tune", mpw, "--limit", "100", "--trials", "1", "--out", str(out), "--overwrite"]) == 2
    assert "80 training examples left" in capsys.readouterr().err
    assert (out / RUN_FILE).read_bytes() == before
    monkeypatch.setattr(classification, "tuning_data", _tuning_data(512))
    with pytest.raises(_Stop):  # the recorded search resumes
        cli.main(command + ["--resume"])


def test_a_train_run_and_a_search_leave_each_others_state_alone(tmp_path, capsys, monkeypatch, stopped_after_claim):
    """A search without --resume (which starts its own tuner/ over) refuses a directory holding a train run's
    backup, and a train run one holding a search's tuner/: either would replace the record the other resumes by."""
    assert {"backup", "tuner", few_shot.PRETRAINED_FILE, few_shot.META_CHECKPOINTS} == set(TRAINING_STATE)
    monkeypatch.setattr(classification, "tuning_data", _tuning_data(512))
    trained, tuned = tmp_path / "trained", tmp_path / "tuned"
    with pytest.raises(_Stop):
        cli.main(["train", GAP, "--epochs", "2", "--limit", "256", "--out", str(trained)])
    _state(trained)
    with pytest.raises(_Stop):
        cli.main(["tune", GAP, "--limit", "512", "--epochs", "1", "--trials", "1", "--out", str(tuned)])
    _state(tuned, "tuner")
    capsys.readouterr()
    records = {out: (out / RUN_FILE).read_bytes() for out in (trained, tuned)}
    assert cli.main(["tune", GAP, "--limit", "512", "--epochs", "1", "--trials", "1", "--out", str(trained)]) == 2
    assert capsys.readouterr().err.startswith(f"otzoo tune: error: --out {trained} holds the training state (backup)")
    assert cli.main(["train", GAP, "--epochs", "2", "--limit", "256", "--out", str(tuned)]) == 2
    assert capsys.readouterr().err.startswith(f"otzoo train: error: --out {tuned} holds the training state (tuner)")
    assert {out: (out / RUN_FILE).read_bytes() for out in (trained, tuned)} == records


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_a_killed_run_resumes_under_its_own_options_only(tmp_path):
    """A real run stopped after its first epoch's backup: the run with another budget is refused and leaves the
    backup as it was; the run with the same options resumes it, trains the second epoch only and ends with no
    backup left."""
    import keras

    from explain.signals import read_training_log

    class StopAtEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:  # epoch 0 is done and backed up
                raise _Stop

    out = tmp_path / "run"
    options = dict(limit=256, batch_size=64, verbose=0)
    with pytest.raises(_Stop):
        classification.train(GAP, str(out), epochs=2, callbacks=[StopAtEpoch()], **options)
    backup = sorted(p.relative_to(out) for p in (out / "backup").rglob("*"))
    assert backup, "the first epoch left no backup"
    with pytest.raises(ResumeMismatchError, match="recipe.epochs: 2 there, 3 here"):
        classification.train(GAP, str(out), epochs=3, **options)
    assert sorted(p.relative_to(out) for p in (out / "backup").rglob("*")) == backup
    card = classification.train(GAP, str(out), epochs=2, **options)
    assert card["recipe"]["epochs"] == 2 and not (out / "backup").exists()
    assert read_training_log(str(out / "log.csv"))["epoch"].astype(int).tolist() == [0, 1]


def test_a_few_shot_run_names_its_own_pretrained_backbone_when_it_does_not_load(tmp_path, monkeypatch):
    """A resumed run's pre-trained backbone cut short (or overwritten) ended in h5py's traceback."""
    setup = mock.MagicMock()
    setup.model.get_layer.return_value.load_weights.side_effect = OSError("Unable to synchronously open file")
    monkeypatch.setattr(few_shot, "training_setup", lambda *args, **kwargs: setup)
    out = tmp_path / "run"
    out.mkdir()
    (out / few_shot.PRETRAINED_FILE).write_bytes(b"junk")
    with pytest.raises(PresetFormatError, match=r"^`out_dir` .*its pretrained_backbone.weights.h5 does not load "
                                                r"into the backbone: Unable to synchronously open file; delete it"):
        few_shot.train(FEW_SHOT, str(out), epochs=1, episodes=1)


class _Killed(Exception):
    """Raised in place of a process killed right after a meta-training backup."""


def _meta_run(checkpoint_dir, episodes=6, **options):
    """Meta-training of a small EMD few-shot model (fresh weights, seed 0: a new process) on class-banded images."""
    import keras

    import zoo

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 15)
    images = rng.uniform(0, 255, (len(labels), 28, 28, 1)).astype(np.float32)
    images[..., :7, :] += 40.0 * labels[:, None, None, None]
    keras.utils.set_random_seed(0)
    model = zoo.few_shot_model("small_convnet", "emd", ways=3, head_kwargs={"method": "sinkhorn"},
                               input_shape=(28, 28, 1), backbone_kwargs={"width": 8, "feature_dim": 8})
    return few_shot.meta_train(model, np.clip(images, 0, 255), labels, episodes, keras.optimizers.SGD(0.01, 0.9),
                               ways=3, shots=1, queries=3, seed=2, checkpoint_dir=str(checkpoint_dir),
                               jit_compile=False, verbose=0, **options)


def _assert_same_history(resumed, whole):
    assert resumed.keys() == whole.keys() and resumed["episode"] == whole["episode"]
    for key in whole:
        np.testing.assert_allclose(resumed[key], whole[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_resumed_meta_training_returns_the_whole_runs_history(tmp_path, monkeypatch):
    """A resumed few-shot run's card holds the meta-training history of an uninterrupted run: meta_train returned
    this process's episodes only, and a run killed after meta-training (before its card) an empty history."""
    whole = _meta_run(tmp_path / "whole", checkpoint_every=2, log_every=2)
    assert whole["episode"] == [2, 4, 6] and "emd_head_marginal_error" in whole
    # killed after meta-training, before the card: the run resumes with every episode done
    _assert_same_history(_meta_run(tmp_path / "whole", checkpoint_every=2, log_every=2), whole)

    backup = few_shot.save_weights_backup

    def backup_then_kill(model, directory, name, progress, *args, **kwargs):
        path = backup(model, directory, name, progress, *args, **kwargs)
        if progress["episodes"] == 3:
            raise _Killed
        return path

    monkeypatch.setattr(few_shot, "save_weights_backup", backup_then_kill)
    with pytest.raises(_Killed):  # killed after episode 3: within a log window (episodes 3 and 4)
        _meta_run(tmp_path / "cut", checkpoint_every=3, log_every=2)
    monkeypatch.setattr(few_shot, "save_weights_backup", backup)
    _assert_same_history(_meta_run(tmp_path / "cut", checkpoint_every=3, log_every=2), whole)
