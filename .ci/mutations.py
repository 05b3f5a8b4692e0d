"""Mutation checks: each mutation of the library must make its named test fail.

Each entry is (name, file, source pattern, replacement, pytest selection). The runner copies
the ``gencraft`` package to a temporary directory, applies the mutation to the copy, and runs
the selection with that copy first on the import path (``PYTHONPATH`` plus ``PYTHONSAFEPATH``,
so neither the checkout's directory nor the editable install serves ``gencraft``; the test
session checks which copy it imported, see tests/conftest.py). The checkout is never written.

    .venv/bin/python .ci/mutations.py                 # all (make mutations)
    .venv/bin/python .ci/mutations.py --ci            # CI's subset, see below
    .venv/bin/python .ci/mutations.py --list          # the mutations per group
    .venv/bin/python .ci/mutations.py WORD...         # those whose name holds a word

``--ci`` runs a rotating subset chosen by the commit hash (every group's mutations take
turns) plus every mutation whose file the last commit touched. Each mutation prints CAUGHT
(a test failed, as it should), MISSED (all passed), or ERROR (its pattern no longer matches
the source, its selection collects no test, or the run broke); the exit status is 1 unless
every one was CAUGHT.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("focus", "pointer", "search", "prefix", "recurrence", "hso", "nar")
CI_ROTATING = 8  # mutations per CI run besides those of the touched files

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
        'a disabled classifier still steers beam search',
        'gencraft/search/beam.py',
        'if clf is not None and not getattr(clf, "enabled", True):',
        'if False:',
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
        "    if lowercase:\n        return [p.lower() for p in outputs]",
        "    if False:\n        return [p.lower() for p in outputs]",
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
        'alpha in the final on_beam ranking',
        'gencraft/search/beam.py',
        '        rank = torch.where(self.forced[:, None], by_forced, slots.cond)',
        '        rank = torch.where(self.forced[:, None], by_forced, slots.key)',
        'tests/search/test_search.py -k alpha_steers',
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
        '"beam_log_prob": sequence_log_prob(model, p, pl.tokens),',
        '"beam_log_prob": pl.score,',
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
        'Alg. 1 picks slots by model score, not the selection score',
        'gencraft/search/beam.py',
        '                cand.sel.masked_fill(~live, float("-inf")),',
        '                cand.score.masked_fill(~live, float("-inf")),',
        'tests/search',
    ),
    (
        'a complete slot on the beam is continued',
        'gencraft/search/beam.py',
        '        live = ~slots.done.gather(1, cand.beam)',
        '        live = torch.ones_like(cand.beam, dtype=torch.bool)',
        'tests/search',
    ),
    (
        "fit validates without resetting the running training loss",
        "gencraft/training/fit.py",
        "        st.running, st.running_n = 0.0, 0\n        value = None",
        "        value = None",
        "tests/training tests/test_methods.py",
    ),
    (
        "greedy AR decoding scores the processed logits",
        "gencraft/nar/decoding.py",
        "torch.stack(gen.logits, 1)[i]",
        "torch.stack(gen.scores, 1)[i]",
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
    # -- issue 26 §1: TruncSA causality
    (
        "TruncSA sums over all queries on a causal stack",
        "gencraft/prefix/attention.py",
        '        if not call.autoregressive:\n            return {"query_mask": query_mask}',
        '        if True:\n            return {"query_mask": query_mask}',
        "tests/prefix/test_prefix_causality.py -k 'later_tokens and truncsa'",
    ),
    (
        "causal TruncSA's column mass not carried between decoding steps",
        "gencraft/prefix/attention.py",
        '            store[_site_key(call)] = trunc["mass_out"]["last"]',
        "            pass",
        "tests/prefix/test_prefix_causality.py -k 'cached_greedy and truncsa'",
    ),
    (
        "the row state does not follow the beams",
        "gencraft/models/stepping.py",
        "            self.row_state[k] = v.index_select(0, beam_idx.to(v.device))",
        "            pass",
        "tests/prefix/test_prefix_causality.py -k beam_scores",
    ),
    (
        "causal column mass as one sum over all queries",
        "gencraft/prefix/functional.py",
        "    mass = weights.cumsum(dim=-2)",
        "    mass = weights.sum(dim=-2, keepdim=True).expand_as(weights)",
        "tests/prefix/test_prefix_causality.py -k column_mass_is_a_prefix_sum",
    ),
    # -- issue 26 §2: the eight that survived
    (
        "encoder-decoder decoder segments from labels not shifted",
        "gencraft/prefix/model.py",
        "        shifted = torch.cat([seg.new_zeros(seg.shape[0], 1), seg[:, :-1]], dim=1)",
        "        shifted = seg",
        "tests/prefix/test_prefix_model.py -k shifted_right",
    ),
    (
        "TruncSA counts padding queries",
        "gencraft/prefix/attention.py",
        '        if call.site.kind == "self" and t <= k - p:',
        "        if False:",
        "tests/prefix/test_prefix_model.py -k padding_queries",
    ),
    (
        "sparse_stack auto is the decoder of an encoder-decoder",
        "gencraft/prefix/config.py",
        '            "auto": {"encoder"},',
        '            "auto": {"decoder"},',
        "tests/prefix/test_prefix_model.py -k auto_sparse_stack",
    ),
    (
        "FLOPs/token without the attention term",
        "gencraft/recurrence/evaluate.py",
        "    per_window = 2 * weights * window + 2 * shape.layers * window**2 * shape.hidden",
        "    per_window = 2 * weights * window",
        "tests/recurrence/test_recurrence_model.py -k flops",
    ),
    (
        "dynamic evaluation does not reset the weights at a new context",
        "gencraft/hso/dynamic.py",
        "            if t == c0:  # a new context",
        "            if t == 0:  # a new context",
        "tests/hso/test_hso.py -k resets_the_weights",
    ),
    (
        "Mask-Predict re-masks the most confident tokens",
        "gencraft/nar/decoding.py",
        "    rank = logp.masked_fill(~mask, torch.inf).argsort(dim=1, stable=True).argsort(dim=1)",
        "    rank = (-logp).masked_fill(~mask, torch.inf).argsort(dim=1, stable=True).argsort(dim=1)",
        "tests/nar/test_nar.py -k remasks",
    ),
    (
        "SUNDAE reranking keeps the worst sample",
        "gencraft/nar/decoding.py",
        "    return int(scores.argmax()), scores",
        "    return int(scores.argmin()), scores",
        "tests/nar/test_nar.py -k rerank_keeps",
    ),
    # -- issue 26 §7: beam search with several EOS ids
    (
        'beam search keeps 2B candidates whatever the number of EOS ids',
        'gencraft/search/beam.py',
        '        n_keep = min(max(2, 1 + len(self.eos)) * self.K, cand.sel.shape[1])',
        '        n_keep = min(2 * self.K, cand.sel.shape[1])',
        'tests/search/test_search.py -k several_eos',
    ),
    # -- issue 26 §3: four per method, the dispatcher, fit's resume
    (
        "recurrence pools without the softmax over layers",
        "gencraft/recurrence/model.py",
        "        w = torch.softmax(self.layer_logits.float(), dim=0)",
        "        w = self.layer_logits.float()",
        "tests/recurrence/test_recurrence_model.py -k pooling",
    ),
    (
        "recurrence mean pooling sums",
        "gencraft/recurrence/model.py",
        '        return z / n if self.config.pooling == "mean" else z',
        "        return z",
        "tests/recurrence/test_recurrence_model.py -k pooling",
    ),
    (
        "HSO's Adam without the second moment's bias correction",
        "gencraft/hso/functional.py",
        "    bc2 = (1 - b2**c).float()[:, None, :, None]",
        "    bc2 = torch.ones_like(c).float()[:, None, :, None]",
        "tests/hso/test_hso.py -k per_block_adam",
    ),
    (
        "HSO's SGD climbs the loss",
        'gencraft/hso/functional.py',
        '            x - cfg.lr * torch.where(on, g, 0).to(x.dtype)',
        '            x + cfg.lr * torch.where(on, g, 0).to(x.dtype)',
        'tests/hso/test_hso.py -k per_block_adam',
    ),
    (
        'HSO keeps the states across a context reset',
        'gencraft/hso/functional.py',
        '            if t == c0:\n                st = _States(len(rows), dev)',
        '            if t == 0:\n                st = _States(len(rows), dev)',
        "tests/hso/test_hso.py -k 'lr_zero or per_block_adam or prefill'",
    ),
    (
        "HSO's update reaches the gradient of the present states only",
        "gencraft/models/stepping.py",
        "        return super().update(key_states + dk, value_states + dv, *args, **kwargs)",
        "        return super().update(key_states + dk.detach(), value_states + dv, *args, **kwargs)",
        "tests/hso/test_hso.py -k per_block_adam",
    ),
    (
        "a fair coin's mode counts one tie too few",
        "gencraft/search/toy.py",
        "            return ToyMode((1,) * n, n * math.log(0.5), 2**n)",
        "            return ToyMode((1,) * n, n * math.log(0.5), 2**n - 1)",
        "tests/search/test_search_toy.py",
    ),
    (
        "dispatcher puts extra key columns after the real keys",
        "gencraft/models/attention.py",
        "        key = torch.cat([*(e.key for e in extras), key], dim=-2)",
        "        key = torch.cat([key, *(e.key for e in extras)], dim=-2)",
        "tests/models/test_attention.py -k extra_key_values_equal",
    ),
    (
        "dispatcher ignores the module's own attention scaling (T5: none)",
        "gencraft/models/attention.py",
        "    scale = scale if scale is not None else query.shape[-1] ** -0.5",
        "    scale = query.shape[-1] ** -0.5",
        "tests/models/test_attention.py",
    ),
    (
        "dispatcher reads an additive mask's blocked entries as allowed",
        "gencraft/models/attention.py",
        "        return m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2",
        "        return m if m.dtype == torch.bool else m <= 0",
        "tests/models/test_attention.py",
    ),
    (
        "dispatcher routes calls of inactive plug-ins",
        "gencraft/models/attention.py",
        "    live = [p for p in plugins if p.active(call)]",
        "    live = list(plugins)",
        "tests/models/test_attention.py",
    ),
    (
        "fit's resume forgets the optimiser state",
        "gencraft/training/fit.py",
        '        self.optimizer.load_state_dict(payload["optimizer"])',
        "        pass",
        "tests/training/test_training.py -k interrupt_then_resume",
    ),
    (
        "fit's resume forgets the weights",
        "gencraft/training/fit.py",
        '        load_trainable_state(self.raw, payload["model"], self.ckpt.path)',
        "        pass",
        "tests/training/test_training.py -k interrupt_then_resume",
    ),
    (
        "fit's resume forgets the random state",
        "gencraft/training/fit.py",
        '        self.pending_rng = payload["rng"]',
        "        self.pending_rng = None",
        "tests/training/test_training.py -k interrupt_then_resume",
    ),
    (
        "fit's resume restarts the step count",
        "gencraft/training/fit.py",
        '        self.st = _State(**payload["state"])',
        "        pass",
        "tests/training/test_training.py -k interrupt_then_resume",
    ),
    (
        "toy attribute-mode ties by exact float equality",
        "gencraft/search/toy.py",
        "        return min(a for a, p in dist.items() if math.isclose(p, best, rel_tol=1e-12))",
        "        return min(a for a, p in dist.items() if p == best)",
        "tests/search/test_search_toy.py -k closed_forms",
    ),
    # -- issue 26 §6: bad input
    (
        "a truncated run saved in the transformers format loads with a traceback",
        "gencraft/models/method.py",
        "    except Exception as err:  # e.g. a truncated file read by transformers' own loader",
        "    except ZeroDivisionError as err:",
        "tests/cli/test_bad_input.py -k truncated",
    ),
    (
        "a masked LM passes for a causal LM (HSO, RecurrentLM)",
        "gencraft/models/introspect.py",
        "    return name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) or bool(",
        "    return True or bool(",
        "tests/cli/test_bad_input.py -k 'kinds and hso'",
    ),
    (
        "prefix eval ignores --lowercase",
        "gencraft/prefix/evaluate.py",
        "    scores = score_task(task, outputs, refs, lowercase=lowercase)",
        "    scores = score_task(task, outputs, refs)",
        "tests/prefix/test_prefix_parts.py -k cli_train_resume",
    ),
    # issue 31: the user's stack
    (
        "attention sites: a wrapper module (BERT's attention) is kept over the inner one",
        "gencraft/models/attention.py",
        '    matched = [m for m in matched if not any(o.startswith(m[0] + ".") for o in names)]',
        "    matched = [m for m in matched if True]",
        "tests/models/test_attention.py -k innermost",
    ),
    (
        "an attention computed inline (GPT-J) is accepted",
        "gencraft/models/attention.py",
        "    inline = sorted({type(m).__name__ for _, m in found if not uses_registry(m)})",
        "    inline = []",
        "tests/test_architectures.py -k 'gptj or falcon'",
    ),
    (
        "Gemma-2's soft-cap ignored on gencraft's attention path",
        "gencraft/models/attention.py",
        "    if softcap:  # Gemma-2",
        "    if False:  # Gemma-2",
        "tests/models/test_attention.py -k softcap",
    ),
    (
        "OLMo-2's all-head k_norm applied per head",
        "gencraft/models/attention.py",
        "_norm_width(k_norm) == k.shape[-1] != d:",
        "_norm_width(k_norm) == -1:",
        "tests/test_architectures.py -k 'recurrence-olmo2'",
    ),
    (
        "Phi-3's fused projection reads the query slice as keys",
        "gencraft/models/attention.py",
        "        k, v = qkv[..., q_size : q_size + n_kv * d], qkv[..., q_size + n_kv * d :]",
        "        k, v = qkv[..., : n_kv * d], qkv[..., q_size + n_kv * d :]",
        "tests/models/test_attention.py -k project",
    ),
    (
        "FAME hooks the base_model body (OPT runs model.decoder)",
        "gencraft/models/introspect.py",
        "    if not isinstance(body, nn.Module) or body is hf:",
        "    if True:",
        "tests/test_architectures.py -k 'focus-opt'",
    ),
    (
        "the dispatcher guard never checks that a plug-in ran",
        "gencraft/models/attention.py",
        "        if self._count() == self._calls:",
        "        if False:",
        "tests/models/test_attention.py -k never_runs",
    ),
    (
        "SUNDAE's final token scores in the model's half precision",
        "gencraft/nar/decoding.py",
        "    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None])[..., 0]",
        "    lp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None])[..., 0].float()",
        "tests/nar/test_nar_batch.py -k float32",
    ),
    (
        "custom_generate reads every expanded row (beams) as an input",
        "gencraft/search/custom_generate.py",
        '    return max(beams, int(getattr(generation_config, "num_return_sequences", None) or 1))',
        "    return 1",
        "tests/test_custom_generate.py -k padded_batch",
    ),
    (
        "mixed precision not passed to accelerate",
        "gencraft/training/fit.py",
        "Accelerator(cpu=cpu, mixed_precision=mixed_precision, **kwargs)",
        "Accelerator(cpu=cpu, **kwargs)",
        "tests/training/test_training.py -k mixed_precision",
    ),
    (
        'HSO feeds its float32 states to a half-precision model uncast',
        'gencraft/hso/functional.py',
        't[..., :upto, :].detach().to(dtype).requires_grad_(grad) for t in self.kv',
        't[..., :upto, :].detach().requires_grad_(grad) for t in self.kv',
        'tests/test_precision.py -k hso',
    ),
    (
        "a missing extra raises a bare ImportError",
        "gencraft/extras.py",
        "    except ImportError as e:",
        "    except ModuleNotFoundError as e:\n        raise\n    except ImportError as e:",
        "tests/test_packaging.py -k missing_extra",
    ),
    (
        "enc-dec prefix labels left non-contiguous",
        "gencraft/prefix/model.py",
        "            labels = labels.contiguous()",
        "            pass",
        "tests/prefix/test_prefix_model.py -k non_contiguous",
    ),
    (
        "the CLI imports the training loop (torch) before parsing",
        "gencraft/cli/main.py",
        "from gencraft.errors import GencraftError, Interrupted\n",
        "from gencraft.errors import GencraftError, Interrupted\nimport gencraft.training.fit\n",
        "tests/cli/test_startup.py",
    ),
    (
        "a lazy package hides its exports from dir()",
        "gencraft/lazy.py",
        'sorted(set(vars(sys.modules[package])) - {"_lazy_where"} | set(where))',
        "sorted(vars(sys.modules[package]))",
        "tests/cli/test_startup.py",
    ),
    (
        "a command takes another method's run",
        "gencraft/training/run.py",
        "    if found is None or found == method:\n        return",
        "    return",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "a truncated config.json reaches transformers' loader",
        "gencraft/models/persistence.py",
        "            json.loads(f.read_text())\n",
        "            pass\n",
        'tests/cli/test_bad_input.py -k "first_contact or truncated_config"',
    ),
    (
        "a negative --limit is a Python slice",
        "gencraft/cli/options.py",
        "        positive(self, *counts, allow_none=True)",
        "        pass",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "--num-beams 0 reaches beam search",
        "gencraft/cli/options.py",
        '        positive(self, "num_beams", allow_none=True)',
        "        pass",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "windowed_nll runs a window past the model's positions",
        "gencraft/metrics/lm.py",
        '    check_positions(model, min(window, ids.numel() - 1), "window")\n',
        "",
        "tests/cli/test_bad_input.py -k windowed",
    ),
    (
        "hso eval scores the baseline before checking its contexts",
        "gencraft/cli/hso.py",
        "    contexts(ids.numel() - 1, cfg.reset_every, model)  # refuses contexts past the positions\n",
        "",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "an encoder samples a classifier's training data",
        "gencraft/search/train.py",
        '    check_generator(model, "a classifier\'s training data")\n',
        "",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "a classifier steers a model it was not trained on",
        "gencraft/search/classifier.py",
        "        if not same:\n            raise GencraftError(\n                f\"this classifier was trained on the hidden",
        "        if False:\n            raise GencraftError(\n                f\"this classifier was trained on the hidden",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "nar decoding ignores flags of another method",
        "gencraft/nar/evaluate.py",
        "        if f.name not in READS[method]\n",
        "        if False\n",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "reproduce writes into an existing file",
        "gencraft/experiments.py",
        "    if out.exists() and not out.is_dir():",
        "    if False:",
        "tests/cli/test_reproduce.py -k python_api_refuses",
    ),
    (
        "prefix generate takes an empty --source",
        "gencraft/cli/prefix.py",
        "        empty = [str(i + 1) for i, s in enumerate(args.source) if not s.strip()]",
        "        empty = []",
        "tests/cli/test_bad_input.py -k first_contact",
    ),
    (
        "reproduce --list NAME ignores NAME",
        "gencraft/cli/reproduce.py",
        "    if args.list and args.name:  # one experiment: its settings at each scale",
        "    if False:",
        "tests/cli/test_bad_input.py -k reproduce_list",
    ),
    (
        "an optional choice shows Python's None",
        "gencraft/cli/flags.py",
        '    default = "none" if default is None else default  # what the flag reads back\n',
        "",
        "tests/cli/test_bad_input.py -k help_texts",
    ),
    (
        "fit's resume drops the training loss since the last validation",
        "gencraft/training/fit.py",
        '        self.st = _State(**payload["state"])',
        '        self.st = _State(**{**payload["state"], "running": 0.0, "running_n": 0})',
        "tests/training/test_training.py -k whole_interval",
    ),
    (
        "fit's resume counts only the last invocation's wall time",
        "gencraft/training/fit.py",
        "        self.earlier_wall = self.st.wall_time\n",
        "",
        "tests/training/test_training.py -k whole_interval",
    ),
    (
        "the schedule counts batches, not optimizer steps",
        "gencraft/training/fit.py",
        "steps_per_epoch = max(1, math.ceil(len(self.loader) / cfg.grad_accum))",
        "steps_per_epoch = max(1, len(self.loader))",
        "tests/training/test_training.py -k schedule_ends",
    ),
    (
        "the plateau rule halves whenever there is no new best",
        "gencraft/training/schedules.py",
        "        decay_lr = value > self.previous",
        "        decay_lr = not improved",
        "tests/training/test_training.py -k plateau",
    ),
    (
        "the pointer trainer writes no last/",
        "gencraft/pointer/train.py",
        '            save_directory(self.raw_model.save_pretrained, self.output_dir / "last")',
        "            pass",
        "tests/pointer/test_pointer_model.py -k run_format",
    ),
    (
        "the pointer trainer's wall time forgets the earlier invocation",
        "gencraft/pointer/train.py",
        "        self.earlier_wall = self.wall_time\n",
        "",
        "tests/pointer/test_pointer_model.py -k run_format",
    ),
    (
        "prefix train defaults to the paper's 5e-5 for prefixes without the MLP",
        "gencraft/prefix/config.py",
        "        return PREFIX_LR if direct else PAPER_LR",
        "        return PAPER_LR",
        "tests/prefix/test_prefix_parts.py -k learning_rate",
    ),
    (
        "progress bars redraw with carriage returns in a log file",
        "gencraft/progress.py",
        "        self._plain = not notebook and not _is_terminal(stream)",
        "        self._plain = False",
        "tests/test_progress.py",
    ),
    (
        "plain progress lines keep their carriage returns",
        "gencraft/progress.py",
        '        line = text.replace("\\r", "").rstrip()',
        "        line = text.rstrip()",
        "tests/test_progress.py",
    ),
    (
        "heat maps on a linear scale whatever their range",
        "gencraft/plotting.py",
        "    log = positive.size > 0 and v.min() >= 0 and positive.max() > 100 * positive.min()",
        "    log = False",
        "tests/test_plots.py",
    ),
    (
        "heat maps without a colorbar",
        "gencraft/plotting.py",
        "    fig.colorbar(image, ax=ax, label=f\"{label}{' (log scale)' if log else ''}\", pad=0.01)\n",
        "",
        "tests/test_plots.py",
    ),
    (
        "the gate plot divides by 1 - g (blank when g is 1)",
        "gencraft/pointer/analysis.py",
        "    att = att / att.sum(1, keepdim=True).clamp_min(1e-300)  # = a_i / (1 - g), in the window",
        "    att = att / (1.0 - view.gate.double()).clamp_min(1e-6).unsqueeze(1)",
        "tests/test_plots.py",
    ),
    (
        "integer axes get fractional ticks",
        "gencraft/plotting.py",
        "    axis.set_major_locator(MaxNLocator(integer=True))",
        "    pass",
        "tests/test_plots.py",
    ),
    (
        "a plot's title is the run's path",
        "gencraft/cli/prefix.py",
        '    return f"{d.parent.name}/{d.name}" if d.name in ("best", "last") else d.name',
        "    return str(d)",
        "tests/test_plots.py",
    ),
    (
        "the local split returns examples in hash order",
        "gencraft/data/summarization.py",
        "    return sorted(order[lo:hi])",
        "    return order[lo:hi]",
        "tests/data/test_data_text.py -k file_order",
    ),
    (
        "equal-frequency words in alphabetical order",
        "gencraft/data/lm.py",
        "ordered = sorted(counter.items(), key=lambda kv: -kv[1])",
        "ordered = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))",
        "tests/data/test_data_lm.py",
    ),
    (
        "a corpus without a final newline loses its last line",
        "gencraft/data/lm.py",
        '    if lines and lines[-1] == "":',
        "    if lines:",
        "tests/data/test_data_lm.py -k final_newline",
    ),
    (
        "NIST's order cut to the shortest output",
        "gencraft/metrics/data2text.py",
        "    n = min(n, max(len(h) for h in hyps))",
        "    n = min(n, min(len(h) for h in hyps))",
        "tests/metrics/test_score_task.py -k nist_keeps",
    ),
    (
        "the end probability is the first EOS id's",
        "gencraft/models/stepping.py",
        "        total += float(torch.logsumexp(out.log_probs[0, eos].double(), dim=0))",
        "        total += float(out.log_probs[0, eos[0]])",
        "tests/search/test_search.py -k several_eos",
    ),
    (
        "forced-EOS scoring takes the first EOS id's probability",
        'gencraft/search/beam.py',
        '                torch.logsumexp(logp[:, self.eos], dim=-1) if self.cfg.forced_eos == "model" else 0',
        '                logp[:, self.eos[0]] if self.cfg.forced_eos == "model" else 0',
        'tests/search/test_search.py -k several_eos',
    ),
    (
        "prefix groups of ceil(P/S) columns (the last segment short or empty)",
        "gencraft/prefix/functional.py",
        "    for g, cols in enumerate(torch.arange(p).tensor_split(s)):",
        "    for g, cols in enumerate(torch.arange(p).split(-(-p // s))):",
        "tests/prefix/test_prefix_functional.py -k multiple_of_s",
    ),
    (
        "UniBlock's tables tiled across beams instead of repeated per example",
        "gencraft/prefix/attention.py",
        "    return table.repeat_interleave(n // b, dim=0)",
        "    return table.repeat(n // b, 1, 1)",
        "tests/prefix/test_prefix_model.py -k 'own_examples or row_order'",
    ),
    (
        "the pointer head scores -100 labels",
        "gencraft/pointer/head.py",
        "        scored = (target != -100) & valid[:, :-1]  # no prediction from a padding position",
        "        scored = valid[:, :-1]",
        "tests/pointer/test_pointer_head.py -k minus_100",
    ),
    (
        "the pointer head's loss divides by every position",
        "gencraft/pointer/head.py",
        "            loss = nll.sum() / scored.sum()",
        "            loss = nll.sum() / nll.numel()",
        "tests/pointer/test_pointer_head.py -k minus_100",
    ),
    (
        "a frozen unnamed recurrence base is not saved",
        "gencraft/recurrence/model.py",
        "            save_base = self.config.train_base or not base_name_or_path",
        "            save_base = self.config.train_base",
        "tests/recurrence/test_recurrence_model.py -k unnamed",
    ),
    (
        "the recurrence FFN has an activation after its last layer",
        "gencraft/recurrence/model.py",
        "            if i < len(widths) - 2:\n                parts.append(_ACT[self.config.activation]())",
        "            parts.append(_ACT[self.config.activation]())",
        "tests/recurrence/test_recurrence_model.py -k ends_on",
    ),
    (
        "the length predictor pools padding too",
        "gencraft/nar/model.py",
        "            pooled = (encoder_hidden * m).sum(1) / m.sum(1).clamp_min(1.0)",
        "            pooled = encoder_hidden.mean(1)",
        "tests/nar/test_nar.py -k real_source",
    ),
    (
        "Mask-Predict ranks length candidates by summed log-probability",
        "gencraft/nar/decoding.py",
        "    scores = ((logp * mask).sum(1) / mask.sum(1)).view(b, k)",
        "    scores = (logp * mask).sum(1).view(b, k)",
        "tests/nar/test_nar.py -k mean_log_probability",
    ),
    (
        "the autoregressive baseline's EOS over the last word",
        "gencraft/nar/functional.py",
        '    labels[torch.arange(b), batch["lengths"]] = end_id',
        '    labels[torch.arange(b), batch["lengths"] - 1] = end_id',
        "tests/nar/test_nar.py -k after_the_last",
    ),
    (
        "labels padded with 0 (scored as a token)",
        "gencraft/models/prompts.py",
        'FILL = {"labels": -100}',
        'FILL = {"labels": 0}',
        "tests/models/test_models.py -k one_pad_rule",
    ),
    # -- issue 36: batched search ----------------------------------------------------------
    (
        "batched beams read row 0's cache",
        "gencraft/search/beam.py",
        "        flat = (torch.arange(b, device=src.device)[:, None] * kb + src).view(-1)",
        "        flat = (0 * torch.arange(b, device=src.device)[:, None] * kb + src).view(-1)",
        "tests/search/test_batch.py -k row_alone",
    ),
    (
        "the first step's rows are copied across inputs",
        'gencraft/search/beam.py',
        '            log_probs=out.log_probs.repeat_interleave(self.K, 0),',
        '            log_probs=out.log_probs.repeat(self.K, 1),',
        'tests/search/test_batch.py -k row_alone',
    ),
    (
        "padded prompts take the default positions",
        "gencraft/models/stepping.py",
        '            kw["position_ids"] = pos[:, -t:]',
        "            pos = pos",
        "tests/search/test_batch.py -k row_alone",
    ),
    (
        "a prompt's padding is attended",
        "gencraft/models/stepping.py",
        "        mask = torch.cat([prompt, ones], dim=1)",
        "        mask = torch.cat([prompt, ones], dim=1).clamp_min(1)",
        "tests/search/test_batch.py -k row_alone",
    ),
    (
        "a source's padding is attended by the decoder",
        "gencraft/models/stepping.py",
        "                attention_mask=mask,\n                decoder_input_ids=tokens,",
        "                attention_mask=torch.ones_like(mask),\n                decoder_input_ids=tokens,",
        "tests/search/test_batch.py -k row_alone",
    ),
    (
        "the processors' ids mix the rows' prompts",
        "gencraft/models/stepping.py",
        "prefix.repeat_interleave(n // b, dim=0)",
        "prefix.repeat(n // b, 1)",
        "tests/search/test_batch.py -k from_generate",
    ),
    (
        "custom_generate fills finished rows with pad id 0, not generate's EOS",
        "gencraft/search/custom_generate.py",
        "    fill = pad or eos[0]",
        "    fill = pad",
        "tests/search/test_batch.py -k from_generate",
    ),
    (
        'custom_generate gives sequences_scores that generate does not',
        'gencraft/search/custom_generate.py',
        '    scores = out.sequence_score if getattr(generation_config, "output_scores", False) else None',
        '    scores = out.sequence_score',
        'tests/search/test_batch.py -k output_scores',
    ),
    (
        "ragged exact steps attend to the caches' padding",
        "gencraft/models/stepping.py",
        "                mask = (cols[None, :] >= (width - have)[:, None]).long()",
        "                mask = (cols[None, :] >= 0).long()",
        "tests/search/test_batch.py -k exact_search_equals_the_row",
    ),
    (
        "ragged exact steps take the padded position",
        "gencraft/models/stepping.py",
        '                masks = {"attention_mask": mask, "position_ids": have[:, None]}',
        '                masks = {"attention_mask": mask, "position_ids": have[:, None] * 0 + width}',
        "tests/search/test_batch.py -k exact_search_equals_the_row",
    ),
    (
        "split keeps a prompt's padding in its cache",
        "gencraft/models/stepping.py",
        "                    k[i : i + 1, :, -n:] if n else k[i : i + 1],\n"
        "                    v[i : i + 1, :, -n:] if n else v[i : i + 1],",
        "                    k[i : i + 1],\n                    v[i : i + 1],",
        "tests/search/test_batch.py -k exact_search_equals_the_row",
    ),
    (
        "batched exact search's processors see row 0",
        "gencraft/search/exact.py",
        "        return out[self.r : self.r + 1]",
        "        return out[0:1]",
        "tests/search/test_batch.py -k row_dependent",
    ),
    (
        "FAME's source does not follow a batch's rows",
        "gencraft/focus/model.py",
        "        if rows > docs and rows % docs == 0:",
        "        if rows > docs and docs == 1:",
        "tests/test_methods.py -k 'Focus and batched'",
    ),
    (
        "the pointer window reads a batch's padding",
        "gencraft/pointer/head.py",
        "        valid = attention_mask.bool() if attention_mask is not None else None",
        "        valid = None",
        "tests/test_methods.py -k 'PointerHead and batched'",
    ),
    (
        "a SUNDAE row's seed reads its padding",
        'gencraft/nar/decoding.py',
        'row_seed(seed, src[r][src_mask[r].bool()].tolist())',
        'row_seed(seed, src[r].tolist())',
        'tests/nar/test_nar_batch.py -k any_batch',
    ),
    (
        "a SUNDAE row's draws span the batch's width",
        'gencraft/nar/decoding.py',
        '                w = self.widths[r]',
        '                w = self.tokens.shape[1]',
        'tests/nar/test_nar_batch.py -k any_batch',
    ),
    (
        "a finished Mask-Predict row keeps iterating",
        "gencraft/nar/decoding.py",
        "        running &= n_mask.view(b, k).amax(1) > 0",
        "        running &= n_mask.view(b, k).amax(1) >= 0",
        "tests/nar/test_nar_batch.py -k own_rule",
    ),
    (
        "Mask-Predict's candidates belong to the wrong rows",
        "gencraft/nar/decoding.py",
        "    owner = torch.arange(b, device=dev).repeat_interleave(k)",
        "    owner = torch.arange(b, device=dev).repeat(k)",
        "tests/nar/test_nar_batch.py -k mask_predict",
    ),
    (
        'the batched greedy baseline scores its padding',
        'gencraft/nar/decoding.py',
        '        own = int(ends[0]) + 1 if ends.numel() else made.shape[0]',
        '        own = made.shape[0]',
        'tests/nar/test_nar_batch.py -k autoregressive',
    ),
    (
        'padding enters the batched HSO loss',
        'gencraft/hso/functional.py',
        '            loss = (nll * real).sum()',
        '            loss = nll.sum()',
        'tests/hso/test_hso_batch.py -k prefill',
    ),
    (
        'a row whose text has ended keeps taking HSO updates',
        'gencraft/hso/functional.py',
        '    upd = held & real.any(1)[:, None]',
        '    upd = held.clone()',
        'tests/hso/test_hso_batch.py -k prefill',
    ),
    (
        "batched HSO reads a row with its padding",
        "gencraft/hso/functional.py",
        '        rows.append(check_causal_lm(model, ids[b][keep], what=f"{what} (row {b})"))',
        '        rows.append(check_causal_lm(model, ids[b], what=f"{what} (row {b})"))',
        "tests/hso/test_hso_batch.py -k alone",
    ),
    (
        "batched prefill puts a short prompt's states at the start",
        "gencraft/hso/functional.py",
        "                out[i, :, width - n :] = t[i, :, :n]",
        "                out[i, :, :n] = t[i, :, :n]",
        "tests/hso/test_hso_batch.py -k prefill",
    ),
    (
        "hso_nll's batched contexts lose their last target",
        "gencraft/hso/functional.py",
        "    rows = [ids[c0 : c1 + 1] for c0, c1 in ranges]",
        "    rows = [ids[c0 : c1 + 1].clone() for c0, c1 in ranges[:1]] + [ids[c0 + 1 : c1 + 1] for c0, c1 in ranges[1:]]",
        "tests/hso/test_hso_batch.py -k contexts",
    ),
    (
        "batched few-shot HSO feeds the last token without its states",
        "gencraft/hso/fewshot.py",
        "            logp = stepper.step(ids[:, -1], cache).log_probs",
        "            logp = stepper.start().log_probs",
        "tests/hso/test_hso_batch.py -k few_shot",
    ),
    (
        "every row stops at the batch's longest limit",
        'gencraft/search/beam.py',
        '        ends = torch.isin(top.token, self.eos) | (t + 1 == self.limit)[:, None]',
        '        ends = torch.isin(top.token, self.eos) | (t + 1 == self.limit.max())',
        'tests/search/test_batch.py -k own_length',
    ),
    (
        "every row is forced to the batch's longest length",
        'gencraft/search/beam.py',
        '        only_eos = (self.forced & (t >= self.force)) | self._last_step(t)',
        '        only_eos = (self.forced & (t >= self.force.max())) | self._last_step(t)',
        'tests/search/test_batch.py -k own_length',
    ),
    (
        "batched windows all read the first window's logits",
        "gencraft/metrics/lm.py",
        "                rows = logits[i, w.first - 1 - w.start : w.end - w.start].float()",
        "                rows = logits[0, w.first - 1 - w.start : w.end - w.start].float()",
        "tests/metrics/test_windowed_nll.py -k batched",
    ),
    # -- issue 37: your data, your models, your machines ----------------------------------
    (
        "own task rows are not grouped by source",
        "gencraft/data/own.py",
        "        if source not in grouped:\n",
        "        if True:\n",
        "tests/data/test_own_data.py -k group",
    ),
    (
        "own task errors do not name the line",
        "gencraft/data/own.py",
        'f"{path}, line {lineno}: no field {name!r}',
        'f"{path}: no field {name!r}',
        "tests/data/test_own_data.py -k errors_name",
    ),
    (
        "a folder's split files are not told apart",
        "gencraft/data/own.py",
        '        return {s: split_file(path, s, (".txt",), "a corpus") for s in splits}',
        '        return {s: split_file(path, "train", (".txt",), "a corpus") for s in splits}',
        "tests/data/test_own_data.py -k unseen_words",
    ),
    (
        "own corpora have no <unk>",
        "gencraft/data/lm.py",
        "    if own and UNK not in vocab.stoi:",
        "    if False:",
        "tests/data/test_own_data.py -k corpora",
    ),
    (
        "a task path is recorded as typed",
        "gencraft/config.py",
        "    return canonical_spec(task, names)",
        "    return task",
        "tests/cli/test_your_data_and_machines.py -k prefix_and_nar",
    ),
    (
        "eval ignores the run's own-data fields",
        "gencraft/cli/options.py",
        "getattr(args, name, None) or recorded.get(name) or default",
        "getattr(args, name, None) or default",
        "tests/cli/test_your_data_and_machines.py -k prefix_and_nar",
    ),
    (
        "a bad device string is not checked",
        "gencraft/models/placement.py",
        "        dev = torch.device(device)\n    except (RuntimeError, TypeError, ValueError):",
        '        dev = torch.device("cpu")\n    except (RuntimeError, TypeError, ValueError):',
        "tests/cli/test_your_data_and_machines.py -k 'bad_device and gpu0'",
    ),
    (
        "float16 on a CPU passes",
        "gencraft/models/placement.py",
        '    if value is torch.float16 and device.type == "cpu":',
        "    if False:",
        "tests/cli/test_your_data_and_machines.py -k 'bad_device and float16'",
    ),
    (
        "--dtype is not applied to the weights",
        "gencraft/models/registry.py",
        "    if dtype is not None:\n        model = model.to(dtype)\n    if device is not None:",
        "    if device is not None:",
        "tests/cli/test_your_data_and_machines.py -k dtype_loads",
    ),
    (
        "a base path is recorded relative",
        "gencraft/models/registry.py",
        "    return str(path.resolve()) if path.exists() else name",
        "    return name",
        "tests/cli/test_your_data_and_machines.py -k any_folder",
    ),
    (
        "--base is ignored",
        "gencraft/prefix/model.py",
        "            name = base or recorded\n",
        "            name = recorded\n",
        "tests/cli/test_your_data_and_machines.py -k any_folder",
    ),
    (
        "the classifier compares names only",
        "gencraft/search/classifier.py",
        "            same = recorded == fingerprint(model)",
        "            same = trained == given",
        "tests/cli/test_your_data_and_machines.py -k classifier_check",
    ),
    (
        "outputs are not checked before work",
        "gencraft/cli/options.py",
        '    if kind == "dir" and p.exists() and not p.is_dir():',
        "    if False:",
        "tests/cli/test_your_data_and_machines.py -k outputs_are_checked",
    ),
    (
        "a too-long causal source is not cut",
        "gencraft/models/introspect.py",
        "    if ctx is None or reserve + source + target <= ctx:",
        "    if ctx is None or source + target <= ctx:",
        "tests/cli/test_your_data_and_machines.py -k source_budget",
    ),
    (
        "generate --output is written only at the end",
        "gencraft/prefix/evaluate.py",
        "        if on_batch is not None:\n            on_batch(len(outs), texts)\n        outs += texts",
        "        outs += texts",
        "tests/cli/test_your_data_and_machines.py -k interrupted_generate",
    ),
    (
        "a changed nested setting prints the whole dict",
        "gencraft/training/checkpoint.py",
        "        if isinstance(value, dict) and value:",
        "        if False:",
        "tests/cli/test_your_data_and_machines.py -k changed_setting",
    ),
    (
        "an unknown flag prints the top-level usage",
        "gencraft/cli/main.py",
        "            if sub is not None:\n                return _chosen(sub, args)",
        "            if sub is not None:\n                return parser",
        "tests/cli/test_your_data_and_machines.py -k subcommand_flag",
    ),
    (
        "the resume command under a launcher starts the module alone",
        "gencraft/training/checkpoint.py",
        '        head = [*launch, "-m", "gencraft"] if ours else [*launch, argv[0]]',
        '        head = ["gencraft"] if ours else [*launch, argv[0]]',
        "tests/cli/test_your_data_and_machines.py -k resume_command",
    ),
    (
        "the pointer mixture runs in the input's half dtype",
        'gencraft/pointer/functional.py',
        '    dtype = torch.promote_types(vocab_logits.dtype, torch.float32)\n    log_attn, log_gate = _log_attention(',
        '    dtype = vocab_logits.dtype\n    log_attn, log_gate = _log_attention(',
        'tests/test_islands_and_scales.py -k pointer_mixture',
    ),
    (
        'NAR length log-probabilities in half precision',
        'gencraft/nar/decoding.py',
        '    logp = torch.log_softmax(model.length_logits(enc_hidden, attention_mask).float(), dim=-1)',
        '    logp = torch.log_softmax(model.length_logits(enc_hidden, attention_mask), dim=-1)',
        'tests/test_islands_and_scales.py -k length_candidates',
    ),
    (
        'recurrence window logits in half precision',
        'gencraft/recurrence/model.py',
        '        rows = out.logits[:, offset : offset + targets.shape[1]].float()',
        '        rows = out.logits[:, offset : offset + targets.shape[1]]',
        'tests/test_islands_and_scales.py -k recurrence_window',
    ),
    (
        'the pointer LSTM is rounded to half precision',
        'gencraft/pointer/rnn.py',
        '                p.data = old.to(device=p.device, dtype=keep or torch.float32)',
        '                p.data = p.data.float()',
        'tests/test_islands_and_scales.py -k pointer_lstm',
    ),
    (
        'the pointer LSTM runs under autocast',
        'gencraft/pointer/rnn.py',
        '        with torch.autocast(x.device.type, enabled=False):\n            x = x.to(run)',
        '        with torch.autocast(x.device.type):\n            x = x.to(run)',
        "tests/test_islands_and_scales.py -k 'pointer_lstm or bf16_mixed'",
    ),
    (
        'negative values get a log scale',
        'gencraft/plotting.py',
        '    log = positive.size > 0 and v.min() >= 0 and positive.max() > 100 * positive.min()',
        '    log = positive.size > 0 and positive.max() > 100 * positive.min()',
        'tests/test_islands_and_scales.py -k heatmap',
    ),
    (
        'the log floor is six decades down',
        'gencraft/plotting.py',
        '        floor = max(float(positive.min()), float(positive.max()) * 1e-4)',
        '        floor = max(float(positive.min()), float(positive.max()) * 1e-6)',
        'tests/test_islands_and_scales.py -k heatmap',
    ),
    (
        'a fractional progress period is truncated',
        'gencraft/progress.py',
        '        value = float(os.environ.get("GENCRAFT_PROGRESS_SECONDS", PLAIN_SECONDS))',
        '        value = int(float(os.environ.get("GENCRAFT_PROGRESS_SECONDS", PLAIN_SECONDS)))',
        'tests/test_islands_and_scales.py -k fractional',
    ),
    (
        'postfix updates redraw a plain bar',
        'gencraft/progress.py',
        '        super().set_postfix(ordered_dict, refresh=refresh and not self._plain, **kwargs)',
        '        super().set_postfix(ordered_dict, refresh=refresh, **kwargs)',
        'tests/test_islands_and_scales.py -k postfix',
    ),
    (
        "transformers' loading bars stay on",
        'gencraft/models/registry.py',
        '        with hf_bars_off():  # transformers\' "Loading weights" bars (GENCRAFT_HF_PROGRESS=1)\n',
        '        if True:\n',
        'tests/test_islands_and_scales.py -k loading_bars',
    ),
    (
        'a prefix layer index n wraps to 0',
        'gencraft/prefix/config.py',
        '    bad = [i for i in spec if not -num_layers <= int(i) < num_layers]',
        '    bad = [i for i in spec if not -num_layers <= int(i) <= num_layers]',
        'tests/test_unlisted_behaviours.py -k prefix_layer_sets',
    ),
    (
        'an attention layer index n wraps to 0',
        'gencraft/models/attention.py',
        '            bad = [i for i in layers if not -n <= i < n]',
        '            bad = [i for i in layers if not -n <= i <= n]',
        'tests/test_unlisted_behaviours.py -k attention_sites_by_layer',
    ),
    (
        'recurrence takes insert_layer = layers',
        'gencraft/recurrence/model.py',
        '        if not 0 <= self.config.insert_layer < shape.layers:',
        '        if not 0 <= self.config.insert_layer <= shape.layers:',
        'tests/test_unlisted_behaviours.py -k insert_layer',
    ),
    (
        'windowed_nll checks the window size, not the tokens it feeds',
        'gencraft/metrics/lm.py',
        '    check_positions(model, min(window, ids.numel() - 1), "window")',
        '    check_positions(model, window, "window")',
        'tests/test_unlisted_behaviours.py -k position_limit',
    ),
    (
        'windowed_nll refuses a window as long as the positions',
        'gencraft/metrics/lm.py',
        '        limit is None or inputs <= limit,',
        '        limit is None or inputs < limit,',
        'tests/test_unlisted_behaviours.py -k position_limit',
    ),
    (
        'model_shape derives head_dim from hidden/heads',
        'gencraft/models/introspect.py',
        '    head_dim = _first(cfg, "head_dim", "d_kv") or hidden // heads',
        '    head_dim = hidden // heads',
        'tests/test_unlisted_behaviours.py -k head_dim',
    ),
    (
        'eos_ids prefers config over generation_config',
        'gencraft/models/introspect.py',
        '        eos_token_id = getattr(gc, "eos_token_id", None)\n        if eos_token_id is None:\n            eos_token_id = getattr(m.config, "eos_token_id", None)',
        '        eos_token_id = getattr(m.config, "eos_token_id", None)\n        if eos_token_id is None:\n            eos_token_id = getattr(gc, "eos_token_id", None)',
        'tests/test_unlisted_behaviours.py -k prefer_the_generation',
    ),
    (
        'tiny architectures ignore their seed',
        'gencraft/models/architectures.py',
        '    with torch.random.fork_rng(devices=[]):\n        torch.manual_seed(seed)\n        if name == "bert2bert":',
        '    with torch.random.fork_rng(devices=[]):\n        torch.manual_seed(0)\n        if name == "bert2bert":',
        'tests/test_unlisted_behaviours.py -k differ_by_seed',
    ),
    (
        'only config.json is checked for damage',
        'gencraft/models/persistence.py',
        '    for f in sorted(directory.glob("*.json")):',
        '    for f in sorted(directory.glob("config.json")):',
        'tests/test_unlisted_behaviours.py -k damaged_json',
    ),
    (
        'a resume on another device is refused',
        'gencraft/training/checkpoint.py',
        'RESUMABLE = ("max_steps", "max_time", "epochs", "max_epochs", "save_every", "device")',
        'RESUMABLE = ("max_steps", "max_time", "epochs", "max_epochs", "save_every")',
        'tests/test_unlisted_behaviours.py -k resume_may_change',
    ),
    (
        'history rows count whole epochs',
        'gencraft/training/fit.py',
        '            "epoch": round(st.epoch + st.batch_in_epoch / max(1, len(self.loader)), 4),',
        '            "epoch": st.epoch,',
        'tests/test_unlisted_behaviours.py -k fractional_epochs',
    ),
    (
        'save_every is never reached',
        'gencraft/training/fit.py',
        '                self.acc, [guard.requested, since_save > self.cfg.save_every]',
        '                self.acc, [guard.requested, since_save > 1e9 * self.cfg.save_every]',
        'tests/test_unlisted_behaviours.py -k counts_seconds',
    ),
    (
        'the global batch forgets the processes',
        'gencraft/training/fit.py',
        '        return self.cfg.batch_size * self.cfg.grad_accum * self.acc.num_processes',
        '        return self.cfg.batch_size * self.cfg.grad_accum',
        'tests/cli/test_your_data_and_machines.py -k two_processes',
    ),
    (
        'every process prints the header',
        'gencraft/cli/options.py',
        '    if world_rank() == 0:\n        print(*parts, flush=True)',
        '    if True:\n        print(*parts, flush=True)',
        'tests/cli/test_your_data_and_machines.py -k two_processes',
    ),
    (
        'a resume on fewer processes keeps the batch position',
        'gencraft/training/fit.py',
        '        st.batch_in_epoch = seen // (self.cfg.batch_size * now)',
        '        st.batch_in_epoch = st.batch_in_epoch',
        'tests/cli/test_your_data_and_machines.py -k two_processes',
    ),
    (
        'custom_generate appends the first EOS whichever ended',
        'gencraft/search/custom_generate.py',
        '    generated = torch.where(is_end, out.eos[:, None], generated)',
        '    generated = torch.where(is_end, eos[0], generated)',
        'tests/search/test_batch.py -k from_generate_equals_generate',
    ),
    (
        'custom_generate beam drops length_includes_eos',
        'gencraft/search/custom_generate.py',
        '        "length_includes_eos": length_includes_eos,',
        '        "length_includes_eos": False,',
        'tests/test_custom_generate.py -k length_includes',
    ),
    (
        'a multi-query c_attn is split as if it had three equal parts',
        'gencraft/models/attention.py',
        '        if not split or fused.shape[-1] != 3 * split:',
        '        if False:',
        'tests/test_unlisted_behaviours.py -k multi_query',
    ),
    (
        'a refusal to attach names no architecture',
        'gencraft/models/attention.py',
        '            f"{architecture(model)}: no {kind}-attention module in the {stack} stack matches "',
        '            f"no {kind}-attention module in the {stack} stack matches "',
        'tests/test_unlisted_behaviours.py -k no_site',
    ),
    (
        'NAR max_target_length ignores the decoder positions',
        'gencraft/nar/model.py',
        '        return min(self.nar_settings.max_target_length, positions)',
        '        return self.nar_settings.max_target_length',
        'tests/test_unlisted_behaviours.py -k capped_by_the_decoder',
    ),
    (
        'NAR decoder start is the pad id',
        'gencraft/nar/model.py',
        '    start = cfg.bos_token_id if cfg.bos_token_id is not None else cfg.pad_token_id',
        '    start = cfg.pad_token_id',
        'tests/test_unlisted_behaviours.py -k mlms_bos',
    ),
    (
        'the seq2seq stepper counts the source against the decoder',
        'gencraft/models/stepping.py',
        '        need = max_new_tokens + (1 if self.is_ed else int(lengths.max()))',
        '        need = max_new_tokens + int(lengths.max())',
        'tests/test_unlisted_behaviours.py -k stepper_counts',
    ),
    (
        'a plain bar counts a terminal',
        'gencraft/progress.py',
        '        self._plain = not notebook and not _is_terminal(stream)',
        '        self._plain = not notebook',
        'tests/test_progress.py -k terminal_keeps',
    ),
    (
        'FAME reads a sliding-window last layer',
        'gencraft/focus/capture.py',
        '    full = [(s, m) for s, m in sites if not getattr(m, "sliding_window", None)]',
        '    full = sites',
        "tests/test_unlisted_behaviours.py -k 'whole_source or sliding_last'",
    ),
    (
        "a post-norm block's h_prev gets its post norm",
        'gencraft/models/attention.py',
        '    if names and names <= {*POST_NORMS, "post_feedforward_layernorm"}:\n        return nn.Identity()',
        '    if names and names <= {*POST_NORMS, "post_feedforward_layernorm"}:\n        return getattr(block, POST_NORMS[0])',
        'tests/test_unlisted_behaviours.py -k olmo2',
    ),
    (
        'a plug-in on both stacks skips its check with encoder_outputs',
        'gencraft/models/attention.py',
        '        encoder_only = all(getattr(m, _SITE).stack == "encoder" for m in self.modules)',
        '        encoder_only = any(getattr(m, _SITE).stack == "encoder" for m in self.modules)',
        'tests/test_unlisted_behaviours.py -k both_stacks',
    ),
    (
        'own task ids are not read',
        'gencraft/data/own.py',
        '            grouped[source] = OwnExample(str(row.get("id", len(grouped))), source, [])',
        '            grouped[source] = OwnExample(str(len(grouped)), source, [])',
        'tests/data/test_own_data.py -k survivors',
    ),
    (
        'a GPU index equal to the count passes',
        'gencraft/models/placement.py',
        '        if dev.index is not None and dev.index >= count:',
        '        if dev.index is not None and dev.index > count:',
        'tests/models/test_placement.py',
    ),
    (
        'the meta device is refused',
        'gencraft/models/placement.py',
        '    elif dev.type not in ("cpu", "cuda", "mps", "xpu", "meta"):',
        '    elif dev.type not in ("cpu", "cuda", "mps", "xpu"):',
        'tests/models/test_placement.py',
    ),
    (
        'no device means the CPU even with a GPU',
        'gencraft/utils.py',
        '    return "cuda" if torch.cuda.is_available() else "cpu"',
        '    return "cpu"',
        'tests/models/test_placement.py',
    ),
    (
        'a torch.dtype given is dropped',
        'gencraft/models/placement.py',
        '    if isinstance(dtype, torch.dtype) or dtype is None:\n        value = dtype',
        '    if isinstance(dtype, torch.dtype) or dtype is None:\n        value = None',
        'tests/models/test_placement.py',
    ),
    (
        'a focus run does not record its data',
        'gencraft/focus/train.py',
        '        if self.data:\n            settings["data"] = self.data\n        save_run(',
        '        save_run(',
        'tests/cli/test_your_data_and_machines.py -k task_file',
    ),
    (
        'eval ignores the task a run was trained on',
        'gencraft/cli/options.py',
        '    task = getattr(args, "task", None) or recorded.get("task") or default',
        '    task = getattr(args, "task", None) or default',
        "tests/cli/test_your_data_and_machines.py -k 'task_file or task_folder'",
    ),
    (
        'a constant heat map keeps an empty range',
        'gencraft/plotting.py',
        '        if not hi - lo > 1e-9 * max(1.0, abs(lo), abs(hi)):  # NaN too',
        '        if False:',
        'tests/test_islands_and_scales.py -k heatmap',
    ),
    (
        "old releases' infill tokens are kept",
        'gencraft/models/pretrained.py',
        '    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < n]',
        '    data["added_tokens"] = data["added_tokens"]',
        'tests/models/test_smollm2_conversion.py -k old_release',
    ),
    (
        "old releases' decoder is kept",
        'gencraft/models/pretrained.py',
        '    data["decoder"] = dict(_BYTE_LEVEL)',
        '    data["decoder"] = data["decoder"]',
        'tests/models/test_smollm2_conversion.py -k old_release',
    ),
    (
        'a BOS is added to every SmolLM2 input',
        'gencraft/models/pretrained.py',
        '        "single": (bos if add_bos else []) + seq,',
        '        "single": bos + seq,',
        'tests/models/test_smollm2_conversion.py -k old_release',
    ),
    (
        'heat map cells below the log floor are not clipped',
        'gencraft/plotting.py',
        '        v = np.clip(v, floor, None)',
        '        v = np.clip(v, None, None)',
        'tests/test_islands_and_scales.py -k heatmap',
    ),
    (
        'heat maps switch to log at exactly two decades',
        'gencraft/plotting.py',
        'positive.max() > 100 * positive.min()',
        'positive.max() >= 100 * positive.min()',
        'tests/test_islands_and_scales.py -k heatmap',
    ),
    (
        'heat maps smooth across cells',
        'gencraft/plotting.py',
        'interpolation="nearest")',
        'interpolation="bilinear")',
        'tests/test_islands_and_scales.py -k heatmap',
    ),
    (
        'a dataset name is taken for a path',
        'gencraft/data/own.py',
        '    if text in names:\n        return False',
        '    if text in names:\n        return True',
        'tests/data/test_own_data.py -k documented_rule',
    ),
    (
        'a .txt name is not a path',
        'gencraft/data/own.py',
        '        or text.endswith((*TASK_SUFFIXES, ".txt"))',
        '        or text.endswith(TASK_SUFFIXES)',
        'tests/data/test_own_data.py -k documented_rule',
    ),
    (
        'own task fields have no defaults',
        'gencraft/data/own.py',
        '    source_field: str = "source",\n    target_field: str = "target",\n) -> list[OwnExample]',
        '    source_field: str = "src",\n    target_field: str = "tgt",\n) -> list[OwnExample]',
        'tests/data/test_own_data.py -k default_fields',
    ),
    (
        'a windowed scorer gets overlap 0',
        'gencraft/metrics/lm.py',
        '        return model.windowed_token_nll(ids, window=window, overlap=overlap)',
        '        return model.windowed_token_nll(ids, window=window, overlap=0)',
        'tests/metrics/test_windowed_nll.py -k windowed_scorer',
    ),
    (
        "a windowed scorer skips the schedule's checks",
        'gencraft/metrics/lm.py',
        '        window_schedule(ids.shape[-1], window, overlap)  # the same checks',
        '        pass  # the same checks',
        'tests/metrics/test_windowed_nll.py -k windowed_scorer',
    ),
    (
        'windowed_nll overlaps by default',
        'gencraft/metrics/lm.py',
        '    overlap: int = 0,\n    progress: bool = False,',
        '    overlap: int = 1,\n    progress: bool = False,',
        'tests/metrics/test_windowed_nll.py -k defaults_are_disjoint',
    ),
    (
        'a one-token stream is refused',
        'gencraft/metrics/lm.py',
        '    if nll.numel() == 0 or words <= 0:',
        '    if nll.numel() <= 1 or words <= 0:',
        'tests/metrics/test_windowed_nll.py -k defaults_are_disjoint',
    ),
    (
        'custom exact_mode drops max_nodes',
        'gencraft/search/custom_generate.py',
        '        max_nodes=max_nodes,',
        '        max_nodes=None,',
        'tests/test_custom_generate.py -k exact_arguments',
    ),
    (
        'custom conditional search drops k',
        'gencraft/search/custom_generate.py',
        '"k": k,',
        '"k": None,',
        'tests/test_custom_generate.py -k conditional_arguments',
    ),
    (
        'custom beam search drops forced_eos',
        'gencraft/search/custom_generate.py',
        '        "forced_eos": forced_eos,',
        '        "forced_eos": "model",',
        'tests/test_custom_generate.py -k beam_arguments',
    ),
    (
        "another task borrows the run's field names",
        'gencraft/cli/options.py',
        '    return task, task_fields(args, recorded if task == recorded.get("task") else None)',
        '    return task, task_fields(args, recorded)',
        'tests/cli/test_your_data_and_machines.py -k task_folder',
    ),
    (
        "custom_generate ignores generate's length_penalty",
        'gencraft/search/custom_generate.py',
        "        length_penalty=1.0 if lp is None else lp,  # generate's defaults\n",
        '        length_penalty=0.0,\n',
        'tests/search/test_batch.py -k from_generate_equals_generate',
    ),
    (
        "custom_generate ignores generate's early_stopping",
        'gencraft/search/custom_generate.py',
        '        early_stopping=False if early is None else early,\n',
        '        early_stopping=True,\n',
        'tests/search/test_batch.py -k from_generate_equals_generate',
    ),
    (
        'the heuristic stop never stops a full row',
        'gencraft/search/beam.py',
        '        return ~finished.done.all(1) | (best > finished.key.min(1).values)',
        '        return ~finished.done.all(1) | True',
        'tests/search/test_batch.py -k from_generate_equals_generate',
    ),
    (
        "the heuristic stop uses the row's limit under any early_stopping",
        'gencraft/search/beam.py',
        '        if self.cfg.early_stopping == "never" and lp > 0:',
        '        if lp > 0:',
        'tests/search/test_batch.py -k from_generate_equals_generate',
    ),
    (
        "aside's conditional score is the model score",
        'gencraft/search/beam.py',
        '            cond=first.cond,\n            key=key,',
        '            cond=first.score,\n            key=key,',
        'tests/search/test_beam_core.py -k one_thing',
    ),
    (
        'the finished key is not length-penalised',
        'gencraft/search/beam.py',
        '        key = rank / float((t + 1) ** self.cfg.length_penalty)',
        '        key = rank',
        'tests/search/test_beam_core.py -k penalised',
    ),
    (
        'on_beam takes a length penalty',
        'gencraft/search/beam.py',
        '        if self.finished == "on_beam" and (',
        '        if False and (',
        'tests/search/test_beam_core.py -k refused_in_one_line',
    ),
    (
        'custom_generate takes a streamer',
        'gencraft/search/custom_generate.py',
        '    if streamer is not None:\n        raise',
        '    if False:\n        raise',
        'tests/search/test_beam_core.py -k refuses_a_streamer',
    ),
    (
        'a Hub folder passes synced_gpus on',
        'gencraft/search/custom_generate.py',
        '    for name in ("streamer", "synced_gpus"):',
        '    for name in ("streamer",):',
        'tests/search/test_beam_core.py -k refuses_a_streamer',
    ),
    (
        'a closed stdout gives a traceback',
        'gencraft/cli/main.py',
        '    except BrokenPipeError:  # stdout closed early',
        '    except ZeroDivisionError:  # stdout closed early',
        'tests/cli/test_new_user_trial.py -k closed_stdout',
    ),
    (
        'a byte-order mark is read as text',
        'gencraft/data/io.py',
        'decode("utf-8-sig")',
        'decode("utf-8")',
        'tests/cli/test_new_user_trial.py -k byte_order',
    ),
    (
        'an empty prompt file is not named',
        'gencraft/cli/main.py',
        '        if not read:\n            raise GencraftError(',
        '        if False:\n            raise GencraftError(',
        'tests/cli/test_new_user_trial.py -k empty_prompt_file',
    ),
    (
        'a JSON file is read as a corpus',
        'gencraft/data/own.py',
        '    if path.is_file() and path.suffix.lower() in (*TASK_SUFFIXES, ".json"):',
        '    if False:',
        'tests/cli/test_new_user_trial.py -k structured_file',
    ),
    (
        'nar generate takes an empty source',
        'gencraft/cli/nar.py',
        '    if empty:  # training refuses empty sources too',
        '    if False:',
        'tests/cli/test_new_user_trial.py -k empty_nar_source',
    ),
    (
        'the unseen-word share counts seen words',
        'gencraft/cli/pointer.py',
        'float((ids == unk).float().mean())',
        'float((ids != unk).float().mean())',
        'tests/cli/test_new_user_trial.py -k unseen_word_share_is',
    ),
    (
        'too few tokens names no flag',
        'gencraft/training/schedules.py',
        'f"tokens; lower {flag}"',
        'f"tokens"',
        'tests/cli/test_new_user_trial.py -k too_few_tokens',
    ),
    (
        "hso eval's default contexts exceed the model",
        'gencraft/cli/hso.py',
        '        cfg.reset_every = positions  # the default fits the model',
        '        pass',
        'tests/cli/test_new_user_trial.py -k hso_eval_default',
    ),
    (
        'generate --output numbers each batch from 0',
        'gencraft/cli/main.py',
        'out.write({"id": i + j, "prompt": prompt, "output": text})',
        'out.write({"id": j, "prompt": prompt, "output": text})',
        'tests/cli/test_new_user_trial.py -k generate_output_writes',
    ),
    (
        'JSON lines escape non-ASCII text',
        'gencraft/cli/options.py',
        'json.dumps(record, ensure_ascii=False)',
        'json.dumps(record)',
        'tests/cli/test_new_user_trial.py -k generate_output_writes',
    ),
    (
        'prefix generate --output writes no references',
        'gencraft/cli/prefix.py',
        'out.write({"id": first + j, "prediction": text, "references": refs})',
        'out.write({"id": first + j, "prediction": text})',
        'tests/cli/test_new_user_trial.py -k prefix_generate_output',
    ),
    (
        'gencraft.data exports no task_examples',
        'gencraft/data/__init__.py',
        '    task_examples,\n    training_pairs,\n)\n',
        '    training_pairs,\n)\n',
        'tests/cli/test_new_user_trial.py -k docs_promise',
    ),
    (
        'the inverse CDF draws a token of probability 0 at a boundary',
        'gencraft/nar/decoding.py',
        'torch.searchsorted(cdf, at, right=True)',
        'torch.searchsorted(cdf, at, right=False)',
        'tests/nar/test_nar_batch.py -k interval_holds_u',
    ),
    (
        "SUNDAE rows draw from the first row's generator",
        'gencraft/nar/decoding.py',
        'shape, generator=self.generators[r], device=out.device',
        'shape, generator=self.generators[0], device=out.device',
        'tests/nar/test_nar_batch.py -k same_in_any_batch',
    ),
    (
        "SUNDAE's scoring call counts for every row",
        'gencraft/nar/decoding.py',
        '        calls += torch.bincount(s.owner[live], minlength=b) > 0',
        '        calls += 1',
        'tests/nar/test_nar_batch.py -k follow_their_definition',
    ),
    (
        "SUNDAE's steps count every step for every row",
        'gencraft/nar/decoding.py',
        '        steps += torch.bincount(s.owner[live], minlength=b) > 0',
        '        steps += 1',
        'tests/nar/test_nar_batch.py -k follow_their_definition',
    ),
    (
        'SUNDAE draws the coins before the samples',
        'gencraft/nar/decoding.py',
        '        uniforms = None if cfg.argmax_unrolled else s.uniforms(live)\n        coins = s.uniforms(live)',
        '        coins = s.uniforms(live)\n        uniforms = None if cfg.argmax_unrolled else s.uniforms(live)',
        'tests/nar/test_nar_batch.py -k golden',
    ),
    (
        'left_padded_batches pads on the right',
        'gencraft/models/prompts.py',
        'pad_batch(rows[first : first + size], pad, left=True)',
        'pad_batch(rows[first : first + size], pad, left=False)',
        'tests/models/test_left_padded_batches.py',
    ),
    (
        'the throughput benchmark takes any device unchecked',
        'gencraft/throughput.py',
        '    device, dtype = check_placement(s.device, s.dtype)',
        '    device, dtype = torch.device(s.device or "cpu"), getattr(torch, s.dtype)',
        'tests/test_throughput.py -k checks_its_device',
    ),
    (
        'own_task accepts any name',
        'gencraft/data/own.py',
        '    if not is_path_spec(task, names):\n        raise ConfigError(',
        '    if False:\n        raise ConfigError(',
        'tests/data/test_own_data.py -k own_task',
    ),
]


def group(path: str) -> str:
    """The part of gencraft a mutation belongs to (a method, the toys, the dispatcher...)."""
    if path == "gencraft/search/toy.py":
        return "toys"
    if path == "gencraft/models/attention.py":
        return "dispatcher"
    if path == "gencraft/training/fit.py":
        return "fit"
    part = path.split("/")[1].removesuffix(".py")
    if part == "cli" and Path(path).stem in METHODS:  # a method's own commands
        return Path(path).stem
    return part


def touched_files() -> set[str]:
    """Files the last commit changed (empty when there is no parent, e.g. a shallow clone)."""
    r = subprocess.run(
        ["git", "diff", "--name-only", "HEAD~1", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return set(r.stdout.split()) if r.returncode == 0 else set()


def ci_subset() -> list[int]:
    """Rotating subset by the commit hash, plus the mutations of the files HEAD touched."""
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    seed = int(r.stdout.strip() or "0", 16)
    # interleave the groups so that consecutive picks come from different parts
    by_group: dict[str, list[int]] = {}
    for i, m in enumerate(M):
        by_group.setdefault(group(m[1]), []).append(i)
    order, lists = [], [by_group[g] for g in sorted(by_group)]
    while any(lists):
        for lst in lists:
            if lst:
                order.append(lst.pop(0))
    start = seed % len(order)
    rotating = {order[(start + j) % len(order)] for j in range(min(CI_ROTATING, len(order)))}
    touched = touched_files()
    return sorted(rotating | {i for i, m in enumerate(M) if m[1] in touched})


def run_one(name: str, path: str, pattern: str, replacement: str, test: str) -> str:
    """CAUGHT, MISSED or ERROR (with the reason) for one mutation."""
    src = (ROOT / path).read_text()
    if src.count(pattern) != 1:
        return f"ERROR: the pattern occurs {src.count(pattern)} times in {path} (stale?)"
    with tempfile.TemporaryDirectory(prefix="gencraft-mutant-") as tmp:
        shutil.copytree(
            ROOT / "gencraft", Path(tmp) / "gencraft", ignore=shutil.ignore_patterns("__pycache__")
        )
        (Path(tmp) / path).write_text(src.replace(pattern, replacement))
        env = {
            **os.environ,
            "PYTHONPATH": tmp + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYTHONSAFEPATH": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "GENCRAFT_MUTANT_ROOT": tmp,
            "HF_HUB_OFFLINE": "1",
        }
        cmd = f"{sys.executable} -m pytest -q -x -p no:cacheprovider -p no:randomly {test}"
        r = subprocess.run(cmd, shell=True, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = (r.stdout + r.stderr).strip().splitlines()
    last = lines[-1] if lines else ""
    if r.returncode == 1:
        return f"CAUGHT: {last}"
    if r.returncode == 0:
        return f"MISSED: {last}"
    return f"ERROR (pytest exit {r.returncode}): {last}"


def main(argv: list[str]) -> int:
    if "--list" in argv:
        counts: dict[str, int] = {}
        for m in M:
            counts[group(m[1])] = counts.get(group(m[1]), 0) + 1
        for g in sorted(counts):
            print(f"{g:12s} {counts[g]}")
        print(f"{'all':12s} {len(M)}")
        return 0
    if "--ci" in argv:
        chosen = ci_subset()
    else:
        words = [a for a in argv if not a.startswith("--")]
        chosen = [i for i, m in enumerate(M) if not words or any(w in m[0] for w in words)]
    t0, bad = time.perf_counter(), 0
    print(f"mutations: {len(chosen)} of {len(M)}", flush=True)
    for i in chosen:
        name, path, pattern, replacement, test = M[i]
        verdict = run_one(name, path, pattern, replacement, test)
        bad += not verdict.startswith("CAUGHT")
        print(f"[{group(path)}] {name}: {verdict}", flush=True)
    print(f"mutations: {len(chosen) - bad} caught, {bad} not, {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
