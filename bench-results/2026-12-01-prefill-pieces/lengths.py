"""tests/data/sharegpt-prompt-lengths.json: the prompt tokens of the first 256 ShareGPT first
turns in the demo model's chat template (lengths only). Needs the demo model and the staged
ShareGPT first turns (../shared/DATA.md).

    python bench-results/2026-12-01-prefill-pieces/lengths.py
"""
import json
from pathlib import Path

from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(Path.home() / ".cache/specctl/models/smollm2-135m-instruct")
turns = json.loads((Path.home() / ".cache/specctl/data/sharegpt_first_turns.json").read_text())
lengths = []
for x in turns[:256]:
    text = tok.apply_chat_template([{"role": "user", "content": x}], add_generation_prompt=True,
                                   tokenize=False)
    lengths.append(len(tok(text, add_special_tokens=False)["input_ids"]))
about = ("Prompt tokens of the first 256 ShareGPT first turns (ShareGPT_V3_unfiltered_cleaned_split, "
         "sharegpt_first_turns.json as DATA.md stages it) in the demo model's chat template "
         "(SmolLM2-135M-Instruct, add_generation_prompt): lengths only, no text. Made by "
         "bench-results/2026-12-01-prefill-pieces/lengths.py.")
Path("tests/data/sharegpt-prompt-lengths.json").write_text(json.dumps({"about": about,
                                                                       "lengths": lengths}))
