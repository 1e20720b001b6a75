"""Build the lab's tiny GLM-architecture model, with no hub access.

Usage: tiny_model.py OUT [--tp 2|4]

Writes OUT: a random-weight Glm4MoeForCausalLM (GLM-4.5 MoE layout: routed + shared experts),
a tokenizer trained here on local text, and a GLM-style chat template with tool-call markup.

--tp says how many ranks the model's shapes must divide by. 2 (the default) is the two-node lab's model.
4 is the four-node lab's: twice the attention heads and MLP widths, so that each of four ranks holds the
same shapes a rank of the two-node model holds (one head of 32, the CPU attention backend supports few head
sizes; a 64-wide dense MLP and 16-wide experts). The same tokenizer and template; other random weights.

The tokenizer is character-level BPE (Metaspace), not byte-level: every token is a whole string of Unicode
characters, so no sequence of generated ids can decode to invalid UTF-8 or U+FFFD. A U+FFFD in the engine's
output is therefore a real fault, which is what the verify role's token-integrity check relies on.
Characters outside the trained alphabet map to <unk>, which decodes to the text "<unk>".
"""
import argparse
import glob
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM, PreTrainedTokenizerFast

VOCAB = 2048
SPECIALS = [
    "<|endoftext|>", "<unk>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
]
# Several scripts, so that non-English prompts tokenize to real characters rather than <unk>.
MULTILINGUAL = [
    "Bonjour, comment ça va ? Très bien, merci. Élève, naïve, garçon, où, déjà.",
    "Grüß Gott! Schöne Grüße aus München, Straße, Mädchen, Übung, Öl.",
    "¿Dónde está la estación? Mañana, niño, corazón, acción, pingüino.",
    "Привет, как дела? Спасибо, хорошо. Москва, здравствуйте, мир, язык.",
    "Γεια σου κόσμε. Καλημέρα, ευχαριστώ, αλφάβητο, θάλασσα.",
    "你好，世界。今天天气很好。我们一起学习中文，谢谢你的帮助。模型，服务，测试。",
    "こんにちは、世界。ありがとうございます。日本語のテキストです。カタカナ、ひらがな。",
    "안녕하세요, 세계. 감사합니다. 한국어 문장입니다.",
    "مرحبا بالعالم. شكرا جزيلا. اللغة العربية جميلة.",
    "שלום עולם. תודה רבה. עברית.",
    "नमस्ते दुनिया। धन्यवाद। हिन्दी भाषा।",
    "Xin chào thế giới. Cảm ơn bạn rất nhiều. Tiếng Việt.",
    "Merhaba dünya. Teşekkür ederim. Türkçe, ığdır, şöyle.",
    "Witaj świecie. Dziękuję bardzo. Zażółć gęślą jaźń.",
    "{\"city\": \"Paris\", \"unit\": \"celsius\"} [1, 2, 3] <tool_call>get_weather</tool_call>",
]


def corpus():
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:200]
    for path in files:
        with open(path, encoding="utf-8", errors="ignore") as fh:
            text = fh.read()
        yield text.replace("\ufffd", "")
    for _ in range(50):
        yield from MULTILINGUAL


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, limit_alphabet=1000,
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


TEMPLATE = (
    "[gMASK]<sop>"
    "{% if tools %}<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n"
    "<tools>\n{% for tool in tools %}{{ tool | tojson(ensure_ascii=False) }}\n{% endfor %}</tools>\n\n"
    "For each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value></tool_call>"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>\n{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}<|user|>\n{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|assistant|>\n<think></think>\n{{ m['content'] or '' }}"
    "{% if m.get('tool_calls') %}{% for tc in m['tool_calls'] %}<tool_call>{{ tc['function']['name'] }}"
    "{% set a = tc['function']['arguments'] %}{% if a is mapping %}{% for k, v in a.items() %}"
    "<arg_key>{{ k }}</arg_key><arg_value>{{ v if v is string else v | tojson }}</arg_value>{% endfor %}{% endif %}"
    "</tool_call>{% endfor %}{% endif %}"
    "{% elif m['role'] == 'tool' %}<|observation|><tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}\n<think></think>{% endif %}{% endif %}"
)


# Per --tp: the Glm4MoeConfig fields that differ. Every other field is the same for each.
SHAPES = {
    2: dict(intermediate_size=128, moe_intermediate_size=32, num_attention_heads=2, num_key_value_heads=2),
    4: dict(intermediate_size=256, moe_intermediate_size=64, num_attention_heads=4, num_key_value_heads=4),
}


def build(out: str, tp: int = 2) -> None:
    tok = train_tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", model_max_length=4096)
    fast.chat_template = TEMPLATE
    fast.save_pretrained(out)
    ids = fast.convert_tokens_to_ids
    # Self-check: every id decodes to valid text without U+FFFD.
    for i in range(len(fast)):
        text = fast.decode([i])
        if "\ufffd" in text:
            raise SystemExit(f"token {i} decodes to U+FFFD")
    sample = "Привет 你好 こんにちは"
    if fast.decode(fast.encode(sample, add_special_tokens=False)) != sample:
        raise SystemExit("multilingual round-trip failed")
    cfg = Glm4MoeConfig(
        vocab_size=len(fast), hidden_size=64, num_hidden_layers=2, **SHAPES[tp],
        head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.0, use_qk_norm=False,
        attention_bias=True, partial_rotary_factor=0.5,
        max_position_embeddings=4096, num_nextn_predict_layers=0,
        pad_token_id=ids("<|endoftext|>"),
        eos_token_id=[ids("<|endoftext|>"), ids("<|user|>"), ids("<|observation|>")],
        tie_word_embeddings=False, dtype="bfloat16")
    torch.manual_seed(0)
    model = Glm4MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "generation_config.json"), "w", encoding="utf-8") as fh:
        fh.write('{"temperature": 1.0, "eos_token_id": %s}\n' % list(cfg.eos_token_id))
    print("tiny GLM model:", out, "vocab", len(fast), "params", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Build the lab's tiny GLM-architecture model.")
    parser.add_argument("out")
    parser.add_argument("--tp", type=int, choices=sorted(SHAPES), default=2,
                        help="the number of ranks the shapes divide by (default 2: the two-node lab's model)")
    args = parser.parse_args()
    build(args.out, args.tp)
