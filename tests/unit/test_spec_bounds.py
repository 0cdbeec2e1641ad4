"""Every construct of a spec is bounded at parse time (issue 25, N4): whatever an Experiment
holds, parsing it takes bounded memory and ends with the spec or a SpecError naming the
field.  Run in a child process under an address-space cap, so a regression fails with
MemoryError there instead of taking the machine (or the operator) down."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

OPERATOR = Path(__file__).resolve().parents[2] / "operator"
CAP_BYTES = 1 << 30          # the child's whole address space
PEAK_BYTES = 64 << 20        # what one parse may allocate (tracemalloc peak)

PRELUDE = textwrap.dedent(f"""
    import json, resource, sys, tracemalloc
    resource.setrlimit(resource.RLIMIT_AS, ({CAP_BYTES}, {CAP_BYTES}))
    sys.path.insert(0, {str(OPERATOR)!r})
    from kubetune.spec import SpecError, parse_experiment

    def parse(spec):
        '''(error path or None, message, peak bytes)'''
        tracemalloc.start()
        try:
            parse_experiment(spec)
            outcome = (None, "")
        except SpecError as error:
            outcome = (error.path, error.message)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return (*outcome, peak)
""")


def run_child(body: str) -> str:
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


BASE = {"objective": {"metric": "loss", "mode": "min"}, "trial": {"entrypoint": "m:f"}}


@pytest.mark.parametrize("param,point,error", [
    ({"randint": [0, 2147483647]}, 1, None),
    ({"randint": [0, 2 ** 53]}, 2 ** 52 + 1, None),
    ({"quniform": [0, 2 ** 40, 1]}, 3, None),
    ({"quniform": [0.0, 1.0e6, 1.0e-6]}, 0.5, None),
    ({"randint": [0, 2147483647]}, 2147483647, "spec.search.initialPoints[0].seed"),
    ({"quniform": [0, 2 ** 40, 2]}, 3, "spec.search.initialPoints[0].seed"),
    ({"randint": [0, 2 ** 60]}, 1, "spec.searchSpace.seed.randint"),
    ({"quniform": [0.0, 1.0e300, 1.0e-300]}, 1.0, "spec.searchSpace.seed.quniform"),
])
def test_initial_points_in_a_huge_range_are_checked_without_listing_it(param, point, error):
    spec = {**BASE, "searchSpace": {"seed": param}, "search": {"initialPoints": [{"seed": point}]}}
    out = run_child(f"print(json.dumps(parse({json.dumps(spec)})))")
    path, message, peak = json.loads(out)
    assert path == error, message
    assert peak < PEAK_BYTES


def test_random_large_and_extreme_specs_parse_in_bounded_memory_or_name_the_field():
    """A property test (hypothesis): specs with extreme numbers, long lists and deep
    structures anywhere the parser looks."""
    out = run_child("""
        from hypothesis import HealthCheck, given, settings, strategies as st

        big_ints = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, 1, 2 ** 31 - 1, 2 ** 53, 2 ** 63]))
        numbers = st.one_of(big_ints, st.floats(allow_nan=True, allow_infinity=True))
        scalars = st.one_of(numbers, st.text(max_size=300), st.booleans(), st.none())
        values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                                st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                              max_leaves=20)
        pairs = st.lists(numbers, min_size=0, max_size=4)
        params = st.one_of(
            st.fixed_dictionaries({"randint": pairs}), st.fixed_dictionaries({"quniform": pairs}),
            st.fixed_dictionaries({"uniform": pairs}), st.fixed_dictionaries({"loguniform": pairs}),
            st.fixed_dictionaries({"choice": st.lists(scalars, max_size=400)}), values)
        names = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
        spaces = st.dictionaries(names, params, min_size=1, max_size=6)

        @st.composite
        def specs(draw):
            space = draw(spaces)
            spec = {"objective": {"metric": "loss", "mode": "min"}, "trial": {"entrypoint": "m:f"},
                    "searchSpace": space}
            algorithm = draw(st.sampled_from(["random", "grid", "tpe", "nsgaii"]))
            points = draw(st.lists(st.dictionaries(st.sampled_from(sorted(space)), numbers), max_size=300))
            spec["search"] = {"algorithm": algorithm, "initialPoints": points or None,
                              "seed": draw(st.one_of(st.none(), big_ints))}
            spec["budget"] = {"maxTrials": draw(big_ints), "parallelism": draw(big_ints)}
            if draw(st.booleans()):
                spec["objectives"] = draw(st.lists(st.fixed_dictionaries(
                    {"metric": st.text(max_size=300), "mode": st.sampled_from(["min", "max", "x"])}), max_size=12))
                spec.pop("objective")
            if draw(st.booleans()):
                spec["constraints"] = draw(st.lists(st.fixed_dictionaries(
                    {"metric": st.text(max_size=300), "max": numbers}), max_size=20))
            if draw(st.booleans()):
                spec["trial"]["config"] = draw(values)
            return spec

        worst = [0]

        @settings(max_examples=300, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(specs())
        def check(spec):
            path, message, peak = parse(spec)
            assert path is None or path.startswith("spec"), (path, message)
            assert peak < %d, (peak, spec)
            worst[0] = max(worst[0], peak)

        check()
        print(json.dumps({"worst_peak": worst[0]}))
    """ % PEAK_BYTES)
    assert json.loads(out.strip().splitlines()[-1])["worst_peak"] < PEAK_BYTES


def test_the_crd_caps_parallelism_and_max_trials():
    import yaml
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "experiment.yaml").read_text())
    budget = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["budget"]
    assert budget["properties"]["parallelism"]["maximum"] == 1000
    assert budget["properties"]["maxTrials"]["maximum"] == 10_000
