"""Arguments that were taken silently or failed far from their cause: each is now one ``ValueError`` naming it.

A flag given as a string (``return_cost="no"`` read as true), a NaN or ``None`` similarity base, a negative or
fractional seed (NumPy's error, or for CCP a crash at its first re-initialization, mid-training), an empty meta-class
list, an empty side of a partial-transport problem (NaN weights) and an unknown EMD domain with the exact method.
"""
import keras
import numpy as np
import pytest

import zoo
from ot_layers import callbacks, layers, losses, solvers

IMAGES = np.zeros((4, 8, 8, 1), np.float32)


@pytest.mark.parametrize("build, name", [
    (lambda: layers.SinkhornMatch(return_cost="no"), "return_cost"),
    (lambda: layers.EMDHead(center="yes"), "center"),
    (lambda: layers.GeneralizedSumPooling(return_attributes=1), "return_attributes"),
    (lambda: losses.ContrastiveLoss(normalize="false"), "normalize"),
    (lambda: losses.MultiSimilarityLoss(base=float("nan")), "base"),
    (lambda: losses.MultiSimilarityLoss(base=None), "base"),
    (lambda: callbacks.CCPReinitialization(IMAGES, np.zeros(4, int), lambda model: 0.0, seed=-1), "seed"),
    (lambda: callbacks.CCPReinitialization(IMAGES, np.zeros(4, int), lambda model: 0.0,
                                           restore_best_weights="no"), "restore_best_weights"),
    (lambda: callbacks.HardProxyUpdate(None, IMAGES[:0], np.zeros(0, int)), "meta_labels"),
    (lambda: callbacks.HardProxyUpdate(None, IMAGES, np.array([0, 0, 1, 1]), seed=2.5), "seed"),
    (lambda: callbacks.HardProxyUpdate(None, IMAGES, np.array([0, 0.5, 1, 1])), "meta_labels"),
    (lambda: callbacks.HardProxyUpdate(None, IMAGES, np.eye(4)), "meta_labels"),
    (lambda: callbacks.CCPReinitialization(IMAGES, np.array([0, 1.5, 1, 0]), lambda model: 0.0), "train_labels"),
    (lambda: solvers.simplex_etf(3, 2, seed=-1), "seed"),
    (lambda: zoo.meta_class_partitions(10, 2, seed=2.5), "seed"),
    (lambda: solvers.partial_transport(np.zeros((3, 0)), transport_ratio=0.5), "cost"),
    (lambda: solvers.partial_transport(np.zeros((0, 4)), transport_ratio=1.0), "cost"),
    (lambda: solvers.emd(np.zeros((2, 2)), method="exact", domain="logg"), "domain"),
    # Keras' "Could not interpret initializer identifier" named no argument; None fell back to Keras' own default
    (lambda: layers.GeneralizedSumPooling(initializer=None), "initializer"),
    (lambda: layers.MultiProxyWasserstein(3, initializer="nope"), "initializer"),
    (lambda: layers.ClassProxies(3, initializer=None), "initializer"),
    (lambda: layers.StructuredFC(2, 3, initializer="nope"), "initializer"),
    (lambda: layers.HypersphericalPrototypes(3, 1), "dim"),  # two unit vectors in 1-d: classes shared prototypes
    # a TypeError from a comparison, EMDHead's "multiple values for keyword argument", NumPy's conversion error
    (lambda: layers.PatchExtractor(mode="sampling", crop_fraction=("a", 0.5)), "crop_fraction"),
    (lambda: layers.StructuredFC(3, 4, head={"dtype": "float64"}), "head"),
    (lambda: layers.StructuredFC(3, 4, head={"name": "x"}), "head"),
    (lambda: layers.HypersphericalPrototypes(3, 4, prototypes="abc"), "prototypes"),
])
def test_a_bad_argument_is_one_value_error_naming_it(build, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        build()


def test_flags_take_numpy_booleans():
    """A NumPy boolean (from a config read with NumPy, say) is a flag like Python's."""
    assert layers.SinkhornMatch(return_cost=np.bool_(True)).return_cost is True
    assert layers.EMDHead(center=np.bool_(False)).center is False


def test_random_walk_similarity_of_an_empty_point_set_names_points():
    with pytest.raises(ValueError, match="`points` must hold n >= 1 points"):
        solvers.random_walk_similarity(np.zeros((0, 8), np.float32))


@pytest.mark.parametrize("call, name", [
    (lambda: layers.ClassProxies(3)(np.zeros((2, 4, 4, 8), np.float32)), "inputs"),
    # an unknown width was accepted at build, then failed inside call with int(None)
    (lambda: layers.ClassProxies(3, dim=5, output="packed")(keras.Input((None,))), "inputs"),
    (lambda: layers.PatchExtractor()(np.zeros((28, 28, 1), np.float32)), "images"),
    (lambda: layers.PatchExtractor(crop_fraction=0.5), "crop_fraction"),
    (lambda: layers.StructuredFC(3, 4, head="sinkhorn"), "head"),
])
def test_a_layer_given_the_wrong_rank_or_argument_type_names_it(call, name):
    """An einsum error, an IndexError, a len() TypeError and a dict-update TypeError before."""
    with pytest.raises(ValueError, match=f"`{name}`"):
        call()


LOSSES_ON_LABELS = [  # a loss, and a y_pred of the shape it takes for the 6 labels below
    (losses.ContrastiveLoss, (6, 4)),
    (losses.TripletLoss, (6, 4)),
    (losses.MultiSimilarityLoss, (6, 4)),
    (losses.ProxyNCAPlusPlusLoss, (6, 3, 2)),
    (losses.ProxyAnchorLoss, (6, 3, 2)),
    (losses.ZeroShotPredictionLoss, (6, 4, 5)),
    (losses.ManifoldProxyLoss, (6, 3)),
    (losses.HypersphericalPullLoss, (6, 3)),
]
LABELS = np.array([0, 0, 1, 1, 2, 2])


@pytest.mark.parametrize("loss_class, shape", LOSSES_ON_LABELS)
@pytest.mark.parametrize("labels, expected", [
    (np.eye(3)[LABELS], r"integer class labels of shape \(B,\) or \(B, 1\), got shape \(6, 3\); for one-hot"),
    (LABELS[:4], "holds 4 labels for the 6 rows of `y_pred`"),
    (LABELS.reshape(2, 3, 1), r"got shape \(2, 3, 1\)\.$"),
])
def test_labels_of_the_wrong_shape_are_named(loss_class, shape, labels, expected):
    """One-hot labels, or a label count other than the batch's, failed in a broadcast deep inside the loss."""
    y_pred = np.random.default_rng(0).random(shape).astype(np.float32)
    with pytest.raises(ValueError, match=f"^`y_true` of {loss_class.__name__} .*{expected}"):
        loss_class()(labels, y_pred)
    assert np.isfinite(float(np.sum(loss_class()(LABELS[:, None], y_pred))))  # (B, 1) labels are taken


@pytest.mark.parametrize("loss_class, shape", LOSSES_ON_LABELS)
def test_an_empty_batch_traced_with_an_unknown_size_has_loss_zero(loss_class, shape):
    """A replica's share of a last, short batch may be empty; traced with an unknown batch size (as under a
    distribution strategy) the batch losses gave NaN (a mean over no values) or, for the zero-shot loss, an index
    out of bounds; eagerly the per-example losses (manifold, hyperspherical) gave an empty tensor, which Keras left
    unreduced. (The other backends take the same early return; the backend matrix checks them.)"""
    import tensorflow as tf

    loss = loss_class()
    traced = tf.function(loss.__call__, input_signature=[tf.TensorSpec([None], tf.int32),
                                                         tf.TensorSpec([None, *shape[1:]], tf.float32)])
    assert float(traced(np.zeros(0, np.int32), np.zeros((0, *shape[1:]), np.float32))) == 0.0
    eager = loss(np.zeros(0, np.int32), np.zeros((0, *shape[1:]), np.float32))
    assert tuple(eager.shape) == () and float(eager) == 0.0
    with pytest.raises(ValueError, match=f"^`y_true` of {loss_class.__name__} "):  # labels still checked
        loss(LABELS[:3], np.zeros((0, *shape[1:]), np.float32))
    y_pred = np.random.default_rng(1).random(shape).astype(np.float32)
    assert float(traced(LABELS.astype(np.int32), y_pred)) == pytest.approx(float(loss(LABELS, y_pred)), rel=1e-6)


@pytest.mark.parametrize("build, name", [
    (lambda: zoo.backbone("small_convnet", width=2.5), "width"),
    (lambda: zoo.backbone("small_convnet", feature_dim=0), "feature_dim"),
    (lambda: zoo.backbone("small_convnet", bn_momentum=5), "bn_momentum"),
    (lambda: zoo.backbone("resnet20", bn_momentum=-0.1), "bn_momentum"),
    (lambda: zoo.build("resnet20_protonet_fewshot_fashion_mnist", num_classes=-5), "num_classes"),
    (lambda: zoo.build("resnet20_gap_fashion_mnist", ways=3), "ways"),
    (lambda: zoo.build("resnet20_gsp_retrieval_fashion_mnist", head="mpw"), "head"),
    (lambda: zoo.backbone("resnet20", depth=32), "depth"),  # Python's TypeError: multiple values for `depth`
    (lambda: zoo.backbone("small_convnet", widht=16), "widht"),
    (lambda: zoo.backbone("resnet20", widths=8), "widths"),  # TypeError: object of type 'int' has no len()
    (lambda: zoo.backbone("resnet12", pool=5), "pool"),
])
def test_a_builder_argument_out_of_range_or_unused_is_named(build, name):
    """Taken before: a fractional width failed in Keras' Conv2D, a momentum above 1 built a network whose moving
    statistics diverge, and an architecture key the preset's task does not use (a few-shot model's num_classes)
    was ignored."""
    with pytest.raises(ValueError, match=f"^`{name}`"):
        build()


@pytest.mark.parametrize("card, message", [
    ("x", "must be a dict of the model card's fields"),
    ({"task": "classification", "note": object()}, "must hold JSON values"),
])
def test_save_preset_refuses_a_card_it_cannot_write_before_writing(card, message, tmp_path):
    """A string card failed in ``dict()``; a card with a value JSON cannot hold failed after the config and the
    weights were written, leaving a preset directory without a readable card."""
    model = zoo.build("resnet20_gap_fashion_mnist", backbone="small_convnet")
    with pytest.raises(ValueError, match=f"^`card` {message}"):
        zoo.save_preset(model, str(tmp_path / "preset"), card=card)
    assert not (tmp_path / "preset").exists()


def test_labels_of_unknown_rank_are_taken_while_tracing():
    """A label tensor whose rank TensorFlow does not know (from ``tf.numpy_function``, say) has nothing to check
    statically; the check must not fail on its shape."""
    import tensorflow as tf

    loss = losses.ContrastiveLoss()
    traced = tf.function(loss.__call__, input_signature=[tf.TensorSpec(None, tf.int32),
                                                         tf.TensorSpec([None, 4], tf.float32)])
    y_pred = np.random.default_rng(2).random((6, 4)).astype(np.float32)
    assert float(traced(LABELS.astype(np.int32), y_pred)) == pytest.approx(float(loss(LABELS, y_pred)), rel=1e-6)


def _small_model():
    import keras
    inputs = keras.Input((4, 3))
    pooled = layers.GeneralizedSumPooling(num_prototypes=2, name="gsp")(inputs)
    return keras.Model(inputs, keras.layers.Dense(2, name="logits")(pooled))


@pytest.mark.parametrize("layer_class, layer_name, message", [
    (layers.MultiProxyWasserstein, None, r"found none \(the model has none\)"),
    (layers.GeneralizedSumPooling, "pooling", r"found none \(its GeneralizedSumPooling layers: 'gsp'\)"),
    (layers.GeneralizedSumPooling, "logits", r"the layer named 'logits' is a Dense"),
])
def test_find_layer_says_which_layers_the_model_has(layer_class, layer_name, message):
    """A layer that is not found names the model's layers of that class, or the class the named layer has."""
    from ot_layers.tensor_ops import find_layer
    with pytest.raises(ValueError, match=message):
        find_layer(_small_model(), layer_class, layer_name)
