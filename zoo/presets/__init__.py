"""Preset directories (one per pretrained model: ``model.weights.h5`` + ``metadata.json``), shipped as package data."""
