"""``training.fit``'s own loop (the one it runs under MultiWorkerMirroredStrategy), strategies by name and the local
worker launcher. The loop runs here under a 2-replica MirroredStrategy, where ``model.fit`` works, and
must give ``model.fit``'s logs, weights and callback behaviour."""
import csv
import json
import os
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import distributed_models as dm
from training.distributed import strategies
from training.distributed.fit import distributed_fit, fit
from training.distributed.launch import cluster_tf_configs, free_ports, launch_workers


def test_loop_equals_model_fit_with_the_standard_callbacks(tmp_path, capsys):
    images, labels = dm.synthetic_data(64)
    data, validation = dm.dataset(images, labels, 16), dm.dataset(images[:32], labels[:32], 16)
    strategy = strategies.make_strategy("mirrored")

    def run(loop):
        with strategy.scope():
            model = dm.mpw_classifier(learning_rate=0.2)
        stopper = keras.callbacks.EarlyStopping("val_loss", patience=0, min_delta=10.0)  # stops after epoch 2
        board = keras.callbacks.TensorBoard(str(tmp_path / f"tb-{loop}"))
        log = keras.callbacks.CSVLogger(str(tmp_path / f"log-{loop}.csv"))
        if loop:
            history = distributed_fit(model, strategy, data, 5, [stopper, board, log], validation_data=validation,
                                      verbose=1)
        else:
            history = model.fit(data, epochs=5, callbacks=[stopper, board, log], validation_data=validation,
                                verbose=0)
        return model, history.history

    loop_model, loop_history = run(True)
    assert "4/4" in capsys.readouterr().out  # Keras' progress bar, driven by the loop
    fit_model, fit_history = run(False)
    assert sorted(loop_history) == sorted(fit_history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert len(loop_history["loss"]) == len(fit_history["loss"]) == 2  # EarlyStopping stopped both
    for key in fit_history:
        np.testing.assert_allclose(loop_history[key], fit_history[key], rtol=1e-5, err_msg=key)
    expected = dm.weights_by_path(fit_model)
    for key, value in dm.weights_by_path(loop_model).items():
        np.testing.assert_allclose(value, expected[key], rtol=0, atol=1e-6, err_msg=key)
    rows = list(csv.DictReader(open(tmp_path / "log-True.csv")))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    np.testing.assert_allclose([float(r["loss"]) for r in rows], fit_history["loss"], rtol=1e-5)
    events = [f for _, _, files in os.walk(tmp_path / "tb-True") for f in files if "tfevents" in f]
    assert events  # TensorBoard wrote its scalars


def test_fit_rejects_bad_input():
    images, labels = dm.synthetic_data(32)
    data = dm.dataset(images, labels, 16)
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="`model` must be compiled"):
        fit(uncompiled, data)
    with pytest.raises(ValueError, match="`strategy` is 'mirrored' but the model was built under 'default'"):
        fit(dm.mpw_classifier(), data, strategy="mirrored")
    with pytest.raises(ValueError, match="`strategy` must be one of"):
        fit(dm.mpw_classifier(), data, strategy="parameter_server")
    with pytest.raises(ValueError, match="`data` as a function of the epoch"):
        fit(dm.mpw_classifier(), lambda epoch: data)
    with pytest.raises(ValueError, match="`epochs` must be an integer >= 1"):
        fit(dm.mpw_classifier(), data, epochs=0)
    with pytest.raises(ValueError, match="`save_freq` must be an integer >= 1"):
        fit(dm.mpw_classifier(), data, save_freq=0)


def test_fit_names_arguments_that_failed_late_or_inside_keras(tmp_path):
    """Each failed inside Keras or the loop (an UnboundLocalError for validation_steps=0, int("loud"), a callback
    that is not in a list, an unbatched pair), or, for a checkpoint directory that is a file, only after the first
    epoch had trained."""
    images, labels = dm.synthetic_data(32)
    data = dm.dataset(images, labels, 16)
    (tmp_path / "afile").write_text("")
    for kwargs, match in [
        ({"validation_steps": 0}, "^`validation_steps` must be an integer >= 1"),
        ({"verbose": "loud"}, "^`verbose` must be 0, 1, 2 or 'auto'"),
        ({"callbacks": keras.callbacks.EarlyStopping()}, "^`callbacks` must be a list of keras.callbacks.Callback"),
        ({"callbacks": ["es"]}, "^`callbacks` must be a list"),
        ({"checkpoint_dir": str(tmp_path / "afile")}, "^`checkpoint_dir` .* is a file"),
        ({"checkpoint_dir": ""}, "^`checkpoint_dir` is empty"),
        ({"data": tf.data.Dataset.from_tensor_slices(images).batch(8)}, r"^`data` must yield \(x, y\)"),
    ]:
        kwargs = {"data": data, **kwargs}
        with pytest.raises(ValueError, match=match):
            fit(dm.mpw_classifier(), **kwargs)
    strategy = strategies.make_strategy("mirrored")
    with strategy.scope():
        model = dm.mpw_classifier()
    with pytest.raises(ValueError, match=r"^`steps_per_epoch` \(3\) is more than the 2 batch\(es\)"):
        distributed_fit(model, strategy, data, 1, steps_per_epoch=3)


def test_make_strategy_by_name(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    gpus = tf.config.list_logical_devices("GPU")
    auto = strategies.make_strategy("auto")
    if len(gpus) > 1:  # several GPUs: mirrored over them all
        assert isinstance(auto, tf.distribute.MirroredStrategy) and auto.num_replicas_in_sync == len(gpus)
    else:  # one GPU or none: the default strategy
        assert auto is tf.distribute.get_strategy()
    mirrored = strategies.make_strategy("mirrored")
    assert mirrored.num_replicas_in_sync == (len(gpus) or 2)  # the GPUs, else the two logical CPUs of conftest.py
    assert strategies.strategy_name(mirrored) == "mirrored"
    assert strategies.make_strategy("one_device").num_replicas_in_sync == 1
    assert strategies.make_strategy(mirrored) is mirrored
    with pytest.raises(ValueError, match="`strategy`: 'multi_worker' needs the TF_CONFIG"):
        strategies.make_strategy("multi_worker")
    with pytest.raises(ValueError, match="`devices` must be a non-empty list"):
        strategies.make_strategy("mirrored", devices="/cpu:0")
    assert strategies.make_strategy("mirrored", devices=["/cpu:0", "/CPU:1"]).num_replicas_in_sync == 2
    # a device this process lacks: TensorFlow would train on the CPU without a word
    for name, devices, match in [("one_device", ["/gpu:99"], r"'/gpu:99' is no device of this process \(it has /cpu"),
                                 ("mirrored", ["/cpu:0", "/cpu:9"], "'/cpu:9' is no device"),
                                 ("mirrored", [1, 2], "must be a non-empty list of device names"),
                                 ("auto", ["/cpu:0"], "applies to 'one_device' and 'mirrored', not 'auto'"),
                                 (mirrored, ["/cpu:0"], "applies to a strategy made by name")]:
        with pytest.raises(ValueError, match="^`devices`.*" + match):
            strategies.make_strategy(name, devices=devices)


def test_tf_config_parsing(monkeypatch):
    configs = cluster_tf_configs(3, ports=[1001, 1002, 1003])
    assert configs[2] == {"cluster": {"worker": ["127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"]},
                          "task": {"type": "worker", "index": 2}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(configs[2]))
    assert strategies.cluster_size() == 3 and not strategies.is_chief()
    monkeypatch.setenv("TF_CONFIG", json.dumps(configs[0]))
    assert strategies.is_chief()
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="`TF_CONFIG` is not valid JSON"):
        strategies.tf_config()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker",
                                                                                       "index": 4}}))
    with pytest.raises(ValueError, match="`TF_CONFIG`: task"):
        strategies.tf_config()


def test_launcher_gives_each_worker_its_task_and_stops_the_rest_when_one_fails(tmp_path):
    ports = free_ports(4)
    assert len(set(ports)) == 4
    ready = tmp_path / "worker_0_printed"  # worker 1 fails only once worker 0 has printed, however slow its start
    script = ("import json, os, sys, time; task = json.loads(os.environ['TF_CONFIG'])['task']; "
              "print('task', task['index'], os.environ['CUDA_VISIBLE_DEVICES'] == ''); sys.stdout.flush(); "
              f"ready = {str(ready)!r}; "
              "open(ready, 'w').close() if task['index'] == 0 else None; "
              "[time.sleep(0.05) for _ in range(1200) if not os.path.exists(ready)] if task['index'] == 1 else None; "
              "sys.exit(3) if task['index'] == 1 else time.sleep(120)")
    results = launch_workers([sys.executable, "-c", script], 2, str(tmp_path), grace=0.5, timeout=60)
    assert results[1].returncode == 3 and not results[1].stopped
    assert results[0].stopped and results[0].returncode == -9  # would have waited for its peer forever
    assert results[0].output().strip() == "task 0 True"
    ok = launch_workers([sys.executable, "-c", "print('done')"], 2, str(tmp_path / "ok"))
    assert [r.returncode for r in ok] == [0, 0]


def test_launch_arguments_are_named_before_any_worker_starts(tmp_path):
    """timeout=-1 killed every worker at once and returned exit -9; a negative grace and a non-dict env, a file as
    log_dir, final_codes=2 and ports that are no ports were taken or failed with Python's errors."""
    from training.distributed.launch import run_cluster
    command = [sys.executable, "-c", "print('never')"]
    (tmp_path / "afile").write_text("")
    for call, match in [
        (lambda: launch_workers(command, 1, str(tmp_path / "a"), timeout=-1), "^`timeout` must be a finite number > 0"),
        (lambda: launch_workers(command, 1, str(tmp_path / "a"), grace=-5), "^`grace` must be a finite number >= 0"),
        (lambda: launch_workers(command, 1, str(tmp_path / "a"), env=["A=1"]), "^`env` must be a dict"),
        (lambda: launch_workers(command, 1, str(tmp_path / "afile")), "^`log_dir` .* is a file"),
        (lambda: launch_workers(5, 1, str(tmp_path / "a")), "^`command` must be a non-empty argv list"),
        (lambda: run_cluster(command, 1, str(tmp_path / "a"), final_codes=2), "^`final_codes` must be a collection"),
        (lambda: cluster_tf_configs(1, ports=["abc"]), r"^`ports` must be TCP ports"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_run_cluster_relaunches_all_workers_after_a_failure(tmp_path):
    from training.distributed.launch import run_cluster

    marker = tmp_path / "failed-once"
    script = ("import json, os, sys; i = json.loads(os.environ['TF_CONFIG'])['task']['index']; "
              f"m = {str(marker)!r}; first = not os.path.exists(m); "
              "open(m, 'a').close() if i == 1 else None; sys.exit(5 if first and i == 1 else 0)")
    attempts = run_cluster([sys.executable, "-c", script], 2, str(tmp_path / "logs"), max_restarts=2, grace=5.0)
    assert [[r.returncode for r in a] for a in attempts] == [[0, 5], [0, 0]]


def test_run_cluster_does_not_repeat_an_attempt_refused_for_its_input(tmp_path):
    """Workers that exit with a final status (otzoo's 2: the input was refused) are not relaunched: a restart
    cannot change the input. Another failure still is."""
    from training.distributed.launch import run_cluster

    refuse = [sys.executable, "-c", "import sys; sys.exit(2)"]
    attempts = run_cluster(refuse, 2, str(tmp_path / "refused"), max_restarts=2, final_codes=(2,), grace=5.0)
    assert [[r.returncode for r in a] for a in attempts] == [[2, 2]]
    crash = [sys.executable, "-c", "import sys; sys.exit(1)"]
    attempts = run_cluster(crash, 1, str(tmp_path / "crashed"), max_restarts=1, final_codes=(2,))
    assert [[r.returncode for r in a] for a in attempts] == [[1], [1]]


@pytest.mark.parametrize("args, message", [
    (["--", "/nonexistent/prog"], "argument command: no program '/nonexistent/prog'"),
    (["--log-dir", "{file}", "--", "true"], "argument --log-dir: cannot make the directory"),
    (["--log-dir", "{file}/below", "--", "true"], "argument --log-dir: cannot make the directory"),
    (["--timeout", "-5", "--", "true"], "argument --timeout: must be a number of seconds > 0"),
    (["--workers", "0", "--", "true"], "argument --workers: must be an integer >= 1"),
])
def test_launcher_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    from training.distributed import launch

    afile = tmp_path / "afile"
    afile.write_text("")
    args = [a.replace("{file}", str(afile)) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--log-dir", str(tmp_path / "logs")] + args if "--log-dir" not in args else args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and message in err[-1] and "Traceback" not in "".join(err)


@pytest.mark.parametrize("kind", ["repeated", "finite", "unknown_length"])
def test_loop_reads_a_dataset_across_epochs_as_model_fit_does(kind):
    """With ``steps_per_epoch`` an epoch continues where the previous one stopped, and a finite dataset starts again
    once exhausted (an epoch that reaches its end ends there), as ``model.fit`` reads it: the same batches, logs and
    weights (the loop made a new iterator every epoch, so it trained on the first 3 of the 4 batches only). A dataset
    of unknown length is compared with ``model.fit`` on the same batches of known length: ``model.fit`` on the
    unknown length also counts the empty batch it reads last, in its logs and at times in its optimizer's
    iterations."""
    images, labels = dm.synthetic_data(64)
    reference_data = data = dm.dataset(images, labels, 16)  # 4 batches
    if kind == "repeated":
        reference_data = data = data.repeat()
    elif kind == "unknown_length":
        data = data.filter(lambda x, y: True)
        assert int(data.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    strategy = strategies.make_strategy("mirrored")
    seen = {}

    class Batches(keras.callbacks.Callback):  # the batch indices each epoch ran
        def on_epoch_begin(self, epoch, logs=None):
            seen.setdefault(self.loop, []).append([])

        def on_train_batch_end(self, batch, logs=None):
            seen[self.loop][-1].append(batch)

    def run(loop):
        with strategy.scope():
            model = dm.mpw_classifier()
        batches = Batches()
        batches.loop = loop
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # both warn that a finite dataset ran out in the middle of an epoch
            if loop:
                history = distributed_fit(model, strategy, data, 4, [batches], steps_per_epoch=3, verbose=0)
            else:
                history = model.fit(reference_data, epochs=4, steps_per_epoch=3, callbacks=[batches], verbose=0)
        return model, history.history

    loop_model, loop_history = run(True)
    fit_model, fit_history = run(False)
    if kind == "repeated":
        assert seen[True] == [[0, 1, 2]] * 4
    else:  # 4 batches read 3 at a time: the second epoch ends after the fourth batch, the third starts again
        assert seen[True] == [[0, 1, 2], [0], [0, 1, 2], [0]]
    assert seen[True] == seen[False]
    assert sorted(loop_history) == sorted(fit_history) == ["accuracy", "loss"]
    for key in fit_history:
        np.testing.assert_allclose(loop_history[key], fit_history[key], rtol=1e-5, err_msg=key)
    expected = dm.weights_by_path(fit_model)
    for key, value in dm.weights_by_path(loop_model).items():
        np.testing.assert_allclose(value, expected[key], rtol=0, atol=1e-6, err_msg=key)
