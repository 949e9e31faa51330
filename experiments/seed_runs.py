"""The per-seed run files of an experiment and their spread, for the scripts that summarize seeds
(``emd_fewshot_seeds.py``, ``zero_shot_seeds.py``, ``dl2pa_seeds.py``).

An experiment's seed 0 writes ``experiments/results/{stem}.json`` and seed ``S`` ``{stem}_seed{S}.json``; each
records its seed in ``args.seed`` (:func:`seed_reports`). ``dl2pa_seeds.py``, whose runs keep all seeds of one
prototype dimension in one file, uses only ``RESULTS``, :func:`spread` and :func:`paired_differences`.
"""
import glob
import json
import os
import re

import numpy as np
from scipy import stats

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def seed_reports(stem):
    """``{seed: report}`` of the run files of ``stem`` in ``RESULTS``, by seed. A file that is not JSON (a run
    writing it at this moment) is left out with a message; a file whose name names another seed than it records, or
    a second file of one seed, raises ``ValueError``."""
    found = {}
    for path in glob.glob(os.path.join(RESULTS, f"{stem}*.json")):
        match = re.fullmatch(rf"{re.escape(stem)}(?:_seed(\d+))?\.json", os.path.basename(path))
        if not match:
            continue
        try:
            with open(path) as handle:
                report = json.load(handle)
        except json.JSONDecodeError as error:
            print(f"{os.path.basename(path)} left out: not JSON ({error})")
            continue
        seed = report["args"]["seed"]
        if int(match.group(1) or 0) != seed:
            raise ValueError(f"{path} records seed {seed}, its name another")
        if seed in found:
            raise ValueError(f"{path}: a second run of seed {seed}")
        found[seed] = dict(report, path=path)
    return dict(sorted(found.items()))


def spread(values):
    """Mean and sample sd (``ddof=1``; 0 for one value)."""
    values = np.asarray(values, dtype=float)
    return float(values.mean()), (float(values.std(ddof=1)) if len(values) > 1 else 0.0)


def paired_differences(per_seed):
    """Per-seed differences of two variants run on the same seeds: the differences (rounded to 4 digits), their mean
    and sample sd, in how many seeds the first was ahead (ties counted) and the two-sided p-value of a paired t-test
    of a zero mean difference (``None`` below two seeds or without spread)."""
    mean, sd = spread(per_seed)
    p_value = float(stats.ttest_1samp(per_seed, 0.0).pvalue) if len(per_seed) > 1 and sd > 0 else None
    ties = sum(d == 0 for d in per_seed)
    return dict(per_seed=[round(d, 4) for d in per_seed], mean=mean, sd=sd,
                positive_in=f"{sum(d > 0 for d in per_seed)}/{len(per_seed)}" + (f" ({ties} tied)" if ties else ""),
                paired_t_p=p_value)
