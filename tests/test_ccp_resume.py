"""CCPReinitialization interrupted after an epoch and resumed with keras.callbacks.BackupAndRestore ends like the
uninterrupted run: weights, proxies, theta*, scores, patience and round counters."""
import keras
import numpy as np
import pytest

from ot_layers import ClassProxies
from ot_layers.callbacks import CCPReinitialization
from ot_layers.losses import ProxyAnchorLoss
from training.evaluation.retrieval import retrieval_metrics
from tests.resume_checks import assert_same_weights, fit_interrupted_and_resumed, fit_uninterrupted

C, P, DIM, IN = 3, 2, 4, 6


def _data(n, seed):
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % C).astype(np.int32)
    return (rng.standard_normal((n, IN)) + 1.5 * np.eye(C, IN)[y]).astype(np.float32), y


X, Y = _data(48, 0)
XV, YV = _data(24, 1)


def _setup():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((IN,))
    embedding = keras.layers.Dense(DIM, name="embed")(inputs)
    model = keras.Model(inputs, ClassProxies(C, num_proxies=P, name="proxies")(embedding), name="model")
    model.compile(optimizer=keras.optimizers.Adam(3e-2), loss=ProxyAnchorLoss())
    embed = keras.Model(inputs, embedding)

    def score():
        return retrieval_metrics(embed.predict(XV, verbose=0), YV, nmi=False)["map_at_r"]

    ccp = CCPReinitialization(X, Y, score, patience=2, pool_size=4, proximal=0.05, min_delta=0.02, seed=3)
    return model, {"x": X, "y": Y, "batch_size": 16, "shuffle": False}, [ccp]


@pytest.fixture(scope="module")
def reference():
    model, (ccp,) = fit_uninterrupted(_setup, epochs=6)
    # re-initializations after epochs 2 and 5 (0-based), so the interruptions below fall with a patience count
    # pending (after epoch 1) and inside the second problem with the proximal penalty on (after epoch 3)
    assert ccp.reinitializations == 2
    return model, ccp


@pytest.mark.parametrize("interrupt_after", [1, 3])
def test_ccp_resume_equals_uninterrupted_run(reference, interrupt_after, tmp_path):
    model, ccp = reference
    resumed, (resumed_ccp,) = fit_interrupted_and_resumed(_setup, 6, interrupt_after, tmp_path / "backup")
    assert_same_weights(model, resumed)  # the model's weights and every variable of model.ccp_state
    assert resumed_ccp.reinitializations == ccp.reinitializations
    assert resumed_ccp.history == ccp.history[interrupt_after + 1:]
    for name in ("best_score", "problem_score", "wait", "proximal_active"):
        assert float(getattr(resumed.ccp_state, name).numpy()) == float(getattr(model.ccp_state, name).numpy())
    assert not resumed.losses  # the proximal penalty is uninstalled at the end of training
