"""Run one ``otzoo`` command on TFDS's offline mock data: ``python otzoo_on_mock_tfds.py COMMAND ARGS...``.

``tensorflow_datasets.testing.mock_data`` replaces every TFDS data set by random images of the right shapes, drawn
the same way in every process, so a model trained on one Keras backend can be evaluated on another on the same mock
test images. The TFDS pipelines are ``tf.data``: TensorFlow must be installed, whichever backend runs the model.
"""
import sys

import tensorflow_datasets as tfds

from otzoo import cli

MOCK_EXAMPLES = 300  # per split

if __name__ == "__main__":
    with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
        sys.exit(cli.main(sys.argv[1:]))
