"""One rule says when a run trains under ``MultiWorkerMirroredStrategy`` (``strategies.uses_multi_worker``):
``make_strategy`` builds that strategy exactly when ``otzoo train`` records the multi-worker loop as the run's
trainer (``run.json``), which it must know before any strategy is made. The CLI repeated the rule before."""
import json
from types import SimpleNamespace

import pytest

from otzoo import cli
from training.distributed import strategies
from training.recipes.run_directory import MODEL_FIT, MULTI_WORKER_LOOP

SENTINEL = object()  # what multi_worker_strategy returns here: no cluster is started


def _set_cluster(monkeypatch, workers):
    if workers is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        cluster = {"worker": [f"127.0.0.1:{1000 + index}" for index in range(workers)]}
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))


@pytest.mark.parametrize("cluster", [None, 1, 3], ids=["no_tf_config", "tf_config_1", "tf_config_3"])
@pytest.mark.parametrize("name", ["auto", "one_device", "mirrored", "multi_worker"])
def test_make_strategy_and_otzoo_train_agree_on_the_multi_worker_rule(monkeypatch, name, cluster):
    _set_cluster(monkeypatch, cluster)
    monkeypatch.setattr(strategies, "multi_worker_strategy", lambda: SENTINEL)
    expected = name == "multi_worker" or (name == "auto" and cluster == 3)
    assert strategies.uses_multi_worker(name) is expected
    assert (strategies.make_strategy(name) is SENTINEL) is expected
    trainer = cli._trainer(SimpleNamespace(strategy=name, workers=1), "classification")  # noqa: SLF001
    assert trainer == (MULTI_WORKER_LOOP if expected else MODEL_FIT)


@pytest.mark.parametrize("name", ["auto", "multi_worker"])
def test_local_workers_train_under_multi_worker_without_a_strategy_made(monkeypatch, name):
    """``otzoo train --workers N``: the launcher records the loop, reading nothing but its arguments (it makes no
    strategy; its workers run ``--strategy multi_worker``); few-shot presets pre-train with model.fit."""
    monkeypatch.delenv("TF_CONFIG", raising=False)

    def no_strategy(*args, **kwargs):
        raise AssertionError("a strategy was made")

    monkeypatch.setattr(strategies, "multi_worker_strategy", no_strategy)
    assert strategies.uses_multi_worker(name, workers=2)
    assert cli._trainer(SimpleNamespace(strategy=name, workers=2), "classification") == MULTI_WORKER_LOOP  # noqa
    assert cli._trainer(SimpleNamespace(strategy=name, workers=2), "few_shot") == MODEL_FIT  # noqa: SLF001
