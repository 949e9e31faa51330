"""The presets trained to convergence over several seeds, the training budget chosen on validation data: meant for a
GPU through Keras' JAX backend (TensorFlow is not needed), and runnable on a CPU at a small scale.

Protocol, the same for every preset of a comparison (same budget grid, same seeds, same care):

1. ``select``: for each preset and each budget ``E`` of ``--budgets`` (epochs; the recipe's schedule spans the whole
   run, so each budget is a run of its own), train by the preset's recipe on its training images minus a validation
   part carved from them, the part ``otzoo tune`` scores trials on (classification: a class-stratified
   ``--validation-fraction`` of the images, the same for every run; retrieval: the last seen classes held out,
   scored by MAP@R among them), once per ``--select-seeds`` seed. The test split is never read. The preset's budget
   is the ``E`` with the best mean validation score (the smaller ``E`` on a tie).
2. ``final``: train the preset by its recipe at its budget on its whole training split with each of ``--seeds``
   (``training.recipes.train_preset``, what ``otzoo --backend jax train PRESET --epochs E --seed S`` runs); the test
   metrics are the card's. Seed 0's run directory (weights and card, which names the backend, the accelerator and
   the budget) is the one to ship.
3. ``report``: each preset's mean and sample standard deviation over the seeds, and the comparisons (MPW vs GAP
   accuracy, GSP vs GAP MAP@R) by Welch's t-test (``scipy.stats.ttest_ind(equal_var=False)``), as JSON and, with
   ``--markdown``, as the two tables the docs show.
4. ``ship``: copy each preset's seed-0 final run into a presets folder (``--to zoo/presets`` replaces the packaged
   presets), its card extended with the protocol's budgets, seeds and each test metric's mean and sd.

Every run is one JSON record in ``--results`` (named by phase, preset, budget and seed); a run with a record is
skipped, so the work spreads over several calls of a GPU lease. A call starts the select runs first, then the
final runs seed by seed, the presets of a comparison before the others: a lease that ends early leaves both sides of
each comparison with as many finished seeds. A run may itself span calls: each run backs up its training state
after every epoch into its directory under ``--runs`` (final runs: their preset directory
``PRESET-seedS``; select runs: ``select-PRESET-eE-sS``), and ``--time-limit`` stops the protocol between two epochs
when the next epoch would end after the limit (judged by the slowest epoch seen in this call; every call trains at
least one epoch). A later call, given that folder back, resumes the run from its backup at the epoch it stopped at,
on the batches an uninterrupted run would draw; a run's directory is marked with its budget, seed and ``--limit``
(``protocol_run.json``, removed when the run ends), and a backup marked otherwise (a final run whose budget a widened
grid changed) is discarded and the run starts afresh. A record's ``seconds`` are those of the call that finished
the run, and ``resumed_at_epoch`` the epoch that call started at (0: the run was trained in one call).

``--workers N`` trains up to N runs at once, each in a process of its own: a ResNet-20 on 28x28 images leaves most
of a GPU idle between its small kernels, and the runs are independent (a final run starts once every select run
of its preset has its record). A run's result does not depend on N. Each call ends by printing the epochs it
trained per minute, the figure to choose N by.

    KERAS_BACKEND=jax python experiments/gpu_presets.py run --results experiments/results/gpu_presets \\
        --runs gpu_runs --budgets 5 10 15 30 60 --select-seeds 0 --seeds 0 1 2 3 4 --time-limit 540 --workers 4
    python experiments/gpu_presets.py report --results experiments/results/gpu_presets --markdown seeds.md
    python experiments/gpu_presets.py ship --results experiments/results/gpu_presets --runs gpu_runs --to zoo/presets
"""
import argparse
import glob
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from explain.signals import read_training_log  # noqa: E402
from otzoo.arguments import positive_int  # noqa: E402
from training.data.errors import EmptySliceError  # noqa: E402
from training.distributed.checkpoints import write_text_atomically  # noqa: E402
from training.distributed.fit import fit  # noqa: E402
from training.distributed.keras_distribution import hardware_description  # noqa: E402
from training.recipes import recipe_for, train_preset  # noqa: E402
from training.recipes.common import preset_spec, standard_callbacks  # noqa: E402
from training.recipes.run_directory import read_mark  # noqa: E402
from training.tuning.trial import trial_score, trial_setup  # noqa: E402
from zoo.preset_format import (CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, WeightsIntegrityError, check_sha256,  # noqa: E402
                               read_card)

PRESETS = ("resnet20_mpw_fashion_mnist", "resnet20_gap_fashion_mnist", "resnet20_hyperspherical_fashion_mnist",
           "resnet20_gsp_retrieval_fashion_mnist", "resnet20_gap_retrieval_fashion_mnist")
# The budget grid (epochs), one for every preset. 15, 30 and 60 first; on an H100 the retrieval pair scored best on
# validation at 15, the grid's smallest (more epochs scored lower), so 5 and 10 were added for every preset.
BUDGETS = (5, 10, 15, 30, 60)
# The comparisons the runs settle: (preset, baseline, metric of the card).
COMPARISONS = (("resnet20_mpw_fashion_mnist", "resnet20_gap_fashion_mnist", "accuracy"),
               ("resnet20_gsp_retrieval_fashion_mnist", "resnet20_gap_retrieval_fashion_mnist", "map_at_r"))


def validation_score(preset, epochs, seed, limit=None, fraction=0.1, verbose=2, run_dir=None, callbacks=()):
    """Train ``preset`` by its recipe for ``epochs`` epochs with ``seed`` on its training images (the first
    ``limit``) minus the validation part its task carves (``fraction``), and score it there: ``(score, loss per
    epoch)``. With ``run_dir`` the run backs up every epoch into ``run_dir/backup``, resumes from it, and logs its
    epochs in ``run_dir/log.csv``, with the layers' signals (the losses returned are the log's, every call's);
    ``callbacks`` go to ``fit``."""
    spec = preset_spec(preset, epochs=epochs, seed=seed)
    recipe, task = spec.recipe, recipe_for(spec.task)
    train, validation, _ = task.tuning_data(limit, fraction, 0)  # one validation part for all runs
    if len(train[0]) < recipe.batch_size:
        raise EmptySliceError(f"{len(train[0])} training images left after the validation part, fewer than one batch "
                              f"of {recipe.batch_size}; raise `limit`", "limit", limit)
    keras.utils.set_random_seed(seed)
    trial = trial_setup(spec, train)
    if run_dir:
        os.makedirs(run_dir, exist_ok=True)
    run_callbacks = trial.callbacks + (standard_callbacks(run_dir, train[0]) if run_dir else []) + list(callbacks)
    _, history = fit(trial.trained, trial.batches, epochs=epochs, callbacks=run_callbacks, verbose=verbose)
    score = trial_score(spec, trial.served, validation)
    losses = _logged_losses(run_dir) if run_dir else history.history["loss"]
    return score, [round(float(v), 4) for v in losses]


def _epoch_rows(log):
    """``{epoch: row}`` of a run's log; an epoch logged twice (its call killed after logging it and before its
    backup, so the next call trained it again) counts by its last row."""
    return dict(zip(log["epoch"].astype(int).tolist(), range(len(log["epoch"]))))


def _logged_losses(run_dir):
    """The loss of every epoch in ``run_dir/log.csv``, by :func:`_epoch_rows`."""
    log = read_training_log(os.path.join(run_dir, "log.csv"))
    rows = _epoch_rows(log)
    return [float(log["loss"][rows[epoch]]) for epoch in sorted(rows)]


def last_epoch_log(run_dir):
    """The last epoch's row of ``run_dir/log.csv`` (``{column: value}``, ``epoch`` and empty cells left out): the
    loss, metrics and layers' signals (e.g. the MPW head's Sinkhorn iterations) a run ended with. Kept in its
    record, since only seed 0's directory is kept (``ship``)."""
    log = read_training_log(os.path.join(run_dir, "log.csv"))
    rows = _epoch_rows(log)
    row = rows[max(rows)]
    return {name: round(float(values[row]), 6) for name, values in log.items()
            if name != "epoch" and np.isfinite(values[row])}


def _record_path(results, phase, preset, epochs, seed):
    return os.path.join(results, f"{phase}-{preset}-e{epochs}-s{seed}.json")


def _job_name(job):
    """``(phase, preset, epochs, seed)`` as the log names a run."""
    return "{} {} e{} s{}".format(*job)


def read_records(results):
    records = []
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        with open(path) as handle:
            record = json.load(handle)
        if isinstance(record, dict) and record.get("phase") in ("select", "final"):
            records.append(record)
    return records


def chosen_budget(records, preset, budgets):
    """The budget of ``budgets`` with the best mean validation score of ``preset`` (the smaller on a tie), or
    ``None`` while a budget has no select record."""
    scores = {}
    for epochs in budgets:
        found = [r["validation_score"] for r in records
                 if r["phase"] == "select" and r["preset"] == preset and r["epochs"] == epochs]
        if not found:
            return None
        scores[epochs] = float(np.mean(found))
    best = max(scores.values())
    return min(epochs for epochs, score in scores.items() if score == best)


def grid_edge(budget, budgets):
    """``"largest"`` or ``"smallest"`` when ``budget`` is that end of the grid ``budgets`` (of two budgets or more),
    else ``None``. A best score at the largest budget means validation was still improving there: the preset is
    compared at the grid's cap, not shown converged; at the smallest, a shorter run might score higher."""
    if budget is None or len(budgets) < 2:
        return None
    return "largest" if budget == max(budgets) else "smallest" if budget == min(budgets) else None


class TimeLimitReached(Exception):
    """Raised between two epochs by :class:`Deadline`: the run's backup holds every finished epoch."""


class Deadline(keras.callbacks.Callback):
    """Stops the protocol between two epochs when the next would end after ``limit`` seconds from the protocol's
    start (``None``: never), judged by the slowest epoch seen (an epoch: from its start to the next one's, its
    validation and backup included; a run's first epoch includes compiling). The first epoch a call trains always
    runs, so that every call makes progress. One object serves every run a process trains in a call; ``clock``
    gives the time, ``start`` the protocol's start by it (default: now; a worker process is given its parent's)."""

    def __init__(self, limit, clock=time.monotonic, start=None):
        super().__init__()
        self.limit, self.clock = limit, clock
        self.start, self.slowest, self.trained = clock() if start is None else start, 0.0, 0
        self._epoch_start = None
        self.first_epoch = None  # the first epoch this call trained of the current run

    def fits(self):
        """Whether one more epoch ends before the limit."""
        return self.limit is None or self.clock() - self.start + self.slowest <= self.limit

    def exhausted(self):
        """Whether the call must stop: it trained an epoch already, and one more would not end before the limit."""
        return self.trained > 0 and not self.fits()

    def _epoch_ended(self):
        if self._epoch_start is not None:
            self.slowest = max(self.slowest, self.clock() - self._epoch_start)
            self.trained += 1
            self._epoch_start = None

    def add_epochs(self, trained, slowest):
        """Count ``trained`` epochs that another process trained in this call, the slowest of them ``slowest`` s."""
        self.trained += trained
        self.slowest = max(self.slowest, slowest)

    def on_train_begin(self, logs=None):
        self.first_epoch, self._epoch_start = None, None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_ended()
        if self.exhausted():
            raise TimeLimitReached(f"time limit: stopped before epoch {epoch + 1} ({epoch} done and backed up)")
        if self.first_epoch is None:
            self.first_epoch = epoch
        self._epoch_start = self.clock()

    def on_train_end(self, logs=None):
        self._epoch_ended()


# Which run a run directory's backup belongs to (see _prepared_run_dir); removed when the run ends.
RUN_MARKER = "protocol_run.json"


def _run_dir(runs, job):
    """The directory under ``runs`` of ``job`` (``(phase, preset, epochs, seed)``): a final run's is its preset
    directory, named by preset and seed only (its budget is chosen once its preset's select runs are recorded)."""
    phase, preset, epochs, seed = job
    name = f"select-{preset}-e{epochs}-s{seed}" if phase == "select" else f"{preset}-seed{seed}"
    return os.path.join(runs, name)


def _prepared_run_dir(runs, job, limit):
    """``job``'s directory under ``runs``, ready for the run on ``limit`` images: kept when it holds a backup of that
    same run to resume from; else emptied and marked as ``job``'s. A run that finished without a record (e.g. killed
    while scoring) starts again, and so does one whose backup was made for another budget or slice (a grid widened
    after a final run began may choose another budget, and each recipe's schedule spans the whole run) or before
    runs were marked."""
    path = _run_dir(runs, job)
    identity = dict(zip(("phase", "preset", "epochs", "seed"), job), limit=limit)
    marker = os.path.join(path, RUN_MARKER)
    if os.path.isdir(os.path.join(path, "backup")):
        recorded = read_mark(marker)
        if recorded == identity:
            return path
        print(f"{_job_name(job)}: the backup in {path} belongs to another run ({recorded or 'unmarked'}); "
              "starting afresh", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    write_text_atomically(marker, json.dumps(identity))
    return path


def _ready_jobs(args):
    """The runs without a record that may start now, in the protocol's order (every select run, then the final
    runs), and the presets whose final runs wait for select runs. ``(phase, preset, epochs, seed)`` each."""
    records = read_records(args.results)
    done = {(r["phase"], r["preset"], r["epochs"], r["seed"]) for r in records}
    selects = [(epochs, seed) for epochs in args.budgets for seed in args.select_seeds]
    jobs, waiting = [], []
    for phase in ("select", "final"):
        if args.phase not in (phase, "all"):
            continue
        for preset in args.presets:
            if phase == "select":
                pairs = selects
            elif any(("select", preset, epochs, seed) not in done for epochs, seed in selects):
                waiting.append(preset)  # the budget is chosen on every select run (all seeds) of the preset
                continue
            else:
                budget = chosen_budget(records, preset, args.budgets)
                pairs = [(budget, seed) for seed in args.seeds]
            jobs += [(phase, preset, epochs, seed) for epochs, seed in pairs
                     if (phase, preset, epochs, seed) not in done]
    return sorted(jobs, key=lambda job: _job_order(job, args.presets)), waiting


def _job_order(job, presets):
    """Where ``job`` comes in a call: every select run first, preset by preset; then the final runs seed by seed,
    the presets of a comparison before the others, so that a call (or a lease) that ends early leaves the compared
    presets with as many finished seeds each."""
    phase, preset, epochs, seed = job
    compared = any(preset in comparison[:2] for comparison in COMPARISONS)
    if phase == "select":
        return (0, presets.index(preset), epochs, seed)
    return (1, not compared, seed, presets.index(preset), epochs)


def run_job(args, job, deadline):
    """Train one run of the protocol (resuming it from its backup) and write its record; ``False`` when
    ``deadline`` stopped it between two epochs (a later call resumes it)."""
    phase, preset, epochs, seed = job
    start = time.time()
    record = dict(phase=phase, preset=preset, epochs=epochs, seed=seed, backend=keras.backend.backend(),
                  hardware=hardware_description(), limit=args.limit)
    run_dir = _prepared_run_dir(args.runs, job, args.limit)
    try:
        if phase == "select":
            score, losses = validation_score(preset, epochs, seed, args.limit, args.validation_fraction,
                                             run_dir=run_dir, callbacks=[deadline])
            record.update(validation_score=round(score, 4), loss=losses,
                          validation=f"validation_fraction {args.validation_fraction} of the training "
                                     "images (the test split is not read)")
        else:
            card = train_preset(preset, run_dir, epochs=epochs, seed=seed, limit=args.limit, callbacks=[deadline])
            record.update(metrics=card["metrics"], out_dir=run_dir, strategy=card["strategy"],
                          train_time_s=card["train_time_s"])
    except TimeLimitReached as stop:
        print(f"{stop} of {_job_name(job)}; a later call resumes it", flush=True)
        return False
    os.remove(os.path.join(run_dir, RUN_MARKER))  # finished: a final run's directory is the preset shipped
    seconds = time.time() - start
    record.update(seconds=round(seconds, 1), resumed_at_epoch=deadline.first_epoch,
                  last_epoch=last_epoch_log(run_dir))
    # written whole, then renamed: the runs beside this one read every record
    write_text_atomically(_record_path(args.results, *job), json.dumps(record, indent=1))
    print(f"{_job_name(job)}: {record.get('validation_score', record.get('metrics'))} ({seconds:.0f} s)", flush=True)
    return True


def _run_one_after_another(args, deadline):
    while True:
        jobs, waiting = _ready_jobs(args)
        if not jobs:
            return waiting
        if deadline.exhausted():
            print(f"time limit: stopping before {_job_name(jobs[0])}")
            return []
        if not run_job(args, jobs[0], deadline):
            return []


def _run_job_in_worker(args, job, start):
    """A worker process's run: its own deadline, counted from the protocol's ``start`` (``time.monotonic`` is the
    machine's clock, the same in every process)."""
    deadline = Deadline(args.time_limit, start=start)
    return run_job(args, job, deadline), deadline.trained, deadline.slowest


def _run_side_by_side(args, deadline):
    """Up to ``args.workers`` runs at once, each in a fresh process (spawned: no state is shared, and a run's
    device memory is freed when it ends); a final run starts once its preset's select runs have their records.
    A run stopped by the time limit stops the starting of new ones; an error in a run is raised once the runs
    under way have ended (their backups kept)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX would give each process 75 % of a GPU
    running, errors, stopped, waiting = {}, [], False, []
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        while True:
            if not stopped and not errors:
                jobs, waiting = _ready_jobs(args)
                for job in (job for job in jobs if job not in running.values()):
                    if len(running) == args.workers:
                        break
                    if deadline.exhausted():
                        print(f"time limit: stopping before {_job_name(job)}")
                        stopped, waiting = True, []
                        break
                    running[pool.submit(_run_job_in_worker, args, job, deadline.start)] = job
            if not running:
                return waiting
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                job = running.pop(future)
                try:
                    finished, trained, slowest = future.result()
                except Exception as error:  # noqa: BLE001 - raised below, once the other runs have ended
                    print(f"{_job_name(job)} failed: {error!r}", flush=True)
                    errors.append(error)
                    continue
                deadline.add_epochs(trained, slowest)
                stopped = stopped or not finished
            if errors and not running:
                raise errors[0]


def run(args):
    os.makedirs(args.results, exist_ok=True)
    deadline = Deadline(args.time_limit)
    waiting = (_run_side_by_side if args.workers > 1 else _run_one_after_another)(args, deadline)
    for preset in waiting:
        print(f"{preset}: no budget chosen yet (select runs missing); final runs wait")
    elapsed = deadline.clock() - deadline.start
    print(f"{deadline.trained} epochs trained in {elapsed:.0f} s by {args.workers} worker(s): "
          f"{60 * deadline.trained / max(elapsed, 1e-9):.2f} epochs a minute")
    return 0


def _spread(values):
    return {"values": values, "mean": float(np.mean(values)),
            "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None}


def summarize(records):
    """Each preset's chosen budget, validation scores, and test metrics over the seeds; the comparisons."""
    presets = sorted({r["preset"] for r in records})
    summary = {"presets": {}, "comparisons": []}
    for preset in presets:
        select = {}
        for r in records:
            if r["phase"] == "select" and r["preset"] == preset:
                select.setdefault(r["epochs"], []).append(r["validation_score"])
        finals = sorted((r for r in records if r["phase"] == "final" and r["preset"] == preset),
                        key=lambda r: r["seed"])
        tried = sorted(select)
        best = chosen_budget(records, preset, tried) if tried else None
        entry = {"validation_by_budget": {str(e): float(np.mean(v)) for e, v in sorted(select.items())},
                 "best_budget_on_validation": best, "best_budget_at_edge_of_grid": grid_edge(best, tried),
                 "budget": finals[0]["epochs"] if finals else None, "seeds": [r["seed"] for r in finals],
                 "hardware": sorted({r["hardware"] for r in finals}), "backend": sorted({r["backend"] for r in finals}),
                 "limit": sorted({str(r["limit"]) for r in finals})}
        for metric in (finals[0]["metrics"] if finals else {}):
            entry[metric] = _spread([r["metrics"][metric] for r in finals])
        # The final runs' last training epoch (loss, metrics, the layers' signals), for the runs that recorded it
        logged = [r["last_epoch"] for r in finals if r.get("last_epoch")]
        columns = sorted(set.intersection(*(set(log) for log in logged))) if logged else []
        entry["last_epoch"] = {"seeds": len(logged),
                               **{column: _spread([log[column] for log in logged]) for column in columns}}
        summary["presets"][preset] = entry
    for preset, baseline, metric in COMPARISONS:
        a = summary["presets"].get(preset, {}).get(metric)
        b = summary["presets"].get(baseline, {}).get(metric)
        if not a or not b or len(a["values"]) < 2 or len(b["values"]) < 2:
            continue
        test = stats.ttest_ind(a["values"], b["values"], equal_var=False)
        summary["comparisons"].append({"preset": preset, "baseline": baseline, "metric": metric,
                                       "difference": a["mean"] - b["mean"], "welch_t": float(test.statistic),
                                       "p_value": float(test.pvalue), "seeds": [len(a["values"]), len(b["values"])]})
    return summary


def report(args):
    """:func:`summarize` the records: printed as JSON, and written as JSON and as Markdown tables when asked."""
    summary = summarize(read_records(args.results))
    text = json.dumps(summary, indent=1)
    print(text)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text + "\n")
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(markdown_tables(summary))
    return 0


def _mean_sd(spreads, digits=4):
    return ", ".join(f"{name} {value['mean']:.{digits}f}" + (f" ± {value['sd']:.{digits}f}" if value["sd"] is not None
                                                             else "") for name, value in spreads)


def markdown_tables(summary):
    """``report``'s summary as three Markdown tables: each preset's budget and test metrics (mean ± sample sd over
    its seeds), the comparisons (difference of the means, Welch's t and its two-sided p-value), and the final
    runs' last training epoch (loss, metrics and the layers' signals, mean ± sd over the seeds that recorded it)."""
    lines = ["| preset | budget (epochs) | seeds | test metrics, mean ± sd |", "| --- | --- | --- | --- |"]
    for preset, entry in summary["presets"].items():
        shown = _mean_sd((name, value) for name, value in entry.items()
                         if isinstance(value, dict) and "values" in value)
        budget = entry["budget"] if entry["budget"] is not None else entry["best_budget_on_validation"]  # no final yet
        if entry["best_budget_at_edge_of_grid"]:
            budget = f"{budget} ({entry['best_budget_at_edge_of_grid']} of the grid)"
        lines.append(f"| {preset} | {budget} | {len(entry['seeds'])} | {shown or '-'} |")
    lines += ["", "| comparison | metric | difference of means | Welch's t | p | seeds |",
              "| --- | --- | --- | --- | --- | --- |"]
    for c in summary["comparisons"]:
        lines.append(f"| {c['preset']} vs {c['baseline']} | {c['metric']} | {c['difference']:+.4f} | "
                     f"{c['welch_t']:.2f} | {c['p_value']:.3g} | {c['seeds'][0]} vs {c['seeds'][1]} |")
    lines += ["", "| preset | seeds | last training epoch, mean ± sd |", "| --- | --- | --- |"]
    for preset, entry in summary["presets"].items():
        last = entry.get("last_epoch", {})
        if last.get("seeds"):
            lines.append(f"| {preset} | {last['seeds']} | "
                         f"{_mean_sd((name, value) for name, value in last.items() if name != 'seeds')} |")
    return "\n".join(lines) + "\n"


def ship(args):
    """Copy each preset's final run of seed ``args.seed`` from ``args.runs`` into ``args.to/PRESET`` as a preset
    directory (its config, weights and card, and its log as ``train_log.csv``), once it is checked to be the run its
    record names; the card gains ``protocol``: the validation score of each budget, the seeds run and each test
    metric's mean and sample sd over them. A preset already in ``args.to`` is replaced.

    A run shipped before (its directory gone from ``args.runs``, as after the session that shipped it: a GPU lease
    is shorter than the seeds take) has its shipped card's ``protocol`` brought up to the seeds recorded since,
    once the shipped files are checked to be that run."""
    records = read_records(args.results)
    summary = summarize(records)["presets"]
    for preset in args.presets:
        record = next((r for r in records if (r["phase"], r["preset"], r["seed"]) == ("final", preset, args.seed)),
                      None)
        if record is None:
            print(f"{preset}: no final run of seed {args.seed} recorded; not shipped")
            continue
        run_dir = _run_dir(args.runs, ("final", preset, record["epochs"], args.seed))
        destination = os.path.join(args.to, preset)
        # Shipped before when the run is gone and the preset folder holds it; else the run must be there.
        card = None if os.path.isdir(run_dir) else _shipped_card(destination, record)
        refresh = card is not None
        if not refresh:
            card = _checked_card(run_dir, record)
        entry = summary[preset]
        card["protocol"] = dict(
            script="experiments/gpu_presets.py", budget=record["epochs"],
            budget_chosen_on="the validation part of the training images (the test split is not read)",
            validation_by_budget=entry["validation_by_budget"], seeds=entry["seeds"],
            **{metric: {key: entry[metric][key] for key in ("mean", "sd")} for metric in record["metrics"]})
        if not refresh:
            shutil.rmtree(destination, ignore_errors=True)
            os.makedirs(destination)
            for name in (CONFIG_FILE, WEIGHTS_FILE):
                shutil.copy2(os.path.join(run_dir, name), destination)
            shutil.copy2(os.path.join(run_dir, "log.csv"), os.path.join(destination, "train_log.csv"))
        write_text_atomically(os.path.join(destination, CARD_FILE), json.dumps(card, indent=2))
        print(f"{preset}: seed {args.seed}, {record['epochs']} epochs, {record['metrics']} -> {destination}"
              + (f" (shipped before; protocol now over seeds {entry['seeds']})" if refresh else ""))
    return 0


def _shipped_card(directory, record):
    """The card in ``directory`` when it holds the finished run ``record`` names (see :func:`_checked_card`), else
    ``None``."""
    try:
        return _checked_card(directory, record)
    except SystemExit:
        return None


def _checked_card(run_dir, record):
    """The card of the finished run in ``run_dir``; ``SystemExit`` naming ``--runs`` unless the run is the one
    ``record`` names (its metrics, budget, seed, backend and weights) and has finished."""
    card = read_card(run_dir)
    if card is None:
        raise SystemExit(f"`--runs`: {run_dir} holds no card ({CARD_FILE}); give the folder the final runs wrote.")
    recipe = card.get("recipe", {})
    found = dict(metrics=card.get("metrics"), epochs=recipe.get("epochs"), seed=recipe.get("seed"),
                 backend=card.get("backend"))
    named = {key: record[key] for key in found}
    unfinished = [name for name in ("backup", RUN_MARKER) if os.path.exists(os.path.join(run_dir, name))]
    if found != named or unfinished:
        raise SystemExit(f"`--runs`: {run_dir} is not the finished run its record names (card {found}, record "
                         f"{named}{', unfinished: ' + ', '.join(unfinished) if unfinished else ''}).")
    try:
        check_sha256(os.path.join(run_dir, WEIGHTS_FILE), card["weights_sha256"])
    except WeightsIntegrityError as error:
        raise SystemExit(f"`--runs`: {error}") from None
    return card


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("run", help="train the runs that have no record yet")
    sub.add_argument("--results", required=True, help="folder of the run records (JSON)")
    sub.add_argument("--runs", default="gpu_runs", help="folder of the final runs' preset directories")
    sub.add_argument("--phase", choices=["select", "final", "all"], default="all")
    sub.add_argument("--presets", nargs="+", default=list(PRESETS))
    sub.add_argument("--budgets", nargs="+", type=int, default=list(BUDGETS))
    sub.add_argument("--select-seeds", nargs="+", type=int, default=[0])
    sub.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    sub.add_argument("--validation-fraction", type=float, default=0.1)
    sub.add_argument("--limit", type=int, default=None, help="the first N training images (a CPU-sized check)")
    sub.add_argument("--time-limit", type=float, default=None,
                     help="seconds: start no epoch that would end later (the run resumes in a later call)")
    sub.add_argument("--workers", type=positive_int, default=1,
                     help="runs trained at once, each in its own process (one GPU is shared by them)")
    sub.set_defaults(run=run)
    sub = commands.add_parser("report", help="summarize the records")
    sub.add_argument("--results", required=True)
    sub.add_argument("--output", default=None, help="also write the summary (JSON) here")
    sub.add_argument("--markdown", default=None, help="also write the seeds and comparisons tables (Markdown) here")
    sub.set_defaults(run=report)
    sub = commands.add_parser("ship", help="copy each preset's final run of one seed into a presets folder")
    sub.add_argument("--results", required=True)
    sub.add_argument("--runs", default="gpu_runs", help="folder of the final runs' preset directories")
    sub.add_argument("--to", required=True, help="presets folder (zoo/presets replaces the packaged presets)")
    sub.add_argument("--presets", nargs="+", default=list(PRESETS))
    sub.add_argument("--seed", type=int, default=0)
    sub.set_defaults(run=ship)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
