"""Issue [surface] acceptance 1: lm-eval's `local-completions` runs a small task from local data against a node.

lm-eval is the real client: its loglikelihood requests are `/v1/completions` with token-id prompts,
`echo: true`, `logprobs: 1` and `max_tokens: 1`, and it reads the continuation's logprobs from the
echoed prompt's. Its tokenizer is the node's own (the `remote` backend, found through
`GET /tokenizer_info`, encoding with `/tokenize` and decoding with `/detokenize`), so no Hugging
Face files are needed. The task (a multiple-choice quiz of eight lines, written here) runs against
the run's shared llama.cpp node (SmolLM2-135M-Instruct).

lm-eval is heavy (datasets, scikit-learn, ...) and not a dependency of this repository: the test
runs where `SKULK_LM_EVAL` names its `lm_eval` executable, or one is on PATH or in this
interpreter's bin folder (`pip install "lm-eval[api]"`), and is skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from skulk_testing.nodes import NodeProcess

from tests.conftest import CHAT_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

QUIZ = [
    ("The capital of France is", ["Paris", "Berlin", "Madrid"], 0),
    ("The capital of Germany is", ["Rome", "Berlin", "Lisbon"], 1),
    ("The capital of Italy is", ["Vienna", "Oslo", "Rome"], 2),
    ("Water freezes at zero degrees", ["Celsius", "banana", "guitar"], 0),
    ("The opposite of hot is", ["cold", "seven", "purple"], 0),
    ("Two plus two equals", ["four", "lamp", "green"], 0),
    ("The sun rises in the", ["east", "piano", "spoon"], 0),
    ("A week has seven", ["days", "cars", "trees"], 0),
]
TASK = """task: skulk_quiz
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def lm_eval_executable() -> str | None:
    named = os.environ.get("SKULK_LM_EVAL")
    if named:
        return named
    here = Path(sys.executable).parent / "lm_eval"
    return str(here) if here.exists() else shutil.which("lm_eval")


def test_lm_eval_local_completions_runs_a_local_task(llama_node: NodeProcess, tmp_path: Path) -> None:
    lm_eval = lm_eval_executable()
    if lm_eval is None:
        pytest.skip('lm-eval is not installed: pip install "lm-eval[api]" or set SKULK_LM_EVAL')
    data = tmp_path / "quiz.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUIZ))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "skulk_quiz.yaml").write_text(TASK.format(data=data))
    out = tmp_path / "out"
    model_args = f"model={CHAT_MODEL},base_url={llama_node.url}/v1/completions,max_retries=1"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    # --batch_size 4: lm-eval sends lists of token-id prompts, one choice each
    args = ["--model", "local-completions", "--model_args", model_args, "--tasks", "skulk_quiz", "--batch_size", "4"]
    done = subprocess.run(
        [lm_eval, "run", *args, "--include_path", str(tasks), "--output_path", str(out), "--log_samples"],
        capture_output=True,
        text=True,
        env=env,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "Using remote tokenizer" in done.stderr + done.stdout  # the node's /tokenize, not a download
    results = json.loads(next(out.rglob("results_*.json")).read_text())
    acc = results["results"]["skulk_quiz"]["acc,none"]
    samples = [json.loads(line) for f in out.rglob("samples_skulk_quiz_*.jsonl") for line in f.read_text().splitlines()]
    assert len(samples) == len(QUIZ) and 0.0 <= acc <= 1.0
    for sample in samples:  # every choice scored: a finite, negative loglikelihood
        scores = [float(r[0]) for r in sample["filtered_resps"]]
        assert len(scores) == 3 and all(s < 0 for s in scores), sample
    print(f"lm-eval skulk_quiz acc={acc:.3f} on {CHAT_MODEL}")  # the run's record of what the model scored
    assert acc >= 0.5, f"SmolLM2 answered {acc:.0%} of an easy quiz: are the echoed logprobs the model's?"
