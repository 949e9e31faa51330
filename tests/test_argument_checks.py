"""Arguments that were taken silently or failed far from their cause: each is now one ``ValueError`` naming it.

A flag given as a string (``return_cost="no"`` read as true), a NaN or ``None`` similarity base, a negative or
fractional seed (NumPy's error, or for CCP a crash at its first re-initialization, mid-training), an empty meta-class
list, an empty side of a partial-transport problem (NaN weights) and an unknown EMD domain with the exact method.
"""
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
    (lambda: solvers.simplex_etf(3, 2, seed=-1), "seed"),
    (lambda: zoo.meta_class_partitions(10, 2, seed=2.5), "seed"),
    (lambda: solvers.partial_transport(np.zeros((3, 0)), transport_ratio=0.5), "cost"),
    (lambda: solvers.partial_transport(np.zeros((0, 4)), transport_ratio=1.0), "cost"),
    (lambda: solvers.emd(np.zeros((2, 2)), method="exact", domain="logg"), "domain"),
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
    (lambda: layers.PatchExtractor()(np.zeros((28, 28, 1), np.float32)), "images"),
    (lambda: layers.PatchExtractor(crop_fraction=0.5), "crop_fraction"),
    (lambda: layers.StructuredFC(3, 4, head="sinkhorn"), "head"),
])
def test_a_layer_given_the_wrong_rank_or_argument_type_names_it(call, name):
    """An einsum error, an IndexError, a len() TypeError and a dict-update TypeError before."""
    with pytest.raises(ValueError, match=f"`{name}`"):
        call()
