"""``search.algorithm: auto``: the sampler for the space, objectives, scheduler and budget.

The rules follow what ``python -m kubetune.bench.quality`` measures (BENCHMARKS.md, "Search
quality") and Optuna's own sampler guidance:
- several objectives: multi-objective TPE, and NSGA-II only for large budgets. Optuna's
  AutoSampler (OptunaHub) runs TPE or GP for the first 250 complete trials and NSGA-II after;
  ``auto`` chooses one sampler for the whole Experiment, so NSGA-II only once most of the
  trials would be NSGA-II's there (500). At 300 trials (30 seeds) MO-TPE missed less of the
  front's hypervolume than NSGA-II on DTLZ2 (0.25 against 0.35) and ZDT2 (0.13, 0.16) beyond
  the CIs, more on ZDT3 (0.15, 0.10), the same on ZDT1 within them: it loses less where it
  loses (BENCHMARKS.md, Search quality, session 14);
- very large budgets: random search, since TPE's cost per suggestion grows with the
  number of trials (quadratic in all) while its edge over random search shrinks;
- under ASHA, random search: on the benchmark's multi-fidelity problems TPE under ASHA
  trailed random search under ASHA on three of seven (mfh3-bad, mfh3-terrible, mfh6-good,
  30 seeds; Optuna's and Ray Tune's TPE+ASHA alike), where the first rungs mislead it, and
  beat it only on the benchmark's own curves, whose first rungs rank well;
- otherwise TPE (multivariate, with the constant liar for parallel trials), which is also
  the pairing Optuna's benchmarks recommend with HyperBand (on the benchmark it matched or
  beat random search under ASHA on every mfh problem, CIs overlapping where it did not beat it).
Pure and deterministic: a restarted operator makes the same choice from the same spec.
"""
from __future__ import annotations

NSGAII_MIN_TRIALS = 500        # twice AutoSampler's 250 TPE/GP trials before it turns to NSGA-II
TPE_MAX_TRIALS = 2000          # beyond, a TPE suggestion costs more than the trial it picks


def choose(*, objectives: int, max_trials: int, early_stopping: str | None) -> tuple[str, str]:
    """The algorithm ``auto`` stands for, and why (the SearchChosen condition's message).
    ``early_stopping``: the scheduler that judges intermediate results, if any."""
    if objectives > 1:
        if max_trials >= NSGAII_MIN_TRIALS:
            return "nsgaii", (f"nsgaii: {objectives} objectives and {max_trials} trials, "
                              f"at least {NSGAII_MIN_TRIALS}, where NSGA-II's generations pay off")
        return "tpe", (f"tpe (multi-objective): {objectives} objectives and {max_trials} trials, "
                       f"fewer than {NSGAII_MIN_TRIALS}, where multi-objective TPE does better than NSGA-II")
    if max_trials > TPE_MAX_TRIALS:
        return "random", (f"random: {max_trials} trials, more than {TPE_MAX_TRIALS}, where each TPE "
                          "suggestion costs more than it gains")
    if early_stopping == "asha":
        return "random", (f"random with asha: one objective and {max_trials} trials; TPE under ASHA "
                          "trails random search where the first rungs mislead it (BENCHMARKS.md, Search quality)")
    paired = f" with {early_stopping}" if early_stopping else ""
    return "tpe", f"tpe{paired}: one objective and {max_trials} trials"
