"""Tiny random Llama-family checkpoints with a real (byte-level BPE) tokenizer, for fast tests."""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TEXT = """The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins
with a single step. To be or not to be, that is the question. All that glitters is not gold.
What is the capital of France? Paris is the capital of France. Write a short poem about the sea.
Explain how a transformer language model works, step by step, in simple words for a child.
""" * 4


def make_tokenizer(out: Path, vocab_size: int = 320, texts: list[str] | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts or [TEXT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   bos_token="<|im_start|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    return fast


def make_tiny_model(out: Path, kind: str = "llama", layers: int = 4, seed: int = 0,
                    hidden: int = 64, heads: int = 4, kv_heads: int = 2, tie: bool = False,
                    rope_scaling: dict | None = None, vocab_size: int = 320,
                    texts: list[str] | None = None) -> Path:
    """Save a random HF model + tokenizer (BPE of about vocab_size tokens trained on texts)
    under `out` and return it."""
    from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out, vocab_size, texts)
    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 3,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie,
                  eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    torch.manual_seed(seed)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        extra = {"rope_scaling": rope_scaling} if rope_scaling else {}
        model = LlamaForCausalLM(LlamaConfig(**common, **extra))
    with torch.no_grad():  # make the random model less uniform so greedy paths are decisive
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
        if not tie:   # a peakier head: next-token distributions like a trained model's
            model.lm_head.weight.mul_(4.0)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=common["eos_token_id"]).save_pretrained(out)
    return out
