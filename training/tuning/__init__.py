"""Hyper-parameter search for a preset's head with keras-tuner (``otzoo tune``)."""
