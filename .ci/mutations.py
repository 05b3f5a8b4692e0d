"""Mutation checks of issue 13: each mutation of the library must make its test fail.

Run from the repository root: ``.venv/bin/python .ci/mutations.py [name filter...]``. Each
mutation is applied to the source, the named tests run, the source is restored; the script
prints CAUGHT (a test failed, as it should) or MISSED. Not part of ``.ci/run`` (about 4 min).
"""

import pathlib
import subprocess
import sys

M = [
    (
        "load_run does not look in a run's best/",
        "gencraft/training/run.py",
        "    if not _is_model_directory(d) and (d / which).is_dir():\n        d = d / which",
        "    if False:\n        d = d / which",
        "tests/training/test_training.py -k load_run",
    ),
    (
        "FAME stays on when disabled",
        "gencraft/focus/model.py",
        "active = self.enabled or self.state.record is not None",
        "active = True or self.state.record is not None",
        "tests/test_methods.py -k 'Focus and disabled'",
    ),
    (
        "pointer head attends when disabled",
        "gencraft/pointer/head.py",
        "        if not self.enabled:\n            shape =",
        "        if False:\n            shape =",
        "tests/test_methods.py -k 'PointerHead and disabled'",
    ),
    (
        "prefix stays on when disabled",
        "gencraft/prefix/model.py",
        "        if not self.enabled:\n            if self.is_encoder_decoder:",
        "        if False:\n            if self.is_encoder_decoder:",
        "tests/test_methods.py -k 'Prefix and disabled'",
    ),
    (
        "recurrence carries h_prev when disabled",
        "gencraft/recurrence/model.py",
        "if not self.config.recurrent or not self.enabled:",
        "if not self.config.recurrent:",
        "tests/test_methods.py -k 'Recurrence and disabled'",
    ),
    (
        "pointer LSTM points when disabled",
        "gencraft/pointer/lstm.py",
        "if c.pointer and not force_gate and self.enabled:",
        "if c.pointer and not force_gate:",
        "tests/test_methods.py -k 'LSTM and disabled'",
    ),
    (
        "a disabled classifier still steers beam search",
        "gencraft/search/beam.py",
        'if classifier is not None and not getattr(classifier, "enabled", True):',
        "if False:",
        "tests/test_methods.py -k 'Classifier and disabled'",
    ),
    (
        "remove() leaves the base frozen",
        "gencraft/models/method.py",
        "                p.requires_grad_(flags.get(n, p.requires_grad))",
        "                pass",
        "tests/test_methods.py -k 'Focus and remove'",
    ),
    (
        "prefix remove() leaves its plug-ins on",
        "gencraft/prefix/model.py",
        "        for h in self._handles:\n            h.remove()\n        self._handles = []\n\n    def _set",
        "        self._handles = []\n\n    def _set",
        "tests/test_methods.py -k 'Prefix and remove'",
    ),
    (
        "RecurrentLM not a windowed-scorer hook",
        "gencraft/metrics/lm.py",
        "    if isinstance(model, WindowedScorer):",
        "    if False:",
        "tests/recurrence/test_recurrence_model.py",
    ),
    (
        "E2E ROUGE-L with beta 1 instead of the scripts' 1.2",
        "gencraft/metrics/data2text.py",
        "    scorer.beta = beta\n",
        "    scorer.beta = 1.0\n",
        "tests/metrics/test_score_task.py -k beta",
    ),
    (
        "score_task ignores lowercase=True",
        "gencraft/metrics/tasks.py",
        "    if lowercase:\n        preds = [p.lower() for p in preds]",
        "    if False:\n        preds = [p.lower() for p in preds]",
        "tests/metrics/test_score_task.py -k cased",
    ),
    (
        "summaries scored without stemming",
        "gencraft/metrics/tasks.py",
        '"summarization", SUMMARY_METRICS, "rouge-score", True)',
        '"summarization", SUMMARY_METRICS, "rouge-score", False)',
        "tests/metrics/test_score_task.py -k stemmed",
    ),
    (
        "focus renormalise off by default",
        "gencraft/focus/decoding.py",
        "        renormalize: bool = True,\n    ) -> None:",
        "        renormalize: bool = False,\n    ) -> None:",
        "tests/focus/test_focus_core.py -k beam_scores",
    ),
    (
        "DFS pruning disabled",
        "gencraft/search/exact.py",
        "            if child_score <= self.best:\n                break",
        "            if False:\n                break",
        "tests/search/test_search.py -k flat",
    ),
    (
        "every node keeps its full cache",
        "gencraft/search/exact.py",
        "            kv = _slice_last(child_cache)",
        "            kv = [(k.clone(), v.clone()) for k, v in _kv(child_cache)]",
        "tests/search/test_search.py -k alive",
    ),
    (
        "stale window by default",
        "gencraft/pointer/config.py",
        'option(\n        "regenerate", "re-run',
        'option(\n        "stale", "re-run',
        "tests/pointer/test_pointer_model.py -k regenerated",
    ),
    (
        "zoneout_eval none by default",
        "gencraft/pointer/rnn.py",
        'zoneout_eval: Literal["expectation", "none"] = "expectation",',
        'zoneout_eval: Literal["expectation", "none"] = "none",',
        "tests/pointer/test_pointer_model.py -k expectation_of",
    ),
    (
        "for_length off by one",
        "gencraft/search/classifier.py",
        "length_bucket(max(n - t, 0))",
        "length_bucket(max(n - t - 1, 0))",
        "tests/search/test_search_classifier.py -k for_length",
    ),
    (
        "alpha in the final on_beam ranking",
        "gencraft/search/beam.py",
        "                return -bm.cond  # Alg. 1",
        "                return -bm.sel  # Alg. 1",
        "tests/search/test_search.py -k alpha_steers",
    ),
    (
        "focus sampling uniform",
        "gencraft/focus/decoding.py",
        "probs = torch.softmax(topic_logits.detach().float(), dim=0)",
        "probs = torch.ones_like(topic_logits.detach().float())",
        "tests/focus/test_focus_core.py -k softmax",
    ),
    (
        "length study on the search objective",
        "gencraft/search/experiments.py",
        '"beam_log_prob": sequence_log_prob(model, ids, plain.tokens),',
        '"beam_log_prob": plain.score,',
        "tests/search/test_search_classifier.py -k length_study",
    ),
    (
        "bucket gains reversed",
        "gencraft/pointer/analysis.py",
        '"gain": base - ptr}',
        '"gain": ptr - base}',
        "tests/pointer/test_pointer_cli.py -k analyze",
    ),
    (
        "best checkpoint by loss",
        "gencraft/focus/config.py",
        "self.fit = replace(self.fit, metric=self.select_by, mode=mode)",
        'self.fit = replace(self.fit, metric="loss", mode="min")',
        "tests/focus/test_focus_train.py -k rouge",
    ),
    (
        "training-loop flags do not reach cfg.fit",
        "gencraft/cli/flags.py",
        "values[f.name] = dataclasses.replace(inner, **given) if given else inner",
        "values[f.name] = inner",
        "tests/cli/test_cli.py -k training_loop_flags",
    ),
    (
        "a trainer maps its settings into FitConfig by hand again",
        "gencraft/recurrence/train.py",
        "    fit_cfg = replace(cfg.fit,",
        "    fit_cfg = replace(FitConfig(**asdict(cfg.fit)),",
        "tests/test_layout.py",
    ),
    (
        "Alg. 1 picks slots by model score, not the selection score",
        "gencraft/search/beam.py",
        "cands.sort(key=lambda c: -c.sel)",
        "cands.sort(key=lambda c: -c.unc)",
        "tests/search",
    ),
    (
        "a complete slot on the beam is continued",
        "gencraft/search/beam.py",
        "            if c.token is None:  # a complete hypothesis stays",
        "            if c.token is None and False:",
        "tests/search",
    ),
    (
        "fit validates without resetting the running training loss",
        "gencraft/training/fit.py",
        "        self.running, self.running_n = 0.0, 0\n        value = None",
        "        value = None",
        "tests/training tests/test_methods.py",
    ),
    (
        "greedy AR decoding scores the processed logits",
        "gencraft/nar/decoding.py",
        "torch.stack(gen.logits, 1)[0]",
        "torch.stack(gen.scores, 1)[0]",
        "tests/nar/test_nar.py -k one_beam",
    ),
    (
        "a variant's ratio against another pair's baseline run",
        "gencraft/timing.py",
        "ratios[k].append(got[k] / got[baseline])",
        "ratios[k].append(got[k] / times[baseline][0])",
        "tests/test_timing.py",
    ),
    (
        "speed ratio as the ratio of medians",
        "gencraft/timing.py",
        "            median(q),",
        "            median(times[k]) / median(times[baseline]),",
        "tests/test_timing.py",
    ),
    (
        "speed pairs always in one order",
        "gencraft/timing.py",
        "pair = (baseline, k) if r % 2 == 0 else (k, baseline)",
        "pair = (baseline, k)",
        "tests/test_timing.py",
    ),
    (
        "generated flags are not marked as such",
        "gencraft/cli/flags.py",
        "    action.from_config = True\n",
        "\n",
        "tests/cli/test_cli.py -k generated",
    ),
    (
        "an old spelling sets another field",
        "gencraft/cli/flags.py",
        "parser.add_argument(alias, dest=f.name, **hidden)",
        "parser.add_argument(alias, dest=f.name + '_old', **hidden)",
        "tests/cli/test_cli.py -k aliases",
    ),
    (
        "old spellings shown in the help",
        "gencraft/cli/flags.py",
        'hidden = {**kw, "help": argparse.SUPPRESS, "default": argparse.SUPPRESS}',
        'hidden = {**kw, "default": argparse.SUPPRESS}',
        "tests/cli/test_cli.py -k one_name",
    ),
    (
        "nar eval ignores --lowercase",
        "gencraft/cli/nar.py",
        "        lowercase=args.lowercase,\n",
        "",
        "tests/nar/test_nar.py -k cli",
    ),
    (
        "batched training rows lose the separator",
        "gencraft/prefix/data.py",
        'rows.append({"input_ids": src + sep + tgt, "labels": [-100] * len(src + sep) + tgt})',
        'rows.append({"input_ids": src + tgt, "labels": [-100] * len(src) + tgt})',
        "tests/prefix/test_prefix_parts.py -k pair_by_pair",
    ),
    (
        "bland template's tie count at equal probabilities (issue 26 §8)",
        "gencraft/search/toy.py",
        "ties = (self.rare + 1) ** n if self.p_common == self.p_rare else 1",
        "ties = 2**n if self.p_common == self.p_rare else 1",
        "tests/search/test_search_toy.py -k exact_enumeration",
    ),
    (
        "bland template's tie test of an ulp",
        "gencraft/search/toy.py",
        "        if self.p_common >= self.p_rare:",
        "        if self.p_common >= self.p_rare or math.isclose(self.p_common, self.p_rare):",
        "tests/search/test_search_toy.py -k exact_enumeration",
    ),
    (
        "toy empty-mode condition made non-strict (issue 26 §2.8)",
        "gencraft/search/toy.py",
        "p / p0 < self.letters**ell",
        "p / p0 <= self.letters**ell",
        "tests/search/test_search_toy.py -k exact_tie",
    ),
    (
        "focus decoding settings not validated",
        "gencraft/focus/config.py",
        '        positive(self, "samples", "max_source")\n',
        "",
        "tests/cli/test_cli.py -k one_line_for_every_trainer",
    ),
]
only = sys.argv[1:]
for name, path, a, b, test in M:
    if only and not any(o in name for o in only):
        continue
    p = pathlib.Path(path)
    src = p.read_text()
    assert a in src, (name, a)
    p.write_text(src.replace(a, b))
    try:
        r = subprocess.run(
            f"HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -x -p no:cacheprovider {test}",
            shell=True,
            capture_output=True,
            text=True,
        )
        last = r.stdout.strip().splitlines()[-1]
        print(f"{'CAUGHT' if r.returncode else 'MISSED'}: {name}: {last}", flush=True)
    finally:
        p.write_text(src)
