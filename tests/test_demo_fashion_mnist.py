"""The demo end to end on real Fashion-MNIST: load the pretrained MPW preset, evaluate, fine-tune, export (slow)."""
import pytest

from otzoo import cli

pytestmark = [pytest.mark.slow, pytest.mark.fashion_mnist]


def test_demo_loads_evaluates_fine_tunes_and_exports(tmp_path, capsys):
    import zoo

    status = cli.main(["demo", "--limit", "1024", "--test-limit", "2000", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = {line[:2]: line for line in out.splitlines() if line[:2] in ("1.", "2.", "3.", "4.")}
    assert set(lines) == {"1.", "2.", "3.", "4."}, out
    card_accuracy = zoo.model_card("resnet20_mpw_fashion_mnist")["metrics"]["accuracy"]
    evaluated = float(lines["2."].rsplit("accuracy", 1)[1])
    assert abs(evaluated - card_accuracy) < 0.02  # 2,000 of the 10,000 test images the card was measured on
    fine_tuned = float(lines["3."].rsplit("accuracy", 1)[1])
    assert fine_tuned > card_accuracy - 0.03  # one gentle epoch does not wreck the pretrained model
    assert float(lines["4."].rsplit(":", 1)[1]) <= 1e-5
