"""Writes tests/golden/harness/: the local harness tasks' data and lm-evaluation-harness's own HF
backend's results on them, for the default tests of ppl_jax's harness model (tests/unit/harness/).

    pip install torch==2.13.0 '.[reference]'   # the CPU build of PyTorch first
    python tests/golden/make_harness_golden.py

What it writes (committed):

- `{lambada,arc,hellaswag,wikitext}_local.jsonl`: small LAMBADA-, ARC-, HellaSwag- and
  wikitext-shaped datasets (the task YAMLs are in tests/unit/harness/harness_tasks.py; a test
  writes them with the data files' absolute paths).
- `harness_golden.json`: per model of tests/golden/references/ (`gpt2`: no BOS, EOT is the
  prefix; `llama`: BOS prepended by the tokenizer) and per task, `lm_eval.simple_evaluate` with
  `HFLM` (CPU, float32, `max_length=32`, `batch_size=4`): the task metrics, and per request the
  request's strings, the token ids HFLM scored (context, continuation; rolling: the document),
  and HFLM's answer (log-likelihood, greedy). Also the edge-case requests of `harness_tasks`
  scored by `HFLM.loglikelihood` directly, and whether HFLM refuses the too-long continuation.

tests/reference/test_harness_live.py runs the same comparisons live.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(TESTS, "unit", "harness")]

import harness_tasks as tasks  # noqa: E402

SENTENCES = (
    "The game began development in 2010 , carrying over a large portion of the work done on "
    "Valkyria Chronicles II . While it retained the standard features of the series , it also "
    "underwent multiple adjustments , such as making the game more forgiving for series "
    "newcomers . Character designer Raita Honjou and composer Hitoshi Sakimoto both returned "
    "from previous entries , along with Valkyria Chronicles II director Takeshi Ozawa . A large "
    "team of writers handled the script . The game 's opening theme was sung by May 'n . It met "
    "with positive sales in Japan , and was praised by both Japanese and western critics . After "
    "release , it received downloadable content , along with an expanded edition in November of "
    "that year . It was also adapted into manga and an original video animation series . Due to "
    "low sales of Valkyria Chronicles II , Valkyria Chronicles III was not localized , but a fan "
    "translation compatible with the game 's expanded edition was released in 2014 ."
).split(" . ")

ARC = [
    ("Which part of a plant takes in water from the soil?", ["roots", "leaves", "flowers"], 0),
    ("What do we call frozen water?", ["steam", "ice", "sand", "glass"], 1),
    ("Which object gives off its own light?", ["the Moon", "a mirror", "the Sun"], 2),
    ("What force pulls objects toward Earth?", ["magnetism", "friction", "gravity", "wind"], 2),
    ("Which animal is a mammal?", ["a whale", "a shark", "a trout"], 0),
    ("How many legs does an insect have?", ["four", "six", "eight", "ten"], 1),
    ("Which is a source of renewable energy?", ["coal", "oil", "sunlight"], 2),
    ("What is the boiling point of water at sea level?", ["50 C", "100 C", "150 C"], 1),
]
HELLASWAG = [
    (
        "Cooking: A man stands at the stove. He",
        [
            "stirs the sauce slowly.",
            "jumps over the moon.",
            "reads a book about cars.",
            "paints the fence blue.",
        ],
        0,
    ),
    (
        "Sports: The runner reaches the starting line. She",
        [
            "bakes a cake.",
            "crouches and waits for the signal.",
            "sings an opera.",
            "folds the laundry.",
        ],
        1,
    ),
    (
        "Gardening: A woman kneels by the flower bed. She",
        [
            "drives to the airport.",
            "types an email.",
            "pulls the weeds out by hand.",
            "swims across the lake.",
        ],
        2,
    ),
    (
        "Music: The pianist sits at the piano. He",
        [
            "places his hands on the keys and begins to play.",
            "climbs a tree.",
            "feeds the cat.",
            "washes the car.",
        ],
        0,
    ),
    (
        "Valkyria Chronicles: The team of writers meets. They",
        [
            "handle the script of the game.",
            "plant potatoes.",
            "repair the roof.",
            "run a marathon.",
        ],
        0,
    ),
    (
        "Travel: The family packs the car. They",
        [
            "go to sleep at once.",
            "drive off toward the coast for their holiday.",
            "eat the suitcases.",
            "build a boat.",
        ],
        1,
    ),
]


def write_data() -> None:
    """The JSONL data files (deterministic: run once, commit)."""
    lambada = [{"text": s.strip() + " ."[:0]} for s in SENTENCES if len(s.split()) > 4]
    arc = [
        {
            "id": f"q{i}",
            "question": q,
            "choices": {"text": c, "label": [chr(65 + j) for j in range(len(c))]},
            "answerKey": chr(65 + a),
        }
        for i, (q, c, a) in enumerate(ARC)
    ]
    hellaswag = [{"query": q, "choices": c, "gold": g} for q, c, g in HELLASWAG]
    pages = [" . ".join(SENTENCES[i : i + 3]) + " .\n" for i in range(0, len(SENTENCES), 3)] + [
        "Café naïve — déjà vu 😀 costs €5 ; ok?\n",
        "x",
    ]
    wikitext = [{"page": p} for p in pages]
    for name, rows in (
        ("lambada_local.jsonl", lambada),
        ("arc_local.jsonl", arc),
        ("hellaswag_local.jsonl", hellaswag),
        ("wikitext_local.jsonl", wikitext),
    ):
        with open(os.path.join(tasks.GOLDEN, name), "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


def hf_model(family: str):
    from lm_eval.models.huggingface import HFLM

    path = os.path.join(tasks.MODELS, family)

    class Recording(HFLM):
        """HFLM that records the token ids of every request it scores (its own tokenization)."""

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, override_bs=None):
            self.recorded.extend([list(r[1]), list(r[2])] for r in requests)
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)

    lm = Recording(
        pretrained=path,
        tokenizer=path,
        max_length=tasks.MAX_LENGTH,
        batch_size=tasks.BATCH_SIZE,
        device="cpu",
        dtype="float32",
    )
    lm.recorded = []
    return lm


METRICS = ("acc", "acc_norm", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")


def task_results(lm, include: str) -> dict:
    """simple_evaluate on every local task: metrics and per-request strings and answers."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=list(tasks.TASK_NAMES),
        task_manager=TaskManager(include_path=include, include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    results = {}
    for name in tasks.TASK_NAMES:
        metrics = {
            m: out["results"][name][f"{m},none"]
            for m in METRICS
            if f"{m},none" in out["results"][name]
        }
        requests = []
        for sample in sorted(out["samples"][name], key=lambda s: s["doc_id"]):
            for args, resp in zip(sample["arguments"], sample["resps"], strict=True):
                strings = [args[k] for k in sorted(args)] if isinstance(args, dict) else args
                requests.append({"args": list(strings), "answer": resp[0]})
        results[name] = {"metrics": metrics, "requests": requests}
    return results


GREEDY_CONTEXTS = ("The game began", "Valkyria Chronicles", "Question: What do we call", "A")


def greedy_requests(lm) -> list[tuple[str, str]]:
    """Requests whose continuation is the model's own greedy 1, 2 or 3 tokens after a context
    (decoded to text; kept where the harness scores it greedy), so that greedy flags are tested
    true as well as false."""
    import torch
    from lm_eval.api.instance import Instance

    out = []
    for context in GREEDY_CONTEXTS:
        ids = lm.tok_encode(context)
        for n in (1, 2, 3):
            with torch.no_grad():
                x = torch.tensor([ids])
                for _ in range(n):
                    nxt = lm.model(x).logits[0, -1].argmax()
                    x = torch.cat([x, nxt.view(1, 1)], dim=1)
            text = lm.tokenizer.decode(x[0, len(ids) :].tolist())
            pair = (context, text)
            ((_, greedy),) = lm.loglikelihood([Instance("loglikelihood", {}, pair, 0)], True)
            if greedy:
                out.append(pair)
    return out


def edge_results(lm) -> dict:
    from lm_eval.api.instance import Instance

    pairs = list(tasks.EDGE_REQUESTS) + greedy_requests(lm)
    lm.recorded = []
    # One call per request: HFLM's one-token-continuation cache (`group_by="contexts"`) groups
    # requests whose context + continuation[:-1] tokens agree, and then gathers a shorter
    # continuation's log-probabilities from the first positions of the longest one's (its
    # greedy check slices the trailing positions, the gather does not): ("", "The game began
    # development in 2010") and ("The game began", " development in 2010") are the same tokens
    # for the Llama model (BOS is the prefix), and in one call the second gets a wrong value.
    answers = [
        lm.loglikelihood([Instance("loglikelihood", {}, pair, i)], disable_tqdm=True)[0]
        for i, pair in enumerate(pairs)
    ]
    try:
        lm.loglikelihood([Instance("loglikelihood", {}, tasks.TOO_LONG, 0)], disable_tqdm=True)
        refused = False
    except AssertionError:
        refused = True
    return {
        "requests": [list(p) for p in pairs],
        "tokens": lm.recorded[: len(pairs)],
        "answers": [list(a) for a in answers],
        "too_long_refused": refused,
        "prefix_token_id": int(lm.prefix_token_id),
    }


def numbers(include: str) -> dict:
    import lm_eval
    import torch
    import transformers

    torch.set_num_threads(1)
    out = {
        "generated_with": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lm_eval": lm_eval.__version__,
        },
        "max_length": tasks.MAX_LENGTH,
        "families": {},
    }
    for family in tasks.FAMILIES:
        lm = hf_model(family)
        lm.recorded = []
        per_task = task_results(lm, include)
        rolling = [lm.tok_encode(r["args"][0]) for r in per_task["wikitext_local"]["requests"]]
        # The token ids HFLM scored per loglikelihood request, in the order the tasks ran.
        out["families"][family] = {
            "tasks": per_task,
            "rolling_tokens": rolling,
            "edge": edge_results(lm),
        }
    return out


def main() -> None:
    import tempfile

    write_data()
    with tempfile.TemporaryDirectory() as tmp:
        result = numbers(tasks.write_tasks(tmp))
    with open(tasks.GOLDEN_FILE, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{tasks.GOLDEN_FILE}: {os.path.getsize(tasks.GOLDEN_FILE) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
