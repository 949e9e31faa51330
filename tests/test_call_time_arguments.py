"""Bad input met after construction (a later call, labels beside the inputs, a weights-loading flag, a directory to
write): one ``ValueError`` naming the argument, before the backend fails in its own words or the input is read
wrongly without a word."""
import numpy as np
import pytest

import zoo
from ot_layers import layers, solvers
from ot_layers.layers.local_embeddings import PatchExtractor
from ot_layers.layers.task_layers import PrototypeLogits, SupportClassMeans


@pytest.mark.parametrize("layer, built_on, other", [
    (lambda: layers.MultiProxyWasserstein(3), (2, 5, 4), (2, 5, 6)),
    (lambda: layers.GeneralizedSumPooling(4), (2, 3, 3, 8), (2, 3, 3, 6)),
    (lambda: layers.HypersphericalPrototypes(3, 4), (2, 4), (2, 5)),
    (lambda: layers.ManifoldProxies(3, 4), (2, 4), (2, 5)),
    (lambda: layers.ClassProxies(3, dim=4, output="similarities"), (2, 4), (2, 5)),
], ids=["mpw", "gsp", "hyperspherical", "manifold", "class_proxies"])
def test_a_built_layer_called_with_another_feature_dim_says_so(layer, built_on, other):
    """The weights were made for the first call's feature dimension; another one failed inside an einsum."""
    built = layer()
    built(np.ones(built_on, np.float32))
    with pytest.raises(ValueError, match=f"expected axis -1 of input shape to have value {built_on[-1]}"):
        built(np.ones(other, np.float32))


def _zeros(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("layer, inputs, message", [
    (PrototypeLogits, _zeros(4, 3), "PrototypeLogits expects `inputs=[query, prototypes]` (a list of two tensors), "
                                    "got one tensor of shape (4, 3)."),
    (PrototypeLogits, [_zeros(4, 3), _zeros(2, 5)], "The feature dimension of `query` (3) does not match that of "
                                                    "`prototypes` (5)."),
    (PrototypeLogits, [_zeros(4, 1, 3), _zeros(2, 3)], "`query` must have rank 2, got shape (4, 1, 3) (rank 3)."),
    (lambda: SupportClassMeans(2), [_zeros(4, 5), _zeros(4, 5), _zeros(4)],
     "SupportClassMeans expects `inputs=[support, support_labels]` (a list of two tensors), got 3 inputs."),
    (lambda: SupportClassMeans(2), [_zeros(4, 5), np.zeros(3, np.int32)],
     "`support_labels` holds 3 labels for the 4 rows of `support`"),
    (lambda: PatchExtractor("grid", grid=3), _zeros(2, 8, 8, 1), "`grid` (3) must divide the image size 8x8."),
    (lambda: PatchExtractor("grid"), _zeros(8, 8, 1), "`images` must have rank 4, got shape (8, 8, 1) (rank 3)."),
], ids=["logits-one-tensor", "logits-dim", "logits-rank", "means-three", "means-labels", "patches-grid",
        "patches-rank"])
def test_a_first_call_with_bad_inputs_raises_one_line(layer, inputs, message):
    """Checked when Keras builds the layer: raised in ``call``, the message would come inside Keras' several-line
    report of the failed call."""
    with pytest.raises(ValueError) as raised:
        layer()(inputs)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_hyperspherical_labels_must_match_the_batch():
    layer = layers.HypersphericalPrototypes(3, 4)
    x = np.ones((2, 4), np.float32)
    layer(x)
    with pytest.raises(ValueError, match="`labels` holds 3 labels for the 2 rows of `inputs`"):
        layer(x, labels=np.zeros(3, np.int32), training=True)
    with pytest.raises(ValueError, match="`labels`.*argmax"):  # one-hot labels were flattened to 6 labels
        layer(x, labels=np.eye(3, dtype=np.int32)[:2], training=True)


def test_support_class_means_labels_must_match_the_support():
    with pytest.raises(ValueError, match="`support_labels` holds 3 labels for the 4 rows of `support`"):
        SupportClassMeans(2)([np.ones((4, 5), np.float32), np.zeros(3, np.int32)])
    # one episode's labels as a row: the hint says to flatten them, not to take an argmax as for one-hot labels
    with pytest.raises(ValueError, match=r"`support_labels` must hold .* got shape \(1, 4\); for a row of 4 labels "
                                         r"pass it flattened, of shape \(4,\)\."):
        SupportClassMeans(2)([np.ones((4, 5), np.float32), np.array([[0, 1, 0, 1]], np.int32)])
    # an episode's classes under their data set's numbers (5-9) matched no class: every logit the same
    with pytest.raises(ValueError, match=r"`support_labels` must number the episode's classes 0\.\.1, got 5; "
                                         r"renumber them"):
        SupportClassMeans(2)([np.ones((4, 5), np.float32), np.array([5, 6, 5, 6], np.int32)])
    # a fractional label was cast to int32 without a word: 1.5 joined class 1
    with pytest.raises(ValueError, match=r"`support_labels` must be integer class labels, got .*1\.5"):
        SupportClassMeans(2)([np.ones((3, 4), np.float32), np.array([0.0, 1.5, 1.0], np.float32)])
    whole = SupportClassMeans(2)([np.arange(12, dtype=np.float32).reshape(3, 4), np.array([0.0, 1.0, 1.0],
                                                                                          np.float32)])
    np.testing.assert_allclose(np.asarray(whole), [[0, 1, 2, 3], [6, 7, 8, 9]])  # whole numbers as floats: taken


def test_structured_fc_support_features_of_another_dim_are_named():
    layer = layers.StructuredFC(2, 3)
    layer.initialize_from_support(np.ones((2, 3, 8), np.float32), np.array([0, 1]))
    with pytest.raises(ValueError, match="`features` have d = 4 per node but the layer's nodes have d = 8"):
        layer.initialize_from_support(np.ones((2, 3, 4), np.float32), np.array([0, 1]))


def test_random_walk_points_without_coordinates_are_named():
    with pytest.raises(ValueError, match="`points` must have d >= 1"):
        solvers.random_walk_similarity(np.ones((3, 0), np.float32))


def test_zoo_load_pretrained_must_be_a_flag():
    """``pretrained="no"`` read as true: the packaged weights loaded."""
    with pytest.raises(ValueError, match="`pretrained` must be True or False"):
        zoo.load("resnet20_gap_fashion_mnist", pretrained="no")


def test_save_preset_names_a_model_that_is_not_one_and_a_directory_that_is_a_file(tmp_path):
    with pytest.raises(ValueError, match="`model` must be a Keras model, got NoneType"):
        zoo.save_preset(None, str(tmp_path / "preset"), card={"task": "generic"})
    a_file = tmp_path / "taken"
    a_file.write_text("")
    model = zoo.build("resnet20_gap_fashion_mnist")
    with pytest.raises(ValueError, match="`directory` .* is a file; give a directory"):
        zoo.save_preset(model, str(a_file))
    with pytest.raises(ValueError, match="`directory` .* is below the file"):
        zoo.save_preset(model, str(a_file / "preset"))


@pytest.mark.parametrize("call, argument", [(lambda: zoo.load(["resnet20_gap_fashion_mnist"]), "name"),
                                            (lambda: zoo.model_card(["resnet20_gap_fashion_mnist"]), "name"),
                                            (lambda: zoo.build({"name": "x"}), "name"),
                                            (lambda: zoo.preset_dir(["x"]), "name")])
def test_a_preset_name_that_is_no_string_is_named(call, argument):
    """A list reached the registry's dict: TypeError (unhashable type: 'list')."""
    with pytest.raises(ValueError, match=rf"^`{argument}` must be a preset name or a preset directory, got "):
        call()
