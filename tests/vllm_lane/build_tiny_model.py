"""A tiny random Llama with a locally trained byte-level BPE tokenizer: no hub access.

Run with the lane's vLLM venv (it has torch, tokenizers and transformers) and HF_HUB_OFFLINE=1:
`python build_tiny_model.py OUT`. head_dim is 32, because vLLM's CPU attention refuses 16 only
at the first request, after /health already answers.
"""

from __future__ import annotations

import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HIDDEN = 128
LAYERS = 2
HEADS = 4
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [("The quick brown fox jumps over the lazy dog. Hello world! "
               "vLLM serves language models. 0123456789 ") * 4] * 200
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    fast = tokenizer()
    fast.save_pretrained(out)
    # the vocabulary is the tokenizer's, so every sampled id decodes
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=HIDDEN, intermediate_size=HIDDEN * 2,
                      num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=HEADS, max_position_embeddings=512,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    main(sys.argv[1])
