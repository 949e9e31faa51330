"""Training otzoo's models: data sets (``training.data``), one recipe per task (``training.recipes``), distributed
fitting and checkpoints (``training.distributed``), hyper-parameter search (``training.tuning``) and evaluation
(``training.evaluation``)."""
