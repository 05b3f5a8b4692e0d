"""``make mutmut``: the automatic mutation tool (mutmut 3) over gencraft's packages, one
package at a time against the tests that guard it, with a score per package.

    python .ci/mutmut_run.py plotting metrics/lm       # some packages
    python .ci/mutmut_run.py gencraft/search/toy.py     # any library file, against its tests
    python .ci/mutmut_run.py --list                     # the packages and their tests

A file given by path that no package names is mutated against its package's test folder
(``gencraft/search/toy.py`` against ``tests/search``; a top-level module against ``tests``).

Each package runs in its own work folder (``$GENCRAFT_MUTMUT_DIR``, default
``/tmp/gencraft-mutmut/<package>``) holding a copy of ``gencraft/``, ``tests/`` and ``hub/`` and a
``pyproject.toml`` whose ``[tool.mutmut]`` names the files to mutate and the tests to run, so
runs never touch the checkout and resume where they stopped. The scores go to
``<work>/score.json`` and are printed as one line per package: killed / (killed + survived),
timeouts counted as killed, mutants no test reaches (``no tests``) counted as survived.
``.ci/mutations.py`` (hand-written mutations, CI's rotating share) is separate.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tests_but(path: str, *slow: str) -> list[str]:
    """Every test in ``path`` but those whose names hold one of ``slow``, as pytest node ids."""
    names = re.findall(r"^def (test\w+)", (ROOT / path).read_text(), re.M)
    return [f"{path}::{n}" for n in names if not any(word in n for word in slow)]


#: package -> (files to mutate, tests that guard them), the held-out list's gaps first
PACKAGES: dict[str, tuple[list[str], list[str]]] = {
    "plotting": (
        ["gencraft/plotting.py"],
        ["tests/test_plots.py", "tests/test_islands_and_scales.py"],
    ),
    "progress": (
        ["gencraft/progress.py"],
        [
            "tests/test_progress.py",
            "tests/test_islands_and_scales.py",
            "tests/test_unit_progress.py",
        ],
    ),
    "metrics/lm": (
        ["gencraft/metrics/lm.py"],
        ["tests/metrics", "tests/test_unlisted_behaviours.py"],
    ),
    "search/custom_generate": (
        ["gencraft/search/custom_generate.py"],
        [
            "tests/test_custom_generate.py",
            "tests/test_custom_generate_calls.py",
            "tests/search/test_batch.py",
        ],
    ),
    # by its fast direct tests (the method contract's take minutes)
    "models/introspect": (["gencraft/models/introspect.py"], ["tests/models/test_introspect.py"]),
    "models/placement": (["gencraft/models/placement.py"], ["tests/models/test_placement.py"]),
    # the one sampler and the text-in, text-out wrappers, by their direct tests
    "models/sampling": (["gencraft/models/sampling.py"], ["tests/models/test_sampling.py"]),
    "models/generate": (
        ["gencraft/models/generate.py", "gencraft/models/prompts.py"],
        [
            "tests/models/test_generate_text.py",
            "tests/models/test_models.py",
            # not the MBR study, whose scoring starts METEOR's Java for every mutant
            "tests/models/test_mbr_generate.py::test_mbr_output_is_the_brute_force_choice",
            "tests/models/test_mbr_generate.py::test_sampled_candidates_are_each_prompt_s_own",
            "tests/models/test_mbr_generate.py::test_cli_mbr_and_its_errors",
            "tests/models/test_mbr_generate.py::test_mbr_refuses_zero_candidates",
            "tests/models/test_left_padded_batches.py",
            "tests/models/test_sampling.py",
        ],
    ),
    "models/contrast": (
        ["gencraft/models/contrast.py"],
        ["tests/search/test_cad_paired.py", "tests/prefix/test_prefix_cad.py"],
    ),
    "data/own": (["gencraft/data/own.py"], ["tests/data/test_own_data.py"]),
    "folder_lock": (["gencraft/training/folder_lock.py"], ["tests/test_folder_lock.py"]),
    # sharding and the partial results' fingerprint (the one-process tests; gloo ones aside)
    "distributed": (
        ["gencraft/distributed.py"],
        [
            "tests/test_distributed.py::test_shares_are_the_one_process_batches_split_contiguously",
            "tests/test_distributed.py::test_gathering_refuses_a_missing_or_repeated_index",
            "tests/test_distributed.py::test_a_rerun_resumes_from_the_partial_files",
            "tests/test_distributed.py::test_a_rerun_of_another_run_is_refused_naming_what_differs",
            "tests/test_distributed.py::"
            "test_partial_results_without_a_record_or_a_fingerprint_are_refused",
            "tests/test_distributed.py::test_each_process_bar_counts_its_share_and_says_so",
            "tests/test_distributed.py::"
            "test_the_fingerprint_record_is_order_free_sized_and_keys_each_line",
            "tests/test_distributed.py::"
            "test_a_foreign_line_and_a_wrong_count_are_refused_word_for_word",
            "tests/test_distributed.py::test_a_bar_is_labelled_from_its_description_or_alone",
            "tests/test_distributed.py::test_shares_and_gathering_refuse_word_for_word",
            "tests/cli/test_rerun_outputs.py",
        ],
    ),
    "payload": (["gencraft/studies/payload.py"], ["tests/test_payload.py"]),
    # the verdicts' statistics: the fast tests only (the tiny campaigns take minutes each)
    "metrics/stats": (
        ["gencraft/metrics/stats.py"],
        [
            "tests/metrics/test_stats.py",
            "tests/metrics/test_compare_paired.py",
            "tests/test_pooled_verdicts.py",
            "tests/search/test_conditional_statistics.py",
            "tests/test_campaign.py::test_student_t_matches_published_quantiles_and_tails",
            "tests/test_campaign.py::test_the_paired_t_interval_excludes_zero_exactly_when_p_is_below_005",
            "tests/test_campaign.py::test_the_verdict_on_unfinished_runs_is_computed_so_far_and_marked_interim",
            "tests/test_campaign.py::test_the_fame_and_dasp_verdicts_pair_seeds",
            "tests/search/test_search_errors.py::test_sign_test_equals_counting_every_sequence",
            "tests/search/test_search_errors.py::test_wilson_interval_matches_published_values_and_stays_inside",
        ],
    ),
    # the checkpoint rules, by their fast direct tests (the trainers' own take minutes)
    "training/checkpoint": (
        ["gencraft/training/checkpoint.py"],
        ["tests/training/test_checkpoint.py"],
    ),
    "nar/decoding": (["gencraft/nar/decoding.py"], ["tests/nar"]),
    "search/beam": (
        ["gencraft/search/beam.py"],
        ["tests/search", "tests/test_custom_generate.py"],
    ),
    "search/exact": (
        ["gencraft/search/exact.py"],
        ["tests/search", "tests/test_custom_generate.py"],
    ),
    "models/stepping": (
        ["gencraft/models/stepping.py"],
        [
            "tests/search",
            "tests/models",
            "tests/test_custom_generate.py",
            "tests/test_custom_generate_calls.py",
        ],
    ),
    # the cache algebra: stepping's, exact search's and HSO's uses, and the row-state caches
    "models/caches": (
        ["gencraft/models/caches.py"],
        [
            "tests/models/test_cache_records.py",
            "tests/models/test_stepper_contract.py",
            "tests/search/test_batch.py",
            "tests/search/test_search.py",
            "tests/hso/test_hso.py",
            "tests/prefix/test_prefix_model.py",
            # the row-state generate wrapper (TruncSA's column mass)
            "tests/prefix/test_prefix_causality.py::test_sparse_attention_generate_carries_the_column_mass",
            "tests/prefix/test_prefix_parts.py",
        ],
    ),
    # context-aware decoding: the settings, the contrast and both engines
    "models/cad": (
        ["gencraft/models/cad.py"],
        [
            "tests/search/test_cad.py",
            "tests/search/test_cad_paired.py",
            "tests/prefix/test_prefix_cad.py",
            "tests/cli/test_trial_findings.py",
        ],
    ),
    # not the tests that start several processes (14-15 s each, for every mutant they
    # reach); the suite runs them
    "training/fit": (
        ["gencraft/training/fit.py"],
        [
            *_tests_but("tests/training/test_training.py", "two_processes"),
            "tests/test_unlisted_behaviours.py",
            *_tests_but("tests/test_folder_lock.py", "campaign_skips", "started_together"),
            "tests/test_unit_progress.py",
        ],
    ),
    # HSO's few-shot claim: the tasks, prompts and labels of the few-shot classifier
    "hso/fewshot": (
        ["gencraft/hso/fewshot.py"],
        [
            "tests/hso/test_fewshot.py",
            "tests/hso/test_hso.py::test_few_shot_prompts_and_classification",
            "tests/hso/test_hso_batch.py",
            "tests/hso/test_dynamic_batch.py",
            "tests/hso/test_hso_cli.py",
        ],
    ),
    "hso/functional": (
        ["gencraft/hso/functional.py"],
        ["tests/hso/test_hso.py", "tests/hso/test_hso_batch.py", "tests/hso/test_hso_checks.py"],
    ),
    # the pointer's evaluation pass and its analyses (frequency gains, passages)
    "pointer/evaluate": (
        ["gencraft/pointer/evaluate.py", "gencraft/pointer/analysis.py"],
        [
            "tests/pointer/test_pointer_evaluate.py",
            "tests/pointer/test_pointer_analysis.py",
            "tests/pointer/test_pointer_cli.py",
        ],
    ),
    "search/train": (
        ["gencraft/search/train.py"],
        [
            "tests/search/test_search_train.py",
            "tests/search/test_search_classifier.py",
            "tests/search/test_sampler_hidden.py",
        ],
    ),
    # the campaign: its plan, budget, verdict table and runs' folders, by the fast tests (not
    # the tiny campaign's 20 s); run its logic by name, e.g.
    # "gencraft.studies.campaign.x_plan_rows*": the claims' tables make 346 of its 761 mutants
    "campaign": (
        ["gencraft/studies/campaign.py"],
        [
            *_tests_but("tests/test_campaign.py", "tiny_campaign"),
            "tests/test_lost_work.py",
            "tests/test_folder_lock.py",
            "tests/test_unit_parts.py",
            "tests/test_unit_progress.py",
        ],
    ),
}


def _config(files: list[str], tests: list[str]) -> str:
    lines = [
        "[tool.mutmut]",
        'source_paths = ["gencraft"]',
        'also_copy = ["hub"]',
        f"only_mutate = {json.dumps(files)}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x", "-m", "not slow"]',
        'process_isolation = "forkserver"',
        "timeout_multiplier = 5.0",
    ]
    return "\n".join(lines) + "\n"


def _score(work: Path) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=work,
        capture_output=True,
        text=True,
    ).stdout
    counts: dict[str, int] = {}
    for line in out.splitlines():
        if ":" in line:
            status = line.rsplit(":", 1)[1].strip()
            counts[status] = counts.get(status, 0) + 1
    return counts


def package_of(name: str) -> tuple[list[str], list[str]]:
    """A named package's files and tests, or a library file's (see the module doc)."""
    if name in PACKAGES:
        return PACKAGES[name]
    path = ROOT / name
    parts = Path(name).parts
    if not (name.endswith(".py") and path.is_file() and parts[0] == "gencraft"):
        raise KeyError(name)
    folder = ROOT / "tests" / parts[1] if len(parts) > 2 else None
    return [name], [f"tests/{parts[1]}" if folder is not None and folder.is_dir() else "tests"]


def run(package: str, children: int) -> dict:
    files, tests = package_of(package)
    base = Path(os.environ.get("GENCRAFT_MUTMUT_DIR", "/tmp/gencraft-mutmut"))
    work = base / package.removesuffix(".py").replace("/", "-")
    work.mkdir(parents=True, exist_ok=True)
    # a fresh copy; mutmut's own state in mutants/ stays. hub/ holds the custom_generate
    # folders that tests/test_custom_generate.py loads
    for name in ("gencraft", "tests", "hub"):
        shutil.rmtree(work / name, ignore_errors=True)
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    (work / "pyproject.toml").write_text(_config(files, tests))
    # the mutants profile: the suite's cases without shrinking a failure (tests/conftest.py)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.setdefault("HYPOTHESIS_PROFILE", "mutants")
    env.setdefault("GENCRAFT_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)]
    subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL)
    counts = _score(work)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    survived = counts.get("survived", 0) + counts.get("no tests", 0)
    result = {
        "package": package,
        "files": files,
        "tests": tests,
        "counts": counts,
        "score": round(killed / max(1, killed + survived), 3),
    }
    (work / "score.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for name, (files, tests) in PACKAGES.items():
            print(f"{name:24s} {' '.join(files)}  <-  {' '.join(tests)}")
        return 0
    children = int(os.environ.get("GENCRAFT_MUTMUT_CHILDREN", "2"))
    names = [a for a in argv if not a.startswith("-")] or list(PACKAGES)
    unknown = []
    for n in names:
        try:
            package_of(n)
        except KeyError:
            unknown.append(n)
    if unknown:
        print(
            f"unknown package(s) {unknown}; --list shows them, or give a library file's path",
            file=sys.stderr,
        )
        return 2
    for name in names:
        r = run(name, children)
        c = r["counts"]
        print(
            f"{name:24s} score {r['score']:.3f}  killed {c.get('killed', 0)}  timeout "
            f"{c.get('timeout', 0)}  survived {c.get('survived', 0)}  no tests "
            f"{c.get('no tests', 0)}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
