"""The model card (``best/README.md``) of a checkpoint, in sentence-transformers' conventions: YAML
metadata for the Hub, then what produced the checkpoint (command, base model, stage and method,
data, steps), its best dev metric, and how to load it with BERT-CF and with sentence-transformers."""
from __future__ import annotations

from pathlib import Path

from .files import write_text_atomic

CARD_FILE = "README.md"


def model_card(config: dict, metric: str, score: float, step: int) -> str:
    """The card of a checkpoint chosen at ``step`` by ``metric`` = ``score``, from the run's ``config``
    (its config.json: every setting, and ``command``, the command line)."""
    base = config.get("init") or config.get("encoder") or config.get("model")
    what = (f"stage `{config['stage']}`, method `{config['method']}`" if "stage" in config
            else "multitask fine-tuning (SST-5, QQP, STS)")
    corpus = config.get("corpus") or ("the task train files' sentences" if config.get("corpus_from_tasks") else None)
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity", "tags:",
             "- sentence-transformers", "- sentence-similarity", "- feature-extraction", "- bertcf",
             f"base_model: {base}", "---", "",
             "# A BERT-CF sentence encoder", "",
             "Trained with BERT-CF (Contrastive Flows for MultiTask-BERT) on minBERT, a BERT written from scratch.", "",
             "## Training", "",
             f"- Command: `{config.get('command', '(not recorded)')}`",
             f"- Base model: `{base}`",
             f"- What: {what}",
             f"- Data: `{config.get('data_dir')}`" + (f"; pretraining corpus: {corpus}" if corpus else ""),
             f"- Steps: {config.get('steps')} (batch {config.get('batch_size')}, lr {config.get('lr')}, "
             f"seed {config.get('seed')})",
             f"- Best dev metric: {metric} = {score:.4f} at step {step}", "",
             "## Usage", "",
             "With BERT-CF:", "", "```python", "from bertcf import SentenceEncoder", "",
             'encoder = SentenceEncoder.from_pretrained("PATH")',
             'vectors = encoder.encode(["A man plays a guitar.", "Someone plays music."])', "```", "",
             "With sentence-transformers (BERT-CF installed: a checkpoint with a flow loads its module, "
             "`bertcf.st.Flow`, which needs `trust_remote_code=True`):", "",
             "```python", "from sentence_transformers import SentenceTransformer", "",
             'model = SentenceTransformer("PATH", trust_remote_code=True)',
             'vectors = model.encode(["A man plays a guitar.", "Someone plays music."])', "```", ""]
    return "\n".join(lines)


def write_model_card(directory, config: dict, metric: str, score: float, step: int) -> None:
    write_text_atomic(Path(directory) / CARD_FILE, model_card(config, metric, score, step))


def add_experiment_row(directory, row: str, command: str) -> None:
    """Say in a checkpoint's card which row of the experiments' tables it is."""
    card = Path(directory) / CARD_FILE
    if card.is_file():
        write_text_atomic(card, card.read_text() + f"\n## In BERT-CF's experiments\n\nThe row **{row}** of "
                                                   f"`{command}`.\n")
