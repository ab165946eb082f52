"""A tiny Llama model directory made on the spot: config, tokenizer, chat template; no weights.

vLLM serves it with `--load-format dummy` (random weights), so nothing is
downloaded. The tokenizer is a byte-level BPE trained with the `tokenizers`
library on text generated here from a fixed seed, so the same directory comes
out on every machine (its `fingerprint` says so). The chat template is
ChatML with Hermes-style tools (`<tools>`, `<tool_call>`, `<tool_response>`):
what `--tool-call-parser hermes` reads, the parser that deploy/vllm/serve.sh
and Qwen2.5 use.

Run it with the vLLM venv's Python (it needs `tokenizers`):

```bash
python benchmarks/vllm_cpu/model.py /tmp/tiny-llama
```
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

__all__ = ("CHAT_TEMPLATE", "MODEL_CONFIG", "make_model")

VOCAB_SIZE = 4096
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Added (not special) tokens: the hermes parser looks them up in the vocabulary and
# they must survive skip_special_tokens, as in Qwen2.5's tokenizer.
ADDED = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
"""A Llama of 2 layers, hidden 128: 2 KV heads x 32 dims, so 512 bytes of bf16 KV per token."""

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% if not loop.first %}<|im_start|>system\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n{% if message.content %}{{ message.content }}{% endif %}"
    "{% for tc in message.tool_calls or [] %}"
    "{% set f = tc.function if tc.function is defined else tc %}"
    '\n<tool_call>\n{"name": "{{ f.name }}", "arguments": '
    "{% if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}"
    "{% endif %}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML with Hermes tools (Qwen2.5's layout, shortened)."""

_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "be",
    "are",
    "it",
    "an",
    "or",
    "was",
    "which",
    "agent",
    "tool",
    "call",
    "result",
    "file",
    "review",
    "issue",
    "fix",
    "document",
    "extract",
    "summary",
    "answer",
    "json",
    "key",
    "value",
    "name",
    "arguments",
    "function",
    "search",
    "report",
    "code",
    "test",
    "error",
    "token",
    "prefix",
    "cache",
    "request",
    "model",
    "server",
    "batch",
    "schedule",
    "queue",
    "block",
    "memory",
    "engine",
    "step",
    "decode",
    "prefill",
]


def _corpus(seed: int = 0, lines: int = 20000) -> list[str]:
    """Deterministic training text: English-like words, JSON, digits, punctuation."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if i % 3 == 0:
            obj = {rng.choice(_WORDS): rng.choice(_WORDS), "id": rng.randint(0, 99999)}
            words.append(json.dumps(obj))
        if i % 5 == 0:
            words.append(f"{rng.random():.6f} {rng.randint(0, 10**9)}")
        out.append(" ".join(words) + rng.choice((".", ",", ";", ":", "?", "!")))
    return out


def make_model(path: str | Path) -> str:
    """Write the model directory at `path` (made if missing); returns its fingerprint.

    The fingerprint is a sha256 over the files written: equal on every machine
    that runs the same `tokenizers` version.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED),
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens(list(ADDED))
    tok.save(str(out / "tokenizer.json"))
    config = dict(MODEL_CONFIG, vocab_size=tok.get_vocab_size())
    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 2},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "model_max_length": config["max_position_embeddings"],
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
        "special_tokens_map.json": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    }
    for name, body in files.items():
        (out / name).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    digest = hashlib.sha256()
    for name in sorted(p.name for p in out.iterdir() if p.is_file()):
        digest.update(name.encode() + b"\0" + (out / name).read_bytes())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    print(make_model(sys.argv[1]))
