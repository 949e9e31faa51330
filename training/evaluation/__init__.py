"""Evaluation: retrieval metrics (P@1, MAP@R, R@k, NMI), few-shot accuracy over episodes with its 95 % interval,
and DeepEMD's structured-FC fine-tuning on a support set."""
from training.evaluation.few_shot import evaluate_episodes, few_shot_accuracy, mean_and_ci95
from training.evaluation.retrieval import retrieval_metrics

__all__ = ["evaluate_episodes", "few_shot_accuracy", "mean_and_ci95", "retrieval_metrics"]
