"""The model card (``best/README.md``) of a checkpoint, in sentence-transformers' conventions: YAML
metadata for the Hub, then what produced the checkpoint (command, base model, stage and method,
data, steps, the versions of Python, bertcf and the libraries), its best dev metric, and how to
load it with BERT-CF and with sentence-transformers."""
from __future__ import annotations

from pathlib import Path

from ..utils import environment
from ..utils.files import write_text_atomic

CARD_FILE = "README.md"


def hub_base(config: dict, depth: int = 0) -> str | None:
    """The Hugging Face Hub model a run's encoder comes from, following --init / --encoder back
    through the runs that wrote them; None when it comes from a local directory (a path means
    nothing on the Hub)."""
    from ..runs import run_settings

    source = config.get("init") or config.get("encoder") or config.get("model")
    if source is None or depth > 20:
        return None
    if not Path(source).exists():
        return str(source)
    found = run_settings(source)
    return hub_base(found[1], depth + 1) if found else None


def model_card(config: dict, metric: str, score: float, step: int, flow: bool = False,
               whitening: dict | None = None, software: dict | None = None) -> str:
    """The card of a checkpoint chosen at ``step`` by ``metric`` = ``score``, from the run's ``config``
    (its config.json: every setting, and ``command``, the command line); ``flow``: whether the
    checkpoint's sentence-transformers modules include its own code (a flow, first-last-avg
    pooling); ``whitening``: what ``--stage whiten`` fitted ({"fitted_on", "sentences", "dim",
    "rank", "width"}), named in the card; ``software``: an environment record whose versions the
    card names (default: this process's)."""
    base = config.get("init") or config.get("encoder") or config.get("model")
    hub = hub_base(config)
    what = (f"stage `{config['stage']}`, method `{config['method']}`" if "stage" in config
            else f"objective `{config['objective']}` (the Python API)" if "objective" in config
            else "multitask fine-tuning (SST-5, QQP, STS)")
    if whitening:
        what += (f": BERT-whitening (Su et al. 2021, arXiv:2103.15316), a linear map fitted in closed form on "
                 f"the `{config.get('pooling')}`-pooled vectors of {whitening['sentences']} sentences "
                 f"({whitening['fitted_on']}): y = (x - mu) W, W = U Lambda^(-1/2) of their covariance, "
                 f"the first {whitening['dim']} of {whitening['width']} directions (covariance rank "
                 f"{whitening['rank']})")
    corpus = config.get("corpus") or ("the task train files' sentences" if config.get("corpus_from_tasks") else None)
    evaluation = ([f"- SentEval STS-B dev Spearman ×100: {100 * score:.2f} at step {step} (`--select-on "
                   "stsb-dev`)", ""] if config.get("select_on") == "stsb-dev" else [])
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:",
             "- sentence-transformers", "- sentence-similarity", "- feature-extraction", "- bertcf"]
    lines += [f"base_model: {hub}"] if hub else []
    lines += ["---", "",
             "# A BERT-CF sentence encoder", "",
             "Trained with BERT-CF (Contrastive Flows for MultiTask-BERT) on minBERT, a BERT written from scratch.", "",
             "## Training", "",
             f"- Command: `{config.get('command', '(not recorded)')}`",
             f"- Base model: `{base}`",
             f"- What: {what}",
             f"- Data: `{config.get('data_dir')}`" + (f"; pretraining corpus: {corpus}" if corpus else ""),
             ("- Steps: none, no training (a closed-form fit)" if whitening else
              f"- Steps: {config.get('steps')} (batch {config.get('batch_size')}, lr {config.get('lr')}, "
              f"seed {config.get('seed')})"),
             f"- Best dev metric: {metric} = {score:.4f} at step {step}",
             *([f"- Matryoshka widths: {', '.join(map(str, config['matryoshka_dims']))} (trained at each: encode "
                f"with `truncate_dim=k` for a smaller vector)"] if config.get("matryoshka_dims") else []),
             f"- Software: {environment.summary(software or environment.versions())} (the whole record, device "
             f"and CPU included: `environment.json` in the run directory)", ""]
    lines += (["## Evaluation", ""] + evaluation) if evaluation else []
    remote = ("This checkpoint has modules of its own (a normalising flow on top of the pooled vector, or "
              "first-last-avg pooling). Their code ships in this directory (`bertcf_st.py`, `flow.py`; torch, "
              "safetensors and sentence-transformers are all it imports), so loading it runs that code: pass "
              "`trust_remote_code=True`." if flow else
              "No custom code: a plain Transformer and Pooling model (and a Dense module for a linear head).")
    lines += ["## Usage", "",
              "With sentence-transformers alone (`pip install sentence-transformers`; BERT-CF is not needed). "
              + remote, "",
              "```python", "from sentence_transformers import SentenceTransformer", "",
              'model = SentenceTransformer("PATH"' + (", trust_remote_code=True)" if flow else ")"),
              'vectors = model.encode(["A man plays a guitar.", "Someone plays music."])', "```", "",
              "With BERT-CF:", "", "```python", "from bertcf import SentenceEncoder", "",
              'encoder = SentenceEncoder.from_pretrained("PATH")',
              'vectors = encoder.encode(["A man plays a guitar.", "Someone plays music."])', "```", ""]
    return "\n".join(lines)


def write_model_card(directory, config: dict, metric: str, score: float, step: int,
                     whitening: dict | None = None) -> None:
    """The card of the checkpoint written in ``directory``."""
    from . import st_format

    remote = st_format.needs_remote_code(directory)
    write_text_atomic(Path(directory) / CARD_FILE, model_card(config, metric, score, step, remote, whitening))


def add_experiment_row(directory, row: str, command: str) -> None:
    """Say in a checkpoint's card which row of the experiments' tables it is."""
    card = Path(directory) / CARD_FILE
    if card.is_file():
        write_text_atomic(card, card.read_text() + f"\n## In BERT-CF's experiments\n\nThe row **{row}** of "
                                                   f"`{command}`.\n")


def cross_encoder_card(config: dict, metric: str, score: float, step: int, software: dict | None = None) -> str:
    """The card of a cross-encoder checkpoint (``python -m bertcf.cross train``'s best/)."""
    hub = hub_base({"model": config.get("model")})
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: text-ranking", "tags:",
             "- sentence-transformers", "- cross-encoder", "- bertcf"]
    lines += [f"base_model: {hub}"] if hub else []
    lines += ["---", "", "# A BERT-CF cross-encoder", "",
              "Trained with BERT-CF on minBERT, a BERT written from scratch: both texts of a pair read together, "
              "scored from the pooled [CLS] vector (a BertForSequenceClassification).", "", "## Training", "",
              f"- Command: `{config.get('command', '(not recorded)')}`",
              f"- Base model: `{config.get('model')}`",
              f"- Head: {config.get('head')}; training files: {', '.join(map(str, config.get('train_file') or []))}",
              f"- Steps: {config.get('steps')} (batch {config.get('batch_size')}, lr {config.get('lr')}, "
              f"seed {config.get('seed')})",
              f"- Best dev metric: {metric} = {score:.4f} at step {step}",
              f"- Software: {environment.summary(software or environment.versions())}", "",
              "## Usage", "", "With sentence-transformers alone (BERT-CF is not needed):", "",
              "```python", "from sentence_transformers import CrossEncoder", "",
              'model = CrossEncoder("PATH")',
              'scores = model.predict([("A man plays a guitar.", "Someone plays music.")])', "```", "",
              "With BERT-CF:", "", "```python", "from bertcf import CrossEncoder", "",
              'model = CrossEncoder.from_pretrained("PATH")',
              'scores = model.predict([("A man plays a guitar.", "Someone plays music.")])', "```", ""]
    return "\n".join(lines)


def write_cross_encoder_card(directory, config: dict, metric: str, score: float, step: int) -> None:
    """:func:`cross_encoder_card` written into ``directory``."""
    write_text_atomic(Path(directory) / CARD_FILE, cross_encoder_card(config, metric, score, step))
