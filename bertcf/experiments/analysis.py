"""The analysis outputs of the experiments (the report's section 6.3 and appendix): alignment and
uniformity, the SentEval STS test sets, the STS dev cosine histograms, the qualitative tables and
tb/ (TensorBoard). ``Analysis(report)`` writes them with the report's settings and footer."""
from __future__ import annotations

import random
from pathlib import Path

from ..data.tasks import read_qqp, read_sst, read_sts, task_file
from ..multitask.evaluation import prediction_file
from ..utils.files import atomic_path, save_dir_atomic
from .published import REPORT_ANALYSIS
from .results import read_predictions
from .rows import Row
from .tables import fmt, md_cell, md_table, row_summary

HISTOGRAM_ROWS = ("MinBERT", "BERT-CF")  # the report's appendix figures


class Analysis:
    """analysis.md/json, qualitative.md and tb/ of a ``report.Report`` (its output directory,
    settings, seeds, cells and footer)."""

    def __init__(self, report):
        self.report = report

    def write(self, rows: list[Row], results: dict) -> dict:
        """analysis.md/json (alignment and uniformity, the SentEval STS sets, the histograms),
        qualitative.md and tb/."""
        import torch

        keys = ("alignment", "uniformity", "sts_dev_alignment", "sts_dev_uniformity")
        rows_json, md_rows, info = [], [], {}
        for row in rows:
            summary = row_summary(results[row.key])
            report = REPORT_ANALYSIS.get(row.name, {"alignment": None, "uniformity": None})  # whitening: none
            rows_json.append({"name": row.name, "ours": {k: summary[k] for k in keys}, "report": report})
            md_rows.append([row.name, self.report.cell(summary["alignment"]), fmt(report["alignment"]),
                            self.report.cell(summary["uniformity"]), fmt(report["uniformity"]),
                            self.report.cell(summary["sts_dev_alignment"]), self.report.cell(summary["sts_dev_uniformity"])])
            info = self.report.first_seed(results, row)["qqp"] or info
        sample = (f"{info.get('pairs')} QQP train pairs ({info.get('positives')} duplicates, "
                  f"{info.get('sentences')} distinct sentences)" if info else "QQP train pairs")
        # Histograms of the STS dev cosines (the first seed's): PNG and TensorBoard.
        gold = [p.label for p in read_sts(task_file(self.report.data_dir, "sts", "dev"))]
        which = f" (seed {self.report.seeds[0]})" if len(self.report.seeds) > 1 else ""
        figures, histograms = [], {}
        for row in rows:
            sts = self.report.first_seed(results, row)["sts"]
            if row.name in HISTOGRAM_ROWS and sts:
                name = f"figures/sts-dev-cosines-{row.key}.png"
                write_histogram_png(self.report.out / name, sts["cosines"], gold, f"{row.name}: STS dev pair cosines{which}")
                self.report.outputs.append(str(self.report.out / name))
                figures.append((row.name, name))
                histograms[row.name] = torch.tensor(sts["cosines"])
        md = ("# Alignment and uniformity (report section 6.3)\n\n"
              f"On {sample}, sampled with seed {self.report.seed}. Alignment: mean ‖f(x)−f(y)‖² over duplicate "
              "pairs (lower is better); uniformity: log mean exp(−2‖f(x)−f(y)‖²) over all pairs of sentences "
              "(lower is better); f normalised. The last two columns: the same on STS dev (pairs with gold ≥ 4).\n\n"
              + self.report.spread_note()
              + md_table(["Encoder", "Alignment", "(report)", "Uniformity", "(report)",
                          "STS-dev align.", "STS-dev unif."], md_rows)
              + self.senteval_md(rows, results)
              + f"\n# STS dev cosine histograms{which}\n\n"
              + "".join(f"![{n}]({p})\n\n" for n, p in figures)
              + self.report.footer())
        obj = {"rows": rows_json, "sample": info, "figures": [p for _, p in figures],
               "settings": self.report.settings_json, "command": self.report.command}
        self.report.write("analysis.md", md)
        self.report.write_json("analysis.json", obj)
        self.report.write("qualitative.md", self.qualitative_md(rows, results))
        self.tensorboard(histograms)
        return obj

    def senteval_md(self, rows: list[Row], results: dict) -> str:
        """The analysis' per-set table of SentEval's STS test sets (Spearman ×100), when run."""
        from ..data.senteval import STS_TASKS
        found = [(r.name, s) for r in rows if (s := row_summary(results[r.key])["senteval"])]
        if not found:
            return ""
        empty = {"n": 0}
        table = [[name] + [self.report.cell(v["sts"].get(t, empty), 2) for t in STS_TASKS] + [self.report.cell(v["sts_avg"], 2)]
                 for name, v in found]
        return ("\n# SentEval STS test sets\n\nSpearman ×100 of the cosine of raw vectors (STS12-16: SentEval's "
                f"\"all\" setting), whole sentences, from `{self.report.senteval_dir}` (`python -m bertcf.evaluate`).\n\n"
                + md_table(["Encoder", *STS_TASKS, "Avg."], table))

    def qualitative_md(self, table1_rows: list[Row], results: dict) -> str:
        k, rng = self.report.qualitative_pairs, random.Random(self.report.seed)
        first = {r.key: self.report.first_seed(results, r) for r in table1_rows}
        rows = [r for r in table1_rows if first[r.key]["sts"]]
        sts_dev = read_sts(task_file(self.report.data_dir, "sts", "dev"))
        picked = sorted(rng.sample(range(len(sts_dev)), min(k, len(sts_dev))), key=lambda i: -sts_dev[i].label)
        table = [[md_cell(sts_dev[i].sentence1, 60), md_cell(sts_dev[i].sentence2, 60), f"{sts_dev[i].label:.1f}"]
                 + [fmt(first[r.key]["sts"]["cosines"][i], 2) for r in rows] for i in picked]
        which = f" (seed {self.report.seeds[0]})" if len(self.report.seeds) > 1 else ""
        md = (f"# Qualitative examples{which}\n\n## STS dev: gold score and each encoder's cosine (before fine-tuning)\n\n"
              + md_table(["Sentence 1", "Sentence 2", "Gold"] + [r.name for r in rows], table, "llr" + "r" * len(rows)))
        tuned = [r for r in table1_rows if first[r.key]["finetune"] is not None]
        if not tuned:
            return md + "\nNo fine-tuned encoders (table1 with fine-tuning adds QQP and SST predictions here).\n"
        for task, title, reader, fields in (
                ("qqp", "QQP dev: duplicate label and each fine-tuned encoder's prediction", read_qqp,
                 lambda p: [md_cell(p.sentence1, 60), md_cell(p.sentence2, 60), f"{p.label:g}"]),
                ("sst", "SST-5 dev: sentiment label and each fine-tuned encoder's prediction", read_sst,
                 lambda p: [md_cell(p.sentence, 100), str(p.label)])):
            path = task_file(self.report.data_dir, task, "dev")
            if not path.is_file():
                continue
            examples = reader(path)
            picked = rng.sample(examples, min(k, len(examples)))
            file = prediction_file(task, "dev")
            preds = {r.name: read_predictions(Path(first[r.key]["info"]["finetune_dir"]) / "predictions" / file)
                     for r in tuned}
            header = (["Question 1", "Question 2", "Label"] if task == "qqp" else ["Sentence", "Label"])
            table = [fields(p) + [_pred(preds[r.name].get(p.id)) for r in tuned] for p in picked]
            md += (f"\n## {title}\n\n"
                   + md_table(header + [r.name for r in tuned], table, "l" * (len(header) - 1) + "r" * (1 + len(tuned))))
        return md

    def tensorboard(self, histograms: dict) -> None:
        texts = {name: (self.report.out / f"{name}.md").read_text() for name in ("table1", "ablations", "analysis",
                                                                            "qualitative", "claims")
                 if (self.report.out / f"{name}.md").is_file()}

        def write(tmp):
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(str(tmp))
            for name, values in histograms.items():
                writer.add_histogram(f"sts_dev_cosines/{name}", values, 0)
            for name, text in texts.items():
                writer.add_text(name, text, 0)
            writer.close()
        save_dir_atomic(self.report.out / "tb", write)
        self.report.outputs.append(str(self.report.out / "tb"))


def _pred(value) -> str:
    if value is None:
        return "–"
    try:
        return f"{float(value):g}"
    except ValueError:
        return md_cell(value, 20)


def write_histogram_png(path, cosines, gold, title: str) -> None:
    """A histogram of pair cosines over [-1, 1], stacked by gold-score band; written atomically."""
    import numpy as np
    from matplotlib.figure import Figure

    cosines, gold = np.asarray(cosines, dtype=float), np.asarray(gold, dtype=float)
    bands = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5.001)]
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.subplots()
    ax.hist([cosines[(gold >= lo) & (gold < hi)] for lo, hi in bands], bins=np.linspace(-1, 1, 81), stacked=True,
            label=[f"gold {lo:g}–{min(hi, 5):g}" for lo, hi in bands], color=[
                "#d73027", "#fc8d59", "#fee090", "#91bfdb", "#4575b4"])
    ax.axvline(float(cosines.mean()), color="black", linestyle="--", linewidth=1,
               label=f"mean {cosines.mean():.2f}")
    ax.set_xlim(-1, 1)
    ax.set_xlabel("cosine similarity of the pair's sentence vectors")
    ax.set_ylabel("STS dev pairs")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
