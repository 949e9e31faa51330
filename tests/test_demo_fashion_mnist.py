"""The demo's real training run: the MPW head learns Fashion-MNIST (slow; needs the IDX files)."""
import pytest

from training import cli

pytestmark = [pytest.mark.slow, pytest.mark.fashion_mnist]


def test_demo_trains_the_mpw_head(tmp_path, capsys):
    import argparse

    import keras

    args = argparse.Namespace(epochs=1, limit=6000, seed=0, save=str(tmp_path / "demo.keras"))
    accuracy = cli.demo(args)
    assert accuracy > 0.65  # chance is 0.10
    assert "Fashion-MNIST test accuracy" in capsys.readouterr().out
    restored = keras.saving.load_model(args.save)
    assert restored.get_layer("mpw_head").num_classes == 10
