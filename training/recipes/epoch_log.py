"""The per-epoch log of a run (``log.csv``), which a resumed run appends to even when it logs other columns.

Keras' ``CSVLogger(append=True)`` writes every row under the columns of the first epoch it logs, and on a file that
already has a header it writes no new one. A run resumed with other columns than the ones it began with (a layer
signal or metric it did not log before) thus wrote rows that no longer line up with the header, and every reader of
the file took its values for the wrong columns. :class:`EpochLog` keeps the file one table.

Keras' logger also adds, when the first epoch has no validation metric, a ``val_`` column for every key (room for
``validation_freq > 1``), which stays ``NA`` in a run without validation data -- ``val_loss`` beside ``loss``, and
``val_mpw_head_sinkhorn_iterations`` beside a layer's signal, which no evaluation ever gives. otzoo's runs validate
every epoch or never, so :class:`EpochLog` writes the columns the epochs log and nothing more.
"""
import csv
import io
import os

import keras

from training.distributed.checkpoints import write_text_atomically

MISSING = "NA"  # what keras.callbacks.CSVLogger writes where an epoch's logs lack a column


class EpochLog(keras.callbacks.CSVLogger):
    """``keras.callbacks.CSVLogger(filename, separator, append=True)`` that keeps an appended file one table.

    On a new (or empty) file it writes what Keras' logger writes, less the ``NA`` ``val_`` columns of a run without
    validation (see the module docstring): the first epoch's keys, sorted, after ``epoch``. On a file with a header,
    at the first epoch this run logs: the columns this run logs and the header lacks are added to the header, the
    earlier rows holding ``NA`` there (the file is rewritten through a temporary file and ``os.replace``, so a run
    killed meanwhile leaves the old file or the new one); the header's columns this run does not log get ``NA`` in
    its rows. Every row then has the header's columns, in the header's order.
    """

    def __init__(self, filename, separator=","):
        super().__init__(os.fspath(filename), separator=separator, append=True)
        self._header = None

    def on_train_begin(self, logs=None):
        self._header = _read_header(self.filename, self.sep)
        super().on_train_begin(logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.keys is None:
            logged = sorted(logs or {})
            if self._header:
                columns = self._header[1:]
                added = [key for key in logged if key not in columns]
                if added:
                    self.csv_file.close()
                    _add_columns(self.filename, self.sep, self._header, added)
                    self.csv_file = open(self.filename, "a")
                logged = columns + added
            self.keys = logged
        super().on_epoch_end(epoch, logs)


def _read_header(path, separator):
    """The first row of the CSV file at ``path``, or ``None`` when it does not exist, is empty or does not begin
    with an ``epoch`` column (a file this logger did not write: Keras' behaviour is kept)."""
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as handle:
        header = next(csv.reader(handle, delimiter=separator), None)
    return header if header and header[0] == "epoch" else None


def _add_columns(path, separator, header, added):
    """Rewrite the CSV file at ``path`` (first row ``header``) with the columns ``added`` after the header's, ``NA``
    in every earlier row."""
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle, delimiter=separator))[1:]
    text = io.StringIO()
    writer = csv.writer(text, dialect="excel", delimiter=separator)
    writer.writerow(list(header) + list(added))
    for row in rows:
        writer.writerow(row + [MISSING] * (len(header) + len(added) - len(row)))
    write_text_atomically(path, text.getvalue())
