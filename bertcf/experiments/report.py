"""The command's outputs, rendered from the results passed in (``results.Evaluation``) and the
settings given to ``Report``: table1, ablations and objectives (markdown and JSON), analysis with
its figures and qualitative tables, and tb/ (TensorBoard). Every file is written atomically."""
from __future__ import annotations

import shlex
from pathlib import Path

from ..utils.files import write_json_atomic, write_text_atomic
from .analysis import Analysis
from .claims import claims_md
from .claims import label as metric_label
from .options import SUITE_KEYS
from .plan import Plan
from .published import PAPER_LEXICAL, REPORT_ABLATIONS, REPORT_TABLE1
from .results import FINETUNE_METRICS, FINETUNED, ItemScores
from .rows import PRETRAININGS, RANDOM_ROW, TABLE1_ROWS, TEACHER_ROW, Row, is_whitening, steps_for
from .tables import cell, fmt, interval_cell, md_table, row_summary

#: The table 1 rows shown beside the ablations (BERT-CF) and the objectives (MinBERT and the report's
#: variants of SimCSE and Mirror-BERT).
ABLATION_REFERENCES = [TABLE1_ROWS[-1]]
OBJECTIVE_REFERENCES = list(TABLE1_ROWS[:3])
LEXICAL_REFERENCES = [TABLE1_ROWS[0]]  # the lexical encoder's base: --model itself
POOLING_NAMES = {"cls": "[CLS]", "mean": "mean", "first-last-avg": "first-last-avg"}
#: Beside the distilled student: its random initialisation, the MLM base of the same size (MinBERT
#: under distill) and the teacher.
DISTILL_REFERENCES = [RANDOM_ROW, TABLE1_ROWS[0], TEACHER_ROW]
#: The reference rows of each command that has its own table.
REFERENCES = {"objectives": OBJECTIVE_REFERENCES, "supervised": OBJECTIVE_REFERENCES, "distill": DISTILL_REFERENCES}
SUPERVISED_TEXT = (
    "The supervised recipes of the survey (`--stage supervised`, each at its paper's settings: `--preset sbert-nli`, "
    "`simcse-sup`, `sbert-sts`), from --model (the MLM base when `--config` is given), on the NLI files of `--nli`. "
    "SBERT-NLI then STS continues SBERT-NLI by cosine regression on the CS224N STS train split, which holds most of "
    "STS-B's test pairs: its STS-B test score is not a held-out number (the NLI-only rows' are); its CS224N STS dev "
    "score is. The unsupervised rows of the same base are references where `OUT` has them. The report has no "
    "numbers for these.\n\n")
DISTILL_TEXT = (
    "Knowledge distillation (`--stage supervised --method distill`): a student with --config's architecture, from "
    "random weights, trained to give --teacher's vectors of the pretraining corpus (MSE; a linear projection when "
    "the widths differ, part of the student's checkpoint), with the MLM base's batch, learning rate, schedule and "
    "number of steps. References: the same random student untrained, the MLM base (MinBERT here: the same "
    "architecture trained by MLM on the same corpus; claims.md tests *Distilled student > MinBERT*) and the "
    "teacher itself.\n\n")



def settings_md(plan: Plan) -> str:
    """The plan's settings, as the tables' Settings section says them."""
    a = plan.args
    steps = {s: steps_for(s, a.steps_scale) for s in ("mirror", "joint", "flow")}
    corpus = a.corpus or ("the task train files" if a.corpus_from_tasks else f"{a.data_dir}/wiki1m_for_simcse.txt")
    lines = [f"- model: `{a.model}` (the report: bert-base-uncased)",
             f"- data: `{a.data_dir}`; pretraining corpus: {corpus}"
             + (f", first {a.max_sentences} sentences" if a.max_sentences else "") + " (the report: Wiki1M)",
             f"- steps: mirror {steps['mirror']}, joint {steps['joint']}, flow {steps['flow']}, "
             f"multitask {steps_for('multitask', plan.ft_scale)} (the report: 10^4, 10^4, 10^4, 5000)",
             (f"- seeds {', '.join(map(str, plan.seeds))} (each cell: mean ± sd over them; --seed {a.seed}'s runs "
              f"in stages/ and finetune/, the others' in seeds/SEED/)" if len(plan.seeds) > 1 else f"- seed {a.seed}")
             + f", device {plan.device}, max length {a.max_length} in training, "
             f"{a.eval_max_length or 'whole sentences'} in evaluation"]
    if plan.commands == ["lexical"]:  # no sentence corpus, no report steps: the preset's words and epochs
        lines[1:3] = [f"- data: `{a.data_dir}` (CS224N STS dev, evaluated during each run); training words: the "
                      "preset's (wordfreq's 10,000 most frequent English words) unless --pretrain-args gives a list",
                      "- steps: 2 epochs of the word list (the preset)"]
    if plan.commands == ["supervised"]:  # labelled data, each preset's epochs and max length
        lines[1:3] = [f"- data: `{', '.join(a.nli_list)}` (SBERT-NLI, SimCSE-sup); CS224N STS train of "
                      f"`{a.data_dir}` (SBERT-NLI then STS)",
                      "- steps: each row's preset (sbert-nli: 1 epoch, simcse-sup: 3, sbert-sts: 4), with its "
                      "batch, learning rate and max length (run_pretrain.py --preset NAME)"]
        lines[3] = lines[3].replace(f"max length {a.max_length} in training", "max length: the preset's in training")
    if plan.commands == ["distill"]:  # the student trains as the MLM base: its steps, not the report's
        lines[2] = (f"- steps: the student {a.mlm_steps}, as the MLM base (batch 64, lr 5e-4, linear warm-up over the "
                    f"first tenth and decay); teacher: `{a.teacher}`, its vectors of the corpus cached once")
    if plan.base:
        lines.append(f"- mlm-base: MinBERT is the MLM base, {a.mlm_steps} steps of masked language modelling from the "
                     f"random weights of `{a.config}` (stages/{plan.base}); Random weights is that encoder untrained")
    if "objectives" in plan.commands and a.preset == "published":
        lines.append("- objectives: each method at its paper's settings (`--preset published`: run_pretrain.py "
                     "--preset NAME, one epoch of the corpus each; flags in --pretrain-args win)")
    if getattr(a, "lexical_dir", None):
        lines.append(f"- word similarity: every file of `{a.lexical_dir}`, each word encoded alone, with [CLS] and "
                     f"with mean pooling (a flow's encoder: its own pooling only)")
    if a.pretrain_args:
        lines.append(f"- extra flags of every pretraining run: `{a.pretrain_args}`")
    if a.finetune_args:
        lines.append(f"- extra flags of every fine-tuning: `{a.finetune_args}`")
    if a.finetune_ablations:
        lines.append("- the ablation rows fine-tuned too (--finetune-ablations)")
    if a.max_train_examples:
        lines.append(f"- fine-tuning on at most {a.max_train_examples} training examples per task")
    return "\n".join(lines) + "\n"

def settings_json(plan: Plan) -> dict:
    a = plan.args
    return {k: getattr(a, k) for k in SUITE_KEYS} | {
        "device": str(plan.device),
        "stage_steps": {s: steps_for(s, a.steps_scale) for s in ("mirror", "joint", "flow")},
        "multitask_steps": steps_for("multitask", plan.ft_scale), "finetune": plan.finetune, "seeds": plan.seeds}


def lexical_claims_md(tested: list[dict]) -> str:
    """The lexical claim's verdicts (claims.test_claims' entries), one line a metric."""
    if not tested:
        return "Not tested yet: the lexical encoder has not been trained in this --out-dir.\n"
    rows = []
    for c in tested:
        digits = 3 if c["metric"] == "sts_spearman" else 2
        rows.append([c["a"], c["b"], metric_label(c["metric"]), fmt(c["mean_difference"], digits),
                     f"[{fmt(c['ci95'][0], digits)}, {fmt(c['ci95'][1], digits)}]", str(len(c["seeds"])),
                     f"**{c['verdict']}**"])
    return (md_table(["a", "b", "Metric", "a − b", "95% CI", "Seeds", "Verdict"], rows, "lllrrrl")
            + "\nThe verdict as in claims.md: a paired, hierarchical bootstrap over the seeds and the pairs; "
            "**supported** when the interval lies above 0.\n")


LEXICAL_TEXT = ("Mirror-BERT's word-level recipe (`run_pretrain.py --preset mirror-bert-lexical`: the 10k most "
                "frequent English words, dropout only, NT-Xent at τ 0.2, [CLS], 2 epochs of batch 200, lr 2e-5, 25 "
                "tokens, the run's end kept) from --model, the first row. Each word is encoded alone; ρ×100 is the "
                "Spearman correlation of the cosines with the human scores, with [CLS] and with the mean of the "
                "word's tokens. *(paper)*: Mirror-BERT's Table 1 (Liu et al. 2021), ρ×100 of bert-base-uncased on "
                "Multi-SimLex English, [CLS] / mean: another base model, word list and evaluation set.\n\n")


def whitening_note(rows: list[Row]) -> str:
    """What a whitening row's seeds are, under a table that has one."""
    names = [r.name for r in rows if is_whitening(r)]
    if not names:
        return ""
    return (f"{' and '.join(names)}: BERT-whitening (Su et al. 2021, `run_pretrain.py --stage whiten`), a linear "
            "map fitted in closed form on the encoder's vectors of the pretraining corpus; no training and no "
            "randomness of its own, so a seed's whitening row is the whitening of that seed's encoder below it "
            "(of --model, the same for every seed, for MinBERT-whitening: its unsupervised ρ has spread 0).\n\n"
)


class Report:
    """Writes into ``out``; ``settings_md``/``settings_json`` (see the functions above) and
    ``command`` (the argv) go under every table; ``data_dir`` holds the dev files the qualitative
    tables quote; ``seeds``: the seeds every row ran with (the histograms and qualitative tables
    show the first); ``outputs`` lists what was written. The tables take results.Evaluation's
    results, {row key: {seed: ...}}."""

    def __init__(self, out: Path, settings_md: str, settings_json: dict, command: list, data_dir: Path,
                 senteval_dir: Path, transfer: bool, seed: int, seeds: list[int], qualitative_pairs: int):
        self.out, self.settings_md, self.settings_json, self.command = out, settings_md, settings_json, command
        self.data_dir, self.senteval_dir, self.transfer = data_dir, senteval_dir, transfer
        self.seed, self.seeds, self.qualitative_pairs = seed, seeds, qualitative_pairs
        self.items = ItemScores(data_dir)
        self.outputs: list[str] = []

    def summary(self, results: dict, row: Row) -> dict:
        """``row_summary`` with the 95% intervals (``ci95``, over the seeds and the evaluation items)
        of the unsupervised STS dev ρ, each SentEval STS set and the fine-tuned metrics."""
        per_seed = results[row.key]
        summary = row_summary(per_seed)
        for metric in ("sts_spearman", *FINETUNED):
            summary[metric]["ci95"] = self.items.interval(per_seed, metric)
        for task, agg in (summary["senteval"] or {"sts": {}})["sts"].items():
            agg["ci95"] = self.items.interval(per_seed, f"senteval_{task}")
        for pooling in ("cls", "mean"):
            for task, agg in (summary["lexical"] or {}).get(pooling, {}).items():
                agg["ci95"] = self.items.interval(per_seed, f"lexical_{task}_{pooling}")
        return summary

    def cell(self, agg: dict, digits: int = 3) -> str:
        return cell(agg, digits, len(self.seeds))

    def spread_note(self) -> str:
        """What a cell is, under a table of several seeds."""
        if len(self.seeds) == 1:
            return ""
        return (f"Each cell: mean ± sd over the {len(self.seeds)} seeds {', '.join(map(str, self.seeds))} "
                "((n=k): only k seeds have the value); the per-seed values are in the JSON beside this file, "
                "and claims.md tests the differences between rows.\n\n")

    def interval_note(self) -> str:
        """What the 95% CI column is."""
        what = "the seeds and the STS dev pairs" if len(self.seeds) > 1 else "the STS dev pairs (one seed: not training noise)"
        return (f"95% CI: the unsupervised ρ's percentile interval from a bootstrap over {what}; "
                "the JSON also has one for every SentEval STS set and fine-tuned metric.\n\n")

    def first_seed(self, results: dict, row: Row) -> dict:
        """The row's results for the first seed (the histograms and qualitative tables)."""
        return results[row.key][self.seeds[0]]

    def senteval_columns(self, summaries: dict) -> tuple[list[str], dict]:
        """The optional columns: the STS test average ("7 STS avg (test)" when all seven are
        there) and, with --transfer, the transfer average; {row key: cells}. ``summaries``: {row key:
        row_summary}."""
        found = {k: v["senteval"] for k, v in summaries.items() if v["senteval"]}
        if not found:
            return [], {}
        first = next(iter(found.values()))
        n = len(first["sts"])
        header = ["7 STS avg (test)" if n == 7 else f"{next(iter(first['sts']))} (test)" if n == 1
                  else f"STS avg (test, {n} sets)"]
        if self.transfer:  # the anchors' average is over all seven tasks: say which this one covers
            tasks = first["transfer_avg_tasks"]
            header.append("Transfer avg (fasttest)" if len(tasks) == 7 else
                          f"Transfer avg of {len(tasks)}/7 (fasttest: {', '.join(tasks)})")
        cells = {k: [self.cell(v["sts_avg"], 2)] + ([self.cell(v["transfer_avg"], 2)] if self.transfer else [])
                 for k, v in found.items()}
        return header, cells

    def lexical_columns(self, summaries: dict) -> tuple[list[str], dict]:
        """The word-similarity columns (--lexical-dir): each set's Spearman ×100 with the encoder's own
        pooling, named in the cell; {row key: cells}."""
        found = {k: v["lexical"] for k, v in summaries.items() if v["lexical"]}
        if not found:
            return [], {}
        tasks = list(next(iter(found.values()))[next(iter(found.values()))["pooling"]])
        cells = {k: [f"{self.cell(v[v['pooling']][t], 2)} ({POOLING_NAMES[v['pooling']]})" for t in tasks]
                 for k, v in found.items()}
        return [f"{t} ρ×100" for t in tasks], cells

    def footer(self) -> str:
        """The Settings section and the command, under every table."""
        command = shlex.join(["python", "-m", "bertcf.experiments"] + self.command)
        return "\n## Settings\n\n" + self.settings_md + "\n" + f"Command: `{command}`\n"

    def write(self, name: str, text: str) -> None:
        write_text_atomic(self.out / name, text)
        self.outputs.append(str(self.out / name))

    def write_json(self, name: str, obj) -> None:
        write_json_atomic(self.out / name, obj)
        self.outputs.append(str(self.out / name))

    def row_info(self, results: dict, row: Row) -> dict:
        """The row's encoder and runs (results.Evaluation.info) for the first seed, and every seed's
        under "seeds" when there are several."""
        per_seed = {s: r["info"] for s, r in results[row.key].items()}
        info = dict(per_seed[self.seeds[0]])
        return info | ({"seeds": {str(s): i for s, i in per_seed.items()}} if len(self.seeds) > 1 else {})

    def table1(self, rows: list[Row], results: dict) -> dict:
        """table1.md/json: each row's unsupervised STS dev Spearman and fine-tuned dev metrics."""
        summaries = {row.key: self.summary(results, row) for row in rows}
        keys = ("sts_spearman", "sst_accuracy", "qqp_accuracy", "sts_pearson")
        rows_json, md_rows = [], []
        for row in rows:
            summary = summaries[row.key]
            ours = {k: summary[k] for k in ("sts_spearman", *FINETUNE_METRICS)} | {"senteval": summary["senteval"]}
            report = REPORT_TABLE1.get(row.name, dict.fromkeys(REPORT_TABLE1["MinBERT"]))
            rows_json.append({"name": row.name, "ours": ours, "report": report} | self.row_info(results, row))
            md_rows.append([row.name, self.cell(ours["sts_spearman"]), interval_cell(ours["sts_spearman"])]
                           + [c for k in keys for c in ([] if k == "sts_spearman" else [self.cell(ours[k])])
                              + [fmt(report[k])]])
        header = ["Encoder", "Unsup. STS ρ", "95% CI", "(report)", "SST-5 acc", "(report)", "QQP acc", "(report)",
                  "STS r", "(report)"]
        extra, cells = self.senteval_columns(summaries)
        header += extra
        md_rows = [r + cells.get(row.key, ["–"] * len(extra)) for r, row in zip(md_rows, rows)]
        md = ("# Table 1: sentence encoders on the CS224N dev sets\n\n"
              "Unsupervised STS ρ: Spearman of cos(f(x1), f(x2)) with the STS dev scores, before fine-tuning. "
              "SST-5 / QQP accuracy and STS Pearson r: after multitask fine-tuning of each encoder. "
              "(report) = the report's number (bert-base-uncased).\n\n"
              + self.spread_note() + whitening_note(rows) + self.interval_note() + md_table(header, md_rows)
              + self.footer())
        if not self.settings_json["finetune"] and all(not r["ours"]["sst_accuracy"]["n"] for r in rows_json):
            md += "\nFine-tuning was not run (--no-finetune): the supervised columns are empty.\n"
        obj = {"rows": rows_json, "settings": self.settings_json, "command": self.command}
        self.write("table1.md", md)
        self.write_json("table1.json", obj)
        return obj

    def ablations(self, rows: list[Row], results: dict) -> dict:
        return self.sts_table("ablations", "Ablations: unsupervised STS dev Spearman", "", "Variant", rows,
                              REPORT_ABLATIONS, ABLATION_REFERENCES, results)

    def objectives(self, rows: list[Row], results: dict) -> dict:
        if any(PRETRAININGS[r.pretraining].preset for r in rows if r.pretraining):
            text = ("Each method at its paper's settings (`run_pretrain.py --preset NAME`: its loss variant, "
                    "pooling, augmentation, temperature, batch, learning rate, length, one epoch of the corpus; "
                    "docs/pretraining.md's table of presets says what still differs), from --model, with the choice of "
                    "the best STS-dev checkpoint of this project. MLM has no preset: it runs as in `objectives`. "
                    "The report has no numbers for these, so their (report) cells are empty.\n\n")
        else:
            text = ("Other self-supervised objectives in the first pretraining stage (`--stage mirror "
                    "--method bsl|ct|tsdae|mlm`), each from --model with the same corpus, steps and choice "
                    "of the best STS-dev checkpoint as MinBERT-Mirror. The report has no numbers for these "
                    "(it trains Mirror-BERT and SimCSE only), so their (report) cells are empty.\n\n")
        return self.sts_table("objectives", "Pretraining objectives: unsupervised STS dev Spearman", text,
                              "Encoder", rows, {}, OBJECTIVE_REFERENCES, results)

    def supervised(self, rows: list[Row], results: dict) -> dict:
        return self.sts_table("supervised", "Supervised encoders: STS Spearman", SUPERVISED_TEXT, "Encoder", rows, {},
                              REFERENCES["supervised"], results)

    def distill(self, rows: list[Row], results: dict) -> dict:
        return self.sts_table("distill", "Distillation: the student against the teacher and the MLM base", DISTILL_TEXT,
                              "Encoder", rows, {}, REFERENCES["distill"], results,
                              whats={"minbert": "the MLM base (stages/mlm-base): --config trained by MLM"})

    def sts_table(self, name: str, title: str, text: str, first: str, rows: list[Row], report: dict,
                  references: list[Row], results: dict, whats: dict | None = None) -> dict:
        """NAME.md/json: each row's unsupervised STS dev Spearman beside the report's (``report``:
        by row name; a row not in it has none), then those of the ``references`` (table 1 rows,
        with the report's table 1 number) whose encoder is there (evaluated: in ``results``).
        ``whats``: row key -> what the row is, where the table says it otherwise."""
        present = [r for r in references if r.key in results and row_summary(results[r.key])["sts_spearman"]["n"]]
        summaries = {row.key: self.summary(results, row) for row in rows + present}

        def entry(row: Row, report_value) -> dict:
            spec = PRETRAININGS[row.pretraining] if row.pretraining else None
            untouched = {RANDOM_ROW.key: "--config, untrained", TEACHER_ROW.key: "--teacher, untouched"} | (whats or {})
            what = untouched.get(row.key, "--model, untouched") if spec is None else spec.what + (
                f" (`--preset {spec.preset}`)" if spec.preset else "")
            summary = summaries[row.key]
            return {"name": row.name, "what": what,
                    "ours": {"sts_spearman": summary["sts_spearman"], "senteval": summary["senteval"],
                             "lexical": summary["lexical"]},
                    "report": {"sts_spearman": report_value}} | self.row_info(results, row)

        rows_json = [entry(row, report.get(row.name)) for row in rows]
        refs_json = [entry(row, REPORT_TABLE1.get(row.name, {}).get("sts_spearman")) for row in present]
        labelled = [r["name"] for r in rows_json] + [f"*{r['name']}* (reference)" for r in refs_json]
        extra, cells = self.senteval_columns(summaries)
        lexical, lexical_cells = self.lexical_columns(summaries)
        md_rows = [[label, r["what"], self.cell(r["ours"]["sts_spearman"]), interval_cell(r["ours"]["sts_spearman"]),
                    fmt(r["report"]["sts_spearman"])] + cells.get(row.key, ["–"] * len(extra))
                   + lexical_cells.get(row.key, ["–"] * len(lexical))
                   for label, r, row in zip(labelled, rows_json + refs_json, rows + present)]
        extra += lexical
        absent = [r.name for r in references if r not in present]
        note = (f"\n{', '.join(absent)} (reference): not trained in this --out-dir yet (`table1` or `all` "
                f"with the same --out-dir trains it).\n" if absent else "")
        md = (f"# {title}\n\n{text}" + self.spread_note() + whitening_note(rows) + self.interval_note()
              + md_table([first, "What", "Unsup. STS ρ", "95% CI", "(report)"] + extra, md_rows,
                         "llrrr" + "r" * len(extra))
              + note + self.footer())
        obj = {"rows": rows_json, "reference": refs_json, "settings": self.settings_json, "command": self.command}
        self.write(f"{name}.md", md)
        self.write_json(f"{name}.json", obj)
        return obj

    def lexical(self, rows: list[Row], results: dict, claims: list[dict]) -> dict:
        """lexical.md/json: word similarity ([CLS] and mean pooling, each set of --lexical-dir) of the
        lexical encoders and of their base (--model), beside Mirror-BERT's Table 1, with the claim
        that the lexical encoder beats its base (``claims``: test_claims' results)."""
        shown = [r for r in LEXICAL_REFERENCES if r.key in results] + rows
        summaries = {r.key: self.summary(results, r) for r in shown}
        found = [s["lexical"] for s in summaries.values() if s["lexical"]]
        tasks = list(found[0].get("cls") or found[0]["mean"]) if found else []
        header = ["Encoder", "CS224N STS dev ρ"] + [c for t in tasks for c in (
            f"{t} ρ×100 [CLS]", "95% CI", f"{t} ρ×100 mean", "95% CI")] + ["(paper) [CLS] / mean"]
        md_rows, rows_json = [], []
        for row in shown:
            lexical, paper = summaries[row.key]["lexical"] or {}, PAPER_LEXICAL.get(row.name, {})
            cells = []
            for t in tasks:
                for p in ("cls", "mean"):
                    agg = lexical.get(p, {}).get(t)
                    cells += ["–", "–"] if agg is None else [self.cell(agg, 2), interval_cell(agg, 2)]
            paper_cell = " / ".join(fmt(None if p not in paper else 100 * paper[p], 1) for p in ("cls", "mean"))
            md_rows.append([row.name, self.cell(summaries[row.key]["sts_spearman"])] + cells + [paper_cell])
            rows_json.append({"name": row.name, "ours": {"sts_spearman": summaries[row.key]["sts_spearman"],
                                                         "lexical": lexical},
                              "paper_multisimlex_en": paper} | self.row_info(results, row))
        tested = [c for c in claims if c["a"] in {r.name for r in rows} and c["b"] in {r.name for r in shown}]
        md = ("# Mirror-BERT's lexical encoder: word similarity\n\n" + LEXICAL_TEXT + self.spread_note() + "95% CI: the percentile interval of a bootstrap over the seeds and the word "
              "pairs.\n\n" + md_table(header, md_rows)
              + "\n## The claim: the lexical encoder beats its base\n\n" + lexical_claims_md(tested)
              + self.footer())
        obj = {"rows": rows_json, "claims": tested, "settings": self.settings_json, "command": self.command}
        self.write("lexical.md", md)
        self.write_json("lexical.json", obj)
        return obj

    def claims(self, claims: list[dict]) -> dict:
        """claims.md/json: the report's claims, tested (``claims.test_claims``)."""
        obj = {"claims": claims, "settings": self.settings_json, "command": self.command}
        self.write("claims.md", claims_md(claims, self.footer()))
        self.write_json("claims.json", obj)
        return obj

    def analysis(self, rows: list[Row], results: dict) -> dict:
        """analysis.md/json, qualitative.md and tb/ (``analysis.Analysis``)."""
        return Analysis(self).write(rows, results)
