"""A random EAGLE-3 drafter for the tiny Llama, with the checkpoint names vLLM loads.

`python build_tiny_eagle3.py TARGET OUT`. It has no embed_tokens (vLLM shares the target's) and
pins the auxiliary hidden-state layers to 0, 1, 2: the defaults (2, n//2, n-3) are invalid for a
2-layer target and kill the engine at the first request, after /health already answers.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file


def main(target: str, out: str) -> None:
    with open(os.path.join(target, "config.json")) as f:
        tc = json.load(f)
    hidden, vocab, heads, kv = (tc["hidden_size"], tc["vocab_size"], tc["num_attention_heads"],
                                tc["num_key_value_heads"])
    head_dim, inter = hidden // heads, tc["intermediate_size"]
    os.makedirs(out, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
           "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
           "hidden_act": "silu", "rms_norm_eps": 1e-6,
           "max_position_embeddings": tc["max_position_embeddings"], "vocab_size": vocab,
           "draft_vocab_size": vocab, "target_hidden_size": hidden,
           "tie_word_embeddings": False, "bos_token_id": tc["bos_token_id"],
           "eos_token_id": tc["eos_token_id"], "rope_theta": 10000.0, "torch_dtype": "float32",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    gen = torch.Generator().manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).contiguous()

    attn_in = 2 * hidden  # EAGLE-3's midlayer attends over [embedding; fused hidden state]
    weights = {
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, attn_in),
        "midlayer.self_attn.k_proj.weight": rand(kv * head_dim, attn_in),
        "midlayer.self_attn.v_proj.weight": rand(kv * head_dim, attn_in),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "fc.weight": rand(hidden, 3 * hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": rand(vocab, hidden),
    }
    save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
