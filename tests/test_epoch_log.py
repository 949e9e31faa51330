"""A run's log.csv stays one table when a resumed run logs other columns (training.recipes.epoch_log.EpochLog),
read back with the standard library's csv module."""
import csv

import keras
import pytest

from training.recipes.epoch_log import EpochLog


def _log_epochs(logger, first_epoch, epochs):
    """What ``fit`` does with a logger: train begin, one ``on_epoch_end`` per ``{metric: value}``, train end."""
    logger.on_train_begin()
    for offset, logs in enumerate(epochs):
        logger.on_epoch_end(first_epoch + offset, dict(logs))
    logger.on_train_end()


def _table(path):
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


RUN = [{"loss": 1.5, "val_loss": 1.7}, {"loss": 1.25, "val_loss": 1.5}]


def test_a_new_log_is_what_keras_writes(tmp_path):
    for logger, name in ((keras.callbacks.CSVLogger(str(tmp_path / "keras.csv"), append=True), "keras.csv"),
                         (EpochLog(tmp_path / "ours.csv"), "ours.csv")):
        _log_epochs(logger, 0, RUN[:1])
        _log_epochs(logger, 1, RUN[1:])  # a resumed run with the same columns appends under the same header
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "keras.csv").read_bytes()
    header, rows = _table(tmp_path / "ours.csv")
    assert header == ["epoch", "loss", "val_loss"] and rows == [["0", "1.5", "1.7"], ["1", "1.25", "1.5"]]


def test_a_resumed_run_with_more_columns_adds_them_to_the_header(tmp_path):
    path = tmp_path / "log.csv"
    _log_epochs(EpochLog(path), 0, RUN)
    _log_epochs(EpochLog(path), 2, [{"loss": 1.0, "mpw_head_sinkhorn_iterations": 7.0, "val_loss": 1.25}])
    header, rows = _table(path)
    assert header == ["epoch", "loss", "val_loss", "mpw_head_sinkhorn_iterations"]
    assert rows == [["0", "1.5", "1.7", "NA"], ["1", "1.25", "1.5", "NA"], ["2", "1.0", "1.25", "7.0"]]

    # Keras' own logger, the reference for the failure: its rows no longer line up with the header.
    reference = tmp_path / "keras.csv"
    _log_epochs(keras.callbacks.CSVLogger(str(reference), append=True), 0, RUN)
    _log_epochs(keras.callbacks.CSVLogger(str(reference), append=True), 2,
                [{"loss": 1.0, "mpw_head_sinkhorn_iterations": 7.0, "val_loss": 1.25}])
    header, rows = _table(reference)
    assert len(rows[-1]) != len(header)


def test_a_resumed_run_with_fewer_columns_fills_them_with_na(tmp_path):
    path = tmp_path / "log.csv"
    _log_epochs(EpochLog(path), 0, [{"loss": 2.0, "ccp_reinitializations": 1.0}])
    _log_epochs(EpochLog(path), 1, [{"loss": 1.0}])
    header, rows = _table(path)
    assert header == ["epoch", "ccp_reinitializations", "loss"]
    assert rows == [["0", "1.0", "2.0"], ["1", "NA", "1.0"]]


def test_a_run_without_validation_logs_no_empty_val_columns(tmp_path):
    """Keras' logger adds an always-NA ``val_`` column for every key of a run without validation, a layer's signal
    included; the run's log holds the columns its epochs log."""
    epochs = [{"loss": 2.0, "gsp_transport_iterations": 11.0}, {"loss": 1.5, "gsp_transport_iterations": 9.0}]
    _log_epochs(keras.callbacks.CSVLogger(str(tmp_path / "keras.csv"), append=True), 0, epochs)
    assert _table(tmp_path / "keras.csv")[0] == ["epoch", "gsp_transport_iterations", "loss",
                                                 "val_gsp_transport_iterations", "val_loss"]
    _log_epochs(EpochLog(tmp_path / "log.csv"), 0, epochs)
    header, rows = _table(tmp_path / "log.csv")
    assert header == ["epoch", "gsp_transport_iterations", "loss"]
    assert rows == [["0", "11.0", "2.0"], ["1", "9.0", "1.5"]]


@pytest.mark.parametrize("existing", ["", "not,an,epoch,log\r\n1,2,3,4\r\n"])
def test_an_empty_or_foreign_file_is_appended_to_as_keras_does(tmp_path, existing):
    for name, logger in (("ours.csv", EpochLog), ("keras.csv", lambda p: keras.callbacks.CSVLogger(p, append=True))):
        (tmp_path / name).write_text(existing)
        _log_epochs(logger(str(tmp_path / name)), 0, RUN)
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "keras.csv").read_bytes()
