"""The local harness tasks of the harness tests (LAMBADA-, ARC-, HellaSwag- and wikitext-shaped),
their JSONL data (committed in tests/golden/harness/), and the requests of the edge cases.

Shared by tests/golden/make_harness_golden.py (which runs lm-evaluation-harness's HF backend on
them), the default tests in this folder (which compare ppl_jax with the stored numbers) and
tests/reference/test_harness_live.py. Imports neither ppl_jax nor lm_eval.
"""

from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden", "harness")
GOLDEN_FILE = os.path.join(GOLDEN, "harness_golden.json")
MODELS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "golden", "references")
FAMILIES = ("gpt2", "llama")  # no BOS (EOT is the prefix) | BOS <s> added by the tokenizer
MAX_LENGTH = 32  # the harness's max_length (ppl_jax's seq_len) of every run: contexts truncate
BATCH_SIZE = 4

# task name -> (its YAML, less the data file; its data file under tests/golden/harness/)
TASKS = {
    "lambada_local": (
        """task: lambada_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
        "lambada_local.jsonl",
    ),
    "arc_local": (
        """task: arc_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
        "arc_local.jsonl",
    ),
    "hellaswag_local": (
        """task: hellaswag_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{gold}}}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""",
        "hellaswag_local.jsonl",
    ),
    "wikitext_local": (
        """task: wikitext_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{page}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
""",
        "wikitext_local.jsonl",
    ),
}
TASK_NAMES = tuple(TASKS)

# (context, continuation) requests of the edge cases, scored directly by each backend.
EDGE_REQUESTS = [
    ("", "The game began development in 2010"),  # empty context: the prefix token
    ("", " a leading space"),  # empty context, a continuation starting with a space
    ("The game began", " development in 2010"),  # a continuation starting with a space
    ("The game began ", "development in 2010"),  # the context's trailing space moves over
    ("Valkyria Chronicles " * 12 + "was", " praised"),  # a context longer than the window
    ("A", " large team of writers handled the script"),  # a long continuation
    ("<|endoftext|>Character designer", " Raita Honjou"),  # text starting with the prefix
    ("Café naïve", " — déjà vu 😀 costs €5"),  # multibyte UTF-8
]
# A continuation longer than the window: the harness asserts, ppl_jax refuses with a sentence.
TOO_LONG = ("The game", " began development in 2010" * 12)


def write_tasks(folder: str) -> str:
    """Writes the task YAMLs into `folder`, their data files named by absolute path (the
    harness's `--include_path`); returns `folder`."""
    os.makedirs(folder, exist_ok=True)
    for name, (yaml, data) in TASKS.items():
        with open(os.path.join(folder, f"{name}.yaml"), "w", encoding="utf-8") as f:
            f.write(yaml.format(data=json.dumps(os.path.join(GOLDEN, data))))
    return folder


def load_golden() -> dict:
    with open(GOLDEN_FILE, encoding="utf-8") as f:
        return json.load(f)
