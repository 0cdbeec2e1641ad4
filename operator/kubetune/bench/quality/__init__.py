"""Search quality. ``python -m kubetune.bench.quality`` compares kubetune's search and
schedulers with the field on offline benchmarks (``__main__``); ``checks`` holds the two
quick in-house checks the unit tests assert (ASHA vs FIFO on crossing curves, TPE vs
random on Branin)."""
from kubetune.bench.quality.checks import (  # noqa: F401  (the unit tests' names)
    ASHA_MAX_BUDGET, ASHA_MAX_GAP, BRANIN_MINIMUM, CURVE_ITERATIONS, CURVE_SEEDS, CURVE_TRIALS,
    asha_passes, asha_vs_fifo, branin, tpe_vs_random,
)
