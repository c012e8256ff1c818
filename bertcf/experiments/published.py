"""The report's published numbers (bert-base-uncased, the CS224N dev sets), which every table and
claim is set beside."""
from __future__ import annotations

#: Report table 1 (bert-base-uncased, dev sets).
REPORT_TABLE1 = {
    "MinBERT": {"sts_spearman": 0.514, "sst_accuracy": 0.512, "qqp_accuracy": 0.821, "sts_pearson": 0.848},
    "MinBERT-SimCSE": {"sts_spearman": 0.745, "sst_accuracy": 0.511, "qqp_accuracy": 0.825, "sts_pearson": 0.852},
    "MinBERT-Mirror": {"sts_spearman": 0.736, "sst_accuracy": 0.522, "qqp_accuracy": 0.820, "sts_pearson": 0.858},
    "MinBERT-flow": {"sts_spearman": 0.517, "sst_accuracy": 0.506, "qqp_accuracy": 0.821, "sts_pearson": 0.857},
    "BERT-CF": {"sts_spearman": 0.760, "sst_accuracy": 0.525, "qqp_accuracy": 0.841, "sts_pearson": 0.857},
}
#: Report ablations, unsupervised STS dev Spearman.
REPORT_ABLATIONS = {"SimCSE-joint": 0.746, "MinBERT-joint": 0.629, "Mirror-flow": 0.739}
#: Report section 6.3: alignment and uniformity on QQP train pairs.
REPORT_ANALYSIS = {
    "MinBERT": {"alignment": 0.216, "uniformity": -1.425},
    "MinBERT-SimCSE": {"alignment": 0.397, "uniformity": -3.264},
    "MinBERT-Mirror": {"alignment": 0.391, "uniformity": -2.990},
    "MinBERT-flow": {"alignment": 0.499, "uniformity": -2.857},
    "BERT-CF": {"alignment": 0.416, "uniformity": -3.198},
}

#: Mirror-BERT's paper (Liu et al. 2021), Table 1: Spearman's rho on Multi-SimLex English (1,888
#: pairs), bert-base-uncased before ("BERT", [CLS] and the mean of its tokens) and after Mirror-BERT's
#: word training ([CLS]); the lexical command's rows are set beside them (another base, word list and set).
PAPER_LEXICAL = {"MinBERT": {"cls": 0.105, "mean": 0.267}, "Mirror-BERT (lexical)": {"cls": 0.556}}


def report_value(row: str, metric: str):
    """The report's number for a row and metric (None where it has none)."""
    if metric == "sts_spearman" and row in REPORT_ABLATIONS:
        return REPORT_ABLATIONS[row]
    return REPORT_TABLE1.get(row, {}).get(metric)
