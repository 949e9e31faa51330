"""Export of small untrained zoo models of every task: named signatures, parity in a process without otzoo, ONNX
names and dynamic axes, warm-up requests and models.config as TF Serving reads them."""
import os

import numpy as np
import onnx
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

import export
import keras
import zoo
from export.warmup import WARMUP_DIR, WARMUP_FILE, read_warmup_requests
from ot_layers.task_model import TaskModel

TINY = dict(input_shape=(16, 16, 1), backbone_kwargs={"width": 8, "feature_dim": 8})
RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, size=(6, 16, 16, 1), dtype=np.uint8)


def _classifier():
    return zoo.image_classifier("small_convnet", "mpw", 7, head_kwargs={"num_proxies": 2}, **TINY)


def _embedding():
    return zoo.embedding_model("small_convnet", "gsp", 8, pooling_kwargs={"num_prototypes": 4}, **TINY)


def _few_shot():
    return zoo.few_shot_model("small_convnet", "emd", 3, head_kwargs={"method": "sinkhorn"}, **TINY)


def _two_outputs():
    inputs = keras.Input((5,), name="features")
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)
    return keras.Model(inputs, [keras.layers.Dense(3)(hidden), keras.layers.Dense(2)(hidden)])


CASES = {
    "classification": (_classifier, PIXELS),
    "retrieval": (_embedding, PIXELS),
    "few_shot": (_few_shot, {"query_images": PIXELS, "support_images": PIXELS[:5],
                             "support_labels": np.array([0, 1, 2, 0, 1], np.int32)}),
}
OUTPUTS = {"classification": ["logits", "probabilities", "top_k_classes", "top_k_scores"],
           "retrieval": ["embeddings"], "few_shot": ["logits"]}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported(request, tmp_path_factory):
    """One export (SavedModel + ONNX) and one verification per task, shared by the tests below."""
    task = request.param
    build, inputs = CASES[task]
    keras.utils.set_random_seed(1)
    model = build()
    base = str(tmp_path_factory.mktemp(task) / "served")
    version_dir = export.to_saved_model(model, base)
    onnx_path = export.to_onnx(model, os.path.join(str(tmp_path_factory.mktemp(task)), "model.onnx"))
    report = export.verify(model, inputs, saved_model_dir=version_dir, onnx_path=onnx_path, batch_sizes=(1, 4))
    return dict(task=task, model=model, inputs=inputs, base=base, version_dir=version_dir, onnx=onnx_path,
                report=report)


def test_task_is_the_one_the_zoo_model_states(exported):
    assert exported["model"].task == exported["task"]  # an ot_layers.TaskModel
    assert export.infer_task(exported["model"]) == exported["task"]


def test_other_models_are_generic_and_task_must_fit():
    """A model that states no task exports as ``generic`` (inputs by their Keras names, ``output_i``); an
    explicit task the model's structure cannot serve is refused naming ``task``."""
    model = _two_outputs()
    spec = export.serving_spec(model)
    assert spec.task == "generic" and spec.input_names == ("features",)
    assert spec.output_names == ("output_0", "output_1") and spec.signature_names == ("serving_default",)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert export.infer_task(plain) == "generic"  # (B, 3): logits or embeddings? Not guessed from the shape.
    assert export.serving_spec(plain, task="retrieval").output_names == ("embeddings",)
    assert export.serving_spec(plain, task="classification").top_k == 3  # min(5, classes)
    for task in ("classification", "retrieval", "few_shot"):
        with pytest.raises(ValueError, match="`task`"):
            export.serving_spec(model, task=task)
    with pytest.raises(ValueError, match="`task`"):
        export.serving_spec(plain, task="detection")


def test_clone_and_reload_keep_the_task(tmp_path):
    """``keras.models.clone_model`` calls a functional subclass with (inputs, outputs, name) only; the clone of a
    retrieval model must still export retrieval signatures, as must the model read back from JSON or ``.keras``."""
    from ot_layers import TaskModel
    keras.utils.set_random_seed(2)
    model = _embedding()
    clone = keras.models.clone_model(model)
    assert isinstance(clone, TaskModel) and clone.task == "retrieval"
    assert export.serving_spec(clone).output_names == ("embeddings",)
    assert keras.models.model_from_json(clone.to_json()).task == "retrieval"
    clone.save(str(tmp_path / "clone.keras"))
    assert keras.saving.load_model(str(tmp_path / "clone.keras")).task == "retrieval"
    import pickle  # Keras pickles a model with its class: each task's class must be found by its qualified name
    assert pickle.loads(pickle.dumps(clone)).task == "retrieval"
    assert keras.models.clone_model(_two_outputs()).__class__ is not TaskModel  # a plain model stays plain
    with pytest.raises(ValueError, match="`task`"):
        type(clone)(clone.inputs, clone.outputs, task="few_shot")  # a task subclass keeps its own task


def test_every_artifact_matches_keras_at_batch_1_and_4(exported):
    """The SavedModel (both signatures, raw uint8 bytes into ``serving_uint8``) and ONNX, run in a process that
    cannot import otzoo, give Keras' outputs within 1e-5 at both batch sizes."""
    report = exported["report"]
    assert set(report) == {"saved_model", "saved_model_uint8", "onnx"}
    for artifact, by_batch in report.per_batch_size.items():
        assert set(by_batch) == {1, 4}
        for diffs in by_batch.values():
            assert sorted(diffs) == sorted(OUTPUTS[exported["task"]])
    assert max(report.values()) <= 1e-5, report.table()
    assert report.checked["saved_model"]["nodes"] > 0


def test_signatures_have_the_task_names_and_dtypes(exported):
    """As the TensorFlow-only child process loaded them."""
    signatures = exported["report"].signatures["saved_model"]
    task = exported["task"]
    default = signatures["serving_default"]
    assert sorted(default["outputs"]) == sorted(OUTPUTS[task])
    assert set(signatures) == {"serving_default", "serving_uint8"}
    pixels = ["images"] if task != "few_shot" else ["query_images", "support_images"]
    for name in pixels:
        assert default["inputs"][name] == ["float32", [None, 16, 16, 1]]
        assert signatures["serving_uint8"]["inputs"][name] == ["uint8", [None, 16, 16, 1]]
    if task == "few_shot":
        assert default["inputs"]["support_labels"] == ["int32", [None]]
        assert default["outputs"]["logits"] == ["float32", [None, 3]]
    if task == "classification":
        assert default["outputs"]["top_k_classes"] == ["int32", [None, 5]]  # k = min(5, 7 classes)
        assert default["outputs"]["probabilities"] == ["float32", [None, 7]]
        _check_classification_post_processing(exported["version_dir"])


def test_onnx_has_the_same_names_and_a_dynamic_batch_axis(exported):
    graph = onnx.load(exported["onnx"]).graph
    spec = export.serving_spec(exported["model"])
    assert [i.name for i in graph.input] == list(spec.input_names)
    assert sorted(o.name for o in graph.output) == sorted(OUTPUTS[exported["task"]])
    for value in list(graph.input) + list(graph.output):
        first = value.type.tensor_type.shape.dim[0]
        assert first.dim_param in ("batch", "support") and not first.HasField("dim_value")
    batched = {i.name: i.type.tensor_type.shape.dim[0].dim_param for i in graph.input}
    assert batched[spec.input_names[0]] == "batch"


def _check_classification_post_processing(version_dir):
    """``probabilities`` and ``top_k`` from the served graph equal a NumPy softmax and sort of its logits."""
    served = tf.saved_model.load(version_dir).signatures["serving_uint8"]
    out = {k: v.numpy() for k, v in served(images=tf.constant(PIXELS)).items()}
    logits = out["logits"].astype(np.float64)
    softmax = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(out["probabilities"], softmax / softmax.sum(1, keepdims=True), atol=1e-6)
    order = np.argsort(-logits, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(out["top_k_classes"], order)
    np.testing.assert_allclose(out["top_k_scores"], np.take_along_axis(out["logits"], order, 1), atol=0)


def test_warmup_requests_parse_and_run_against_the_signatures(exported):
    """The warm-up file parses with ``prediction_log_pb2``; each request, run on the signature it names, gives
    the Keras model's outputs for the same inputs."""
    path = os.path.join(exported["version_dir"], WARMUP_DIR, WARMUP_FILE)
    requests = read_warmup_requests(path)
    task, model = exported["task"], exported["model"]
    signatures = ["serving_default", "serving_uint8"]
    assert sorted({r[1] for r in requests}) == signatures
    assert len(requests) == 2 * len(signatures)  # batch sizes 1 and 8
    loaded = tf.saved_model.load(exported["version_dir"])
    spec = export.serving_spec(model)
    for name, signature, inputs in requests:
        assert name == "served"
        if signature == "serving_uint8":
            assert all(inputs[n].dtype == np.uint8 for n in spec.pixel_inputs)
        got = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        keras_inputs = [inputs[n].astype(s.dtype.as_numpy_dtype) for n, s in zip(spec.input_names,
                                                                                   spec.input_specs)]
        want = model(keras_inputs if len(keras_inputs) > 1 else keras_inputs[0], training=False)
        want = want if isinstance(want, (list, tuple)) else [want]
        first = "embeddings" if task == "retrieval" else "logits"
        np.testing.assert_allclose(got[first].numpy(), np.asarray(want[0]), atol=1e-5)


def test_models_config_parses_as_a_model_server_config(exported):
    with open(os.path.join(exported["base"], "models.config")) as handle:
        config = text_format.Parse(handle.read(), model_server_config_pb2.ModelServerConfig())
    (entry,) = config.model_config_list.config
    assert entry.name == "served" and entry.base_path == exported["base"]
    assert entry.model_platform == "tensorflow"
    assert exported["version_dir"] == os.path.join(exported["base"], "1")
    assert sorted(os.listdir(exported["base"])) == ["1", "models.config"]


class _TargetSets(keras.layers.Layer):
    """Two learned target sets of five 4-vectors, whatever the input (``SinkhornMatch``'s per-class targets)."""

    def build(self, input_shape):
        self.sets = self.add_weight(shape=(2, 5, 4), initializer="random_normal")

    def call(self, inputs):
        return self.sets

    def compute_output_shape(self, input_shape):
        return (2, 5, 4)


def test_sqeuclidean_sinkhorn_match_exports_to_onnx_with_the_default_domain(tmp_path):
    """``domain="auto"`` with the unbounded squared Euclidean cost chose its domain per batch (a ``tf.cond`` that
    tf2onnx cannot convert: an ONNX file no runtime loads); it now resolves to the log domain statically, which
    gives the kernel domain's plans to round-off, and the model converts and matches Keras. The cosine cost (the
    MPW head's, the trained presets') keeps its static choice."""
    from ot_layers import SinkhornMatch

    assert SinkhornMatch(cost="sqeuclidean")._solver_domain() == "log"
    assert SinkhornMatch(cost="cosine")._solver_domain() == "kernel"  # 2 / 0.1 below the float32 limit
    assert SinkhornMatch(cost="cosine", epsilon=0.01)._solver_domain() == "log"
    features = np.random.default_rng(3).normal(size=(4, 3, 3, 4)).astype(np.float32)
    inputs = keras.Input((3, 3, 4), name="features")
    target_sets = _TargetSets()
    model = keras.Model(inputs, SinkhornMatch(cost="sqeuclidean", epsilon=1.0)([inputs, target_sets(inputs)]))
    targets = np.asarray(target_sets.sets)
    kernel = SinkhornMatch(cost="sqeuclidean", epsilon=1.0, domain="kernel")([features, targets])
    np.testing.assert_allclose(np.asarray(model(features)), np.asarray(kernel), atol=1e-6)
    path = export.to_onnx(model, str(tmp_path / "match.onnx"))
    report = export.verify(model, features, onnx_path=path, batch_sizes=(1, 4))
    assert report["onnx"] <= 1e-5, report.table()


def test_input_names_made_unique_never_take_another_inputs_name(tmp_path):
    """Keras names ``x`` and ``x.`` both clean to ``x``; the repeat took ``x_1``, the third input's own name, and
    TensorFlow renamed that clash itself (``x_1_1``), so clients sent inputs under a name the signature lacked."""
    inputs = [keras.Input((2,), name=name) for name in ("x", "x.", "x_1")]
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Concatenate()(inputs)))
    spec = export.serving_spec(model)
    assert spec.input_names == ("x", "x_2", "x_1")
    version_dir = export.to_saved_model(model, str(tmp_path / "served"), warmup=False)
    served = tf.saved_model.load(version_dir).signatures["serving_default"]
    assert sorted(served.structured_input_signature[1]) == ["x", "x_1", "x_2"]


def test_a_generic_model_with_two_inputs_gives_each_input_its_own_onnx_batch_size(tmp_path):
    """Axis 0 of every input was ``batch``, one symbolic size: onnxruntime clients were told that a support set and
    the queries it scores (a reduction over the support set) come in equal numbers. Each input and output of a
    generic model with several inputs now has a size of its own, and the file runs with 5 and 2 examples; the
    one-input and task models keep ``batch`` (and ``support``), as the presets' files have them."""
    import onnxruntime

    support = keras.Input((3,), name="support_set")
    queries = keras.Input((3,), name="queries")
    centre = keras.layers.Lambda(lambda t: keras.ops.mean(t, axis=0, keepdims=True), output_shape=(3,))(support)
    model = keras.Model([support, queries], keras.layers.Subtract()([queries, centre]))
    path = export.to_onnx(model, str(tmp_path / "two_inputs.onnx"))
    graph = onnx.load(path).graph
    first = {v.name: v.type.tensor_type.shape.dim[0].dim_param for v in list(graph.input) + list(graph.output)}
    assert first == {"support_set": "support_set_batch", "queries": "queries_batch", "output_0": "output_0_batch"}
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {"support_set": RNG.normal(size=(5, 3)).astype(np.float32),
             "queries": RNG.normal(size=(2, 3)).astype(np.float32)}
    (got,) = session.run(None, feeds)
    np.testing.assert_allclose(got, np.asarray(model([feeds["support_set"], feeds["queries"]])), atol=1e-6)
    from export.onnx import axis_names

    assert axis_names(export.serving_spec(_two_outputs())) == {"features": "batch", "output_0": "batch",
                                                               "output_1": "batch"}
    assert axis_names(export.serving_spec(_few_shot())) == {"query_images": "batch", "support_images": "support",
                                                           "support_labels": "support", "logits": "batch"}
    assert set(axis_names(export.serving_spec(_classifier())).values()) == {"batch"}
    # verify runs such inputs in one batch; split into batches, the support set was cut by the queries' count
    report = export.verify(model, feeds, onnx_path=path)
    assert report["onnx"] <= 1e-5
    with pytest.raises(ValueError, match=r"^`batch_sizes`: the inputs differ in length \(support_set: 5, queries: 2\)"):
        export.verify(model, feeds, onnx_path=path, batch_sizes=(1,))


def test_a_model_whose_image_input_is_uint8_is_served_float32_pixels_too(tmp_path):
    """The default signature and the ONNX input took the model's uint8 dtype (the documented interface is float32
    pixels, uint8 by serving_uint8), and the warm-up records sent float32 to that uint8 signature: replaying them,
    as TF Serving does when it loads the model, failed."""
    import onnxruntime

    images = keras.Input((8, 8, 1), dtype="uint8")
    scaled = keras.ops.cast(images, "float32") / 255.0
    model = TaskModel(images, keras.layers.Dense(3)(keras.layers.Flatten()(scaled)), task="classification")
    spec = export.serving_spec(model)
    assert [s.dtype for s in spec.signature_specs()] == [tf.float32]
    assert [s.dtype for s in spec.signature_specs(uint8=True)] == [tf.uint8]
    version_dir = export.to_saved_model(model, str(tmp_path / "served"), warmup=True)
    loaded = tf.saved_model.load(version_dir)
    requests = read_warmup_requests(os.path.join(version_dir, WARMUP_DIR, WARMUP_FILE))
    assert sorted({r[1] for r in requests}) == ["serving_default", "serving_uint8"]
    for _, signature, inputs in requests:
        got = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        want = model(inputs["images"].astype(np.uint8), training=False)
        np.testing.assert_allclose(got["logits"].numpy(), np.asarray(want), atol=1e-6)
    session = onnxruntime.InferenceSession(export.to_onnx(model, str(tmp_path / "m.onnx")),
                                           providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(float)"
    pixels = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 1)).astype(np.uint8)
    logits = session.run(["logits"], {"images": pixels.astype(np.float32)})[0]
    np.testing.assert_allclose(logits, np.asarray(model(pixels, training=False)), atol=1e-5)


def test_a_scalar_output_is_refused_naming_the_model():
    """A rank-0 output ended in an IndexError in the ONNX exporter and a TypeError in verify."""
    inputs = keras.Input((4,), name="features")
    hidden = keras.layers.Dense(2)(inputs)
    model = keras.Model(inputs, [hidden, keras.ops.sum(hidden)])
    with pytest.raises(ValueError, match=r"^`model`: output 1 is a scalar"):
        export.serving_spec(model, task="generic")


def test_generic_outputs_are_named_apart_from_the_inputs(tmp_path):
    """An input named output_0 met the first output's name: tf2onnx failed with its own error."""
    import onnxruntime

    inputs = keras.Input((4,), name="output_0")
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    spec = export.serving_spec(model, task="generic")
    assert spec.input_names == ("output_0",) and spec.output_names == ("output_0_1",)
    session = onnxruntime.InferenceSession(export.to_onnx(model, str(tmp_path / "m.onnx"), task="generic"),
                                           providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(session.run(["output_0_1"], {"output_0": x})[0], np.asarray(model(x)), atol=1e-5)


def test_warm_up_requests_for_inputs_of_unknown_size_are_refused_or_warned(tmp_path):
    """With images of any size no warm-up request can be made up: warmup=True wrote none without a word."""
    images = keras.Input((None, None, 1))
    model = TaskModel(images, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(images)),
                      task="classification")
    with pytest.raises(ValueError, match=r"^`warmup`: the model's inputs of unknown size \(images"):
        export.to_saved_model(model, str(tmp_path / "refused"), warmup=True)
    assert not os.path.exists(tmp_path / "refused")
    with pytest.warns(UserWarning, match="no warm-up requests"):
        version_dir = export.to_saved_model(model, str(tmp_path / "served"))
    assert not os.path.exists(os.path.join(version_dir, WARMUP_DIR))


def test_the_next_version_passes_a_stray_file_named_like_one(tmp_path):
    """A file named 2 beside version 1 made every default export fail after its work (version 2 'appeared')."""
    model = _classifier()
    base = tmp_path / "served"
    (base / "1").mkdir(parents=True)
    (base / "2").write_text("not a version")
    assert export.to_saved_model(model, str(base), warmup=False) == str(base / "3")
