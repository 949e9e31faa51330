"""Run at the start of every Python process whose ``PYTHONPATH`` holds this folder (``site`` imports
``sitecustomize``): ``import tensorflow`` fails there, in the processes such a process starts as well, as on a machine
without TensorFlow (the GPU machines). ``no_tensorflow.py`` beside this folder does the blocking."""
import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "no_tensorflow.py")
_spec = importlib.util.spec_from_file_location("_otzoo_no_tensorflow", _path)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_module.block_tensorflow()
