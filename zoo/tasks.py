"""Retrieval and few-shot models by name, taking raw 0-255 pixels (preprocessing inside the model).

Retrieval (``RETRIEVAL_POOLINGS``): :func:`embedding_model` gives ``images -> preprocess -> backbone -> pooling
("gap" or "gsp") -> Dense -> L2 normalization``, the served unit embeddings; pair losses (``ContrastiveLoss``,
``TripletLoss``, ``MultiSimilarityLoss``) train it as is. :func:`proxy_training_model` adds ``ClassProxies``, whose
similarities ``(B, num_classes, num_proxies)`` the proxy losses (``ProxyAnchorLoss``, ``ProxyNCAPlusPlusLoss``)
take as ``y_pred``; it shares every layer with the embedding model.

Few-shot (``FEW_SHOT_HEADS``): :func:`few_shot_model` gives ``[query_images, support_images, support_labels] ->
logits (B, ways)`` for N-way K-shot episodes, trained by cross-entropy on the query labels and served as is.
"""
import keras

from ot_layers.layers.class_proxies import ClassProxies
from ot_layers.layers.emd_head import SCALE as EMD_SCALE
from ot_layers.layers.emd_head import EMDHead
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.task_layers import L2Normalization, PrototypeLogits, SplitEpisode, SupportClassMeans
from ot_layers.task_model import TaskModel, model_task
from ot_layers.validation import check_choice, check_positive_int
from zoo.head_layers import HeadLayer
from zoo.models import _check_pixel_statistics, check_kwargs, image_input, pixel_preprocessing

# The layer of each pooling (GAP's takes no arguments) and few-shot head, and the arguments of it the builder sets.
RETRIEVAL_POOLING_LAYERS = {"gap": None, "gsp": HeadLayer(GeneralizedSumPooling, ("return_attributes",))}
RETRIEVAL_POOLINGS = tuple(RETRIEVAL_POOLING_LAYERS)
FEW_SHOT_HEAD_LAYERS = {"emd": HeadLayer(EMDHead), "protonet": HeadLayer(PrototypeLogits)}
FEW_SHOT_HEADS = tuple(FEW_SHOT_HEAD_LAYERS)


def embedding_model(backbone, pooling="gap", embedding_dim=128, pixel_mean=0.5, pixel_std=0.25,
                    pooling_kwargs=None, name=None, input_shape=None, backbone_kwargs=None):
    """Retrieval embeddings: ``images (0-255) -> preprocess -> backbone -> pooling -> Dense(embedding_dim) ->
    L2 normalization`` (layers ``preprocess``, the backbone, ``gap`` or ``gsp``, ``embedding``, ``l2_normalize``).

    ``pooling``: ``"gap"`` (global average pooling) or ``"gsp"`` (``ot_layers.GeneralizedSumPooling``, Gurbuz 2022
    Eq. 5.2.1, with ``pooling_kwargs``: ``num_prototypes`` 64, ``transport_ratio`` 0.3, ``epsilon`` 0.2 for pair
    losses -- use 2.0 with proxy losses --, ...). ``callbacks.GSPPrototypeInit(layer_name="gsp")`` drives its
    warm-up. ``embedding_dim``: the Dense width, or ``None`` for the pooled features themselves. The Dense layer
    follows the pooling, so GSP transports the backbone's own channels; Gurbuz 2022 (Sec. 5.2.4) maps them to 128
    by a 1x1 convolution before pooling (equivalent for GAP, which commutes with it, but not for GSP, whose transport
    costs are then computed in the 128-d space):
    for that, end ``backbone`` with the 1x1 convolution and pass ``embedding_dim=None``.
    ``backbone``, ``input_shape``, ``backbone_kwargs``, ``pixel_mean``, ``pixel_std``: as in
    :func:`zoo.image_classifier`. Output: unit vectors ``(B, embedding_dim)`` (cosine retrieval).
    """
    check_choice("pooling", pooling, RETRIEVAL_POOLINGS)
    if embedding_dim is not None:
        embedding_dim = check_positive_int("embedding_dim", embedding_dim)
    pooling_kwargs = check_kwargs("pooling_kwargs", pooling_kwargs)
    if pooling == "gap" and pooling_kwargs:
        raise ValueError(f"`pooling_kwargs` apply to pooling='gsp' only, got {sorted(pooling_kwargs)} for 'gap'.")
    if pooling == "gsp":
        RETRIEVAL_POOLING_LAYERS[pooling].check("pooling_kwargs", pooling_kwargs)
    _check_pixel_statistics(pixel_mean, pixel_std)
    extractor, inputs = image_input(backbone, input_shape, backbone_kwargs)
    features = extractor(pixel_preprocessing(pixel_mean, pixel_std)(inputs))
    if pooling == "gsp":
        pooled = GeneralizedSumPooling(name="gsp", **pooling_kwargs)(features)
    else:
        pooled = keras.layers.GlobalAveragePooling2D(name="gap")(features)
    if embedding_dim is not None:
        pooled = keras.layers.Dense(embedding_dim, name="embedding")(pooled)
    embeddings = L2Normalization(name="l2_normalize")(pooled)
    return TaskModel(inputs, embeddings, name=name or f"{extractor.name}_{pooling}_embedding", task="retrieval")


def proxy_training_model(model, num_classes, num_proxies=1, initializer="random_normal", name=None):
    """``model``'s embeddings followed by ``ClassProxies(num_classes, num_proxies)`` (layer ``proxies``): outputs
    the cosine similarities ``(B, num_classes, num_proxies)`` that ``ProxyAnchorLoss`` and
    ``ProxyNCAPlusPlusLoss`` take as ``y_pred``. Shares every layer and weight with ``model``, which stays the
    served embedding model; from a loaded training model, ``keras.Model(train.inputs[0],
    train.get_layer("proxies").input)`` is the embedding model again.

    ``model``: an embedding model with one input and one output ``(B, D)`` (e.g. from :func:`embedding_model`).
    """
    if not isinstance(model, keras.Model) or len(model.inputs) != 1 or len(model.outputs) != 1 \
            or len(model.outputs[0].shape) != 2:
        raise ValueError("`model` must be a keras.Model with one input and one output of embeddings (B, D), got "
                         f"{model!r}.")
    if model_task(model) not in (None, "retrieval"):
        raise ValueError(f"`model` must be an embedding model, got a {model_task(model)} model ({model.name!r}), "
                         "whose outputs are not embeddings.")
    num_classes = check_positive_int("num_classes", num_classes)
    num_proxies = check_positive_int("num_proxies", num_proxies)
    proxies = ClassProxies(num_classes, num_proxies=num_proxies, initializer=initializer, name="proxies")
    return keras.Model(model.inputs[0], proxies(model.outputs[0]), name=name or f"{model.name}_proxies")


def few_shot_model(backbone, head="emd", ways=5, pixel_mean=0.5, pixel_std=0.25, head_kwargs=None, name=None,
                   input_shape=None, backbone_kwargs=None):
    """An N-way K-shot episode classifier: ``[query_images (B, H, W, C), support_images (S, H, W, C),
    support_labels (S,)] -> logits (B, ways)``, pixels in 0-255, labels in ``0..ways-1``, any number ``K >= 1`` of
    support images per class (not necessarily equal or grouped).

    Query and support images go through ``preprocess`` and the backbone as one batch (``episode_images``), then
    are split (``split_episode``). Each class is represented by the mean of its support samples
    (``class_means``, :class:`SupportClassMeans`):

    - ``head="emd"``: the mean support *feature map* is the class's node set (for K = 1 the support map itself,
      DeepEMD's 1-shot setting, Zhang et al. 2022 Sec. 4.2; for K > 1 the class-mean map, the structured FC's
      initialization of Sec. 4.5 without its fine-tuning); ``ot_layers.EMDHead`` (layer ``emd_head``,
      ``method="sinkhorn"`` -- exportable, XLA-compilable -- and ``scale=12.5`` unless ``head_kwargs`` say
      otherwise) gives the logits.
    - ``head="protonet"``: global average pooling (``gap``), the class means of the pooled support features as
      prototypes and :class:`PrototypeLogits` (``protonet_head``; ``head_kwargs``: ``metric`` ``"euclidean"``
      (default, Snell et al. 2017) or ``"cosine"``, ``scale``).

    ``backbone``, ``input_shape``, ``backbone_kwargs``, ``pixel_mean``, ``pixel_std``: as in
    :func:`zoo.image_classifier`. Train with ``SparseCategoricalCrossentropy(from_logits=True)`` on the query
    labels, one episode per step (e.g. ``train_on_batch([q, s, sl], ql)`` or a custom loop): the inputs have
    different batch sizes, so ``fit`` on arrays cannot slice them.
    """
    check_choice("head", head, FEW_SHOT_HEADS)
    ways = check_positive_int("ways", ways)
    head_kwargs = check_kwargs("head_kwargs", head_kwargs)
    FEW_SHOT_HEAD_LAYERS[head].check("head_kwargs", head_kwargs)
    _check_pixel_statistics(pixel_mean, pixel_std)
    extractor, images = image_input(backbone, input_shape, backbone_kwargs)
    query = keras.Input(images.shape[1:], name="query_images")
    support = keras.Input(images.shape[1:], name="support_images")
    support_labels = keras.Input((), dtype="int32", name="support_labels")
    images = keras.layers.Concatenate(axis=0, name="episode_images")([query, support])
    features = extractor(pixel_preprocessing(pixel_mean, pixel_std)(images))
    if head == "protonet":
        features = keras.layers.GlobalAveragePooling2D(name="gap")(features)
    query_features, support_features = SplitEpisode(name="split_episode")([features, query])
    class_features = SupportClassMeans(ways, name="class_means")([support_features, support_labels])
    if head == "emd":
        head_kwargs.setdefault("method", "sinkhorn")
        head_kwargs.setdefault("scale", EMD_SCALE)
        logits = EMDHead(name="emd_head", **head_kwargs)([query_features, class_features])
    else:
        logits = PrototypeLogits(name="protonet_head", **head_kwargs)([query_features, class_features])
    return TaskModel([query, support, support_labels], logits, name=name or f"{extractor.name}_{head}_{ways}way",
                     task="few_shot")


def few_shot_parts(model):
    """``(embed, classify)`` of a few-shot model from :func:`few_shot_model`: ``embed(images)`` runs preprocessing
    and the backbone (and, for ProtoNet, global average pooling) in inference mode; ``classify(query_features,
    support_features, support_labels)`` runs the class means and the head. ``classify(embed(q), embed(s), sl)``
    equals ``model([q, s, sl])``: evaluation embeds a test set once and classifies many episodes from it."""
    names = {layer.name for layer in model.layers}
    if not {"preprocess", "split_episode", "class_means"} <= names or len(model.inputs) != 3:
        raise ValueError(f"`model` must be a few-shot model from zoo.few_shot_model, got {model.name!r}.")
    preprocess, means = model.get_layer("preprocess"), model.get_layer("class_means")
    extractor = next(layer for layer in model.layers if isinstance(layer, keras.Model))
    pooling = model.get_layer("gap") if "gap" in names else None
    head = model.get_layer("emd_head" if "emd_head" in names else "protonet_head")

    def embed(images):
        features = extractor(preprocess(images), training=False)
        return pooling(features) if pooling is not None else features

    def classify(query_features, support_features, support_labels):
        return head([query_features, means([support_features, support_labels])], training=False)

    return embed, classify
