#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ (committed; rerun after a format change).

python3 tests/fuzz/make_seeds.py [SHARED_DIR]   (default: ../shared beside the repository)
Seeds are small well-formed inputs of each format plus near-misses (truncations, wrong types,
overflowing sizes) and the inputs of past findings, which stay as regression tests.
"""
import hashlib
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "shared")
OUT = os.path.join(HERE, "corpus")


def write(fuzzer, name, data):
    d = os.path.join(OUT, fuzzer)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- replay records (buffer/record_codec.h) ----

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def string(s):
    return varint(len(s)) + s


def record(domain=b"prose", tokens=(1, 450, 31, 7), prompt_len=2, top_k=2, steps=(), seed=42):
    p = varint(1700000000000000) + string(domain) + string(b"cmpl-1") + varint(3)
    p += varint(5) + string(b"target-6m")
    p += struct.pack("<f", 0.8) + varint(40) + struct.pack("<f", 0.9) + varint(seed)
    p += varint(prompt_len) + varint(len(tokens)) + b"".join(varint(t & 0xFFFFFFFF) for t in tokens)
    p += varint(top_k) + varint(len(steps))
    for start, draft, accepted in steps:
        k = len(draft)
        p += varint(start) + varint(k) + b"".join(varint(t & 0xFFFFFFFF) for t in draft)
        p += varint(accepted)
        n = (k + 1) * top_k
        p += b"".join(varint(i % 4096) for i in range(n))
        p += b"".join(struct.pack("<H", 0xBC00 + i) for i in range(n))  # fp16 log-probs
        p += b"".join(struct.pack("<f", 0.125) for _ in range(k + 1))
    return bytes([0xB5, 1]) + struct.pack("<I", crc32c(p)) + p


def record_seeds():
    write("record", "empty_steps", record())
    write("record", "two_steps", record(tokens=(1, 5, 6, 7, 8, 9), steps=((2, (6, 7), 2), (4, (9, 3, 4), 1))))
    write("record", "negative_ids", record(tokens=(1, -1, -2147483648), steps=((1, (-5,), 0),)))
    write("record", "top_k_zero", record(top_k=0, steps=((1, (3,), 1),)))
    good = record(steps=((2, (31,), 1),))
    write("record", "truncated", good[:-3])
    write("record", "bad_checksum", good[:2] + b"\0\0\0\0" + good[6:])
    write("record", "bad_version", good[:1] + b"\x02" + good[2:])
    write("record", "header_only", good[:6])


# ---- safetensors headers (common/base/safetensors_header.h) ----

def safetensors(header, data=b""):
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    w = "safetensors_header"
    write(w, "f32_2x3", safetensors({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, bytes(24)))
    write(w, "mixed", safetensors({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
        "b": {"dtype": "BF16", "shape": [], "data_offsets": [8, 10]},
        "c": {"dtype": "I64", "shape": [1, 2], "data_offsets": [10, 26]},
        "d": {"dtype": "I32", "shape": [0, 5], "data_offsets": [26, 26]}}, bytes(26)))
    write(w, "unknown_dtype", safetensors({"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)))
    write(w, "past_end", safetensors({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)))
    write(w, "header_too_long", struct.pack("<Q", 1 << 40) + b"{}")
    write(w, "not_object", safetensors([1, 2, 3]))
    write(w, "short", b"\x02\0\0")
    # Regressions: shapes whose element count overflows 64 bits (to 0 here), or does not fit int64.
    write(w, "shape_overflow", safetensors({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}))
    write(w, "shape_above_int64", safetensors({"x": {"dtype": "I32", "shape": [18446744073709551615, 0], "data_offsets": [0, 0]}}))


# ---- config.json (common/tokenizer/model_config.h) ----

def config_seeds():
    for m in ("target-6m", "draft-prose-1m", "draft-mix-1m"):
        with open(os.path.join(SHARED, "models", m, "config.json"), "rb") as f:
            write("model_config", m, f.read())
    base = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 5,
            "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 512}
    write("model_config", "minimal", json.dumps(base))
    write("model_config", "eos_list_head_dim", json.dumps(dict(base, eos_token_id=[2, 7], head_dim=16)))
    write("model_config", "rope_scaling", json.dumps(dict(base, rope_scaling={"type": "linear"})))
    write("model_config", "wrong_type", json.dumps(dict(base, hidden_size="64")))
    write("model_config", "float_size", json.dumps(dict(base, vocab_size=1e300)))
    write("model_config", "negative_head_dim", json.dumps(dict(base, head_dim=-2)))
    # The families' real layouts (../shared/models/zoo) and near-misses of their keys.
    for family in ("llama3", "qwen2", "qwen3", "mistral"):
        with open(os.path.join(SHARED, "models", "zoo", family + "-target", "config.json"), "rb") as f:
            write("model_config", "zoo_" + family, f.read())
    write("model_config", "llama3_bad_frequencies", json.dumps(dict(
        base, rope_scaling={"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
                            "high_freq_factor": 1, "original_max_position_embeddings": 0})))
    write("model_config", "qwen2_layer_types", json.dumps(dict(
        base, architectures=["Qwen2ForCausalLM"], model_type="qwen2", use_sliding_window=True,
        sliding_window=64, layer_types=["full_attention"] * 4 + ["sliding_attention"])))
    write("model_config", "rope_parameters", json.dumps(dict(
        base, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})))


# ---- an EAGLE-3 head's config.json (common/model/eagle3_config.h) ----

def eagle3_config_seeds():
    with open(os.path.join(HERE, "..", "common", "data", "eagle3_published_layout.json")) as f:
        layout = json.load(f)
    head = layout["config"]  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's
    write("eagle3_config", "llama31_8b", json.dumps(head, indent=2))
    for other in layout["others"]:
        write("eagle3_config", other["name"], json.dumps(other["config"], indent=2))
    small = dict(head, vocab_size=512, draft_vocab_size=64, hidden_size=64, intermediate_size=172,
                 num_attention_heads=8, num_key_value_heads=4)
    write("eagle3_config", "both_forms", json.dumps(dict(
        small, eagle_aux_hidden_state_layer_ids=[1, 3, 5],
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 4], "use_aux_hidden_state": True})))
    write("eagle3_config", "forms_disagree", json.dumps(dict(
        small, eagle_aux_hidden_state_layer_ids=[1, 3, 5],
        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 5]})))
    write("eagle3_config", "aux_unsorted", json.dumps(dict(small, eagle_aux_hidden_state_layer_ids=[5, 1, 3])))
    write("eagle3_config", "aux_huge", json.dumps(dict(
        small, eagle_config={"eagle_aux_hidden_state_layer_ids": [2147483647, -2147483648, 1e300]})))
    write("eagle3_config", "llama3_rope", json.dumps(dict(small, architectures=["Eagle3LlamaForCausalLM"],
        rope_theta=500000.0, norm_before_residual=True, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192})))
    write("eagle3_config", "aux_int_max", json.dumps(dict(
        small, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 2147483647]})))
    write("eagle3_config", "draft_vocab_too_big", json.dumps(dict(small, draft_vocab_size=513)))
    write("eagle3_config", "narrow_head", json.dumps(dict(small, target_hidden_size=128)))
    write("eagle3_config", "two_layers", json.dumps(dict(small, num_hidden_layers=2)))


# ---- generation_config.json (common/tokenizer/generation_config.h) ----

def generation_config_seeds():
    for family in ("llama3", "qwen2", "qwen3", "mistral"):
        with open(os.path.join(SHARED, "models", "zoo", family + "-target", "generation_config.json"),
                  "rb") as f:
            write("generation_config", "zoo_" + family, f.read())
    write("generation_config", "eos_list", json.dumps({"eos_token_id": [2, 7, 4095], "top_k": 0}))
    write("generation_config", "greedy", json.dumps({"do_sample": False, "temperature": 0.7}))
    write("generation_config", "wrong_types", json.dumps({"top_p": "most", "max_new_tokens": 1e300}))
    write("generation_config", "penalties", json.dumps({"repetition_penalty": 1.1, "min_p": 0.05}))
    # A fuzzer find (2026-12-02): a temperature past float's range parsed, then made an inf.
    write("generation_config", "huge_temperature", '{"do_sample": false, "temperature": 0.7e+300}')


# ---- draft channel (common/channel/draft_channel.h) ----

def bundle(files):
    out = b"SPECLOOP-CKPT 1\n"
    for name, data in files:
        out += name.encode() + b" " + str(len(data)).encode() + b"\n" + data
    return out


def channel_seeds():
    w = "draft_channel"
    sha = hashlib.sha256(b"bundle").hexdigest()
    write(w, "announcement", json.dumps({"version": 3, "sha256": sha, "bytes": 4096, "config_sha256": sha}))
    write(w, "announcement_bad_sha", json.dumps({"version": 1, "sha256": sha.upper(), "bytes": 1}))
    write(w, "latest_reply", json.dumps({"ok": True, "request": "latest", "version": 2, "sha256": sha, "bytes": 10, "config_sha256": ""}))
    write(w, "version_name", "v000042")
    write(w, "version_name_bad", "v12/..")
    cfg = b'{"vocab_size": 4096}'
    meta = json.dumps({"version": 1, "sha256": hashlib.sha256(b"weights").hexdigest()}).encode()
    files = [("config.json", cfg), ("meta.json", meta), ("model.safetensors", b"weights")]
    write(w, "bundle", bundle(files))
    write(w, "bundle_reordered", bundle(files[::-1]))
    write(w, "bundle_truncated", bundle(files)[:-2])
    write(w, "bundle_repeated", bundle(files[:2] + files[:1]))
    # Regression: a 22-digit size made std::stoull throw out of UnpackCheckpointBundle.
    write(w, "bundle_size_overflow", b"SPECLOOP-CKPT 1\nconfig.json 2111111111111111111110\n{}")


# ---- tokenizers (common/tokenizer/tokenizer.h): first byte picks the tokenizer ----

def tokenizer_seeds():
    texts = {
        "prose": "Once upon a time, there was a little girl named Lily.\n",
        "python": "def main(argv):\n    return sum(x * 2 for x in argv)  # ok\n",
        "unicode": "naïve café — 日本語 😀 \t\n  ",
    }
    for sel, tok in ((0, "sp"), (1, "llama2c")):
        for name, t in texts.items():
            write("tokenizer", f"{tok}_{name}", bytes([sel]) + t.encode())
        write("tokenizer", f"{tok}_ids", bytes([sel]) + struct.pack("<8i", 1, 450, 29871, 13, 3, 258, -1, 2147483647))
    write("tokenizer", "invalid_utf8", b"\0\xff\xfe\xc3\x28\xe2\x82")


# ---- POST /v1/completions: first line is X-Domain, the rest the body ----

def completion_seeds():
    w = "completion_request"
    write(w, "minimal", "\n" + json.dumps({"prompt": "Once upon a time", "max_tokens": 8}))
    write(w, "full", "python\n" + json.dumps({
        "model": "target-6m", "prompt": ["def main("], "max_tokens": 16, "temperature": 0.8,
        "top_p": 0.9, "top_k": 40, "stop": ["\n\n", "###"], "seed": 3, "stream": True,
        "ignore_eos": False, "n": 1, "echo": False, "logprobs": 0, "domain": "python"}))
    write(w, "header_domain", "legal\n" + json.dumps({"prompt": "The party of the first part", "max_tokens": 4}))
    write(w, "bad_domain", "a b\n" + json.dumps({"prompt": "x"}))
    write(w, "unknown_model", "\n" + json.dumps({"model": "gpt-4", "prompt": "x"}))
    write(w, "too_long", "\n" + json.dumps({"prompt": "word " * 700}))
    write(w, "wrong_types", "\n" + json.dumps({"prompt": 5, "max_tokens": "8", "temperature": None}))
    write(w, "float_ints", "\n" + json.dumps({"prompt": "x", "max_tokens": 16.0, "seed": -1e15, "top_k": -1}))
    write(w, "not_json", "\n{\"prompt\": ")


# ---- raw HTTP requests (cpp-httplib's parser, then the completion route) ----

def http(method, path, headers=(), body=b""):
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n".encode()
    for h in headers:
        head += h.encode() + b"\r\n"
    if body:
        head += f"Content-Length: {len(body)}\r\n".encode()
    return head + b"\r\n" + body


def http_seeds():
    w = "http_request"
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4}).encode()
    write(w, "post", http("POST", "/v1/completions", ["Content-Type: application/json"], body))
    write(w, "post_x_domain", http("POST", "/v1/completions", ["X-Domain: python", "Authorization: Bearer k"],
                                   json.dumps({"prompt": "def f(", "max_tokens": 2}).encode()))
    chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    write(w, "post_chunked", chunked)
    write(w, "keep_alive_two", http("GET", "/health") + http("POST", "/v1/completions", [], b'{"prompt": 1}'))
    write(w, "bad_length", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{}")
    write(w, "bad_request_line", b"GARBAGE\r\n\r\n")


# ---- chat templates (common/chat/chat_template.h) ----

def chat_template_seeds():
    w = "chat_template"
    msgs = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    write(w, "default", "\n" + "{% for message in messages %}{{ message['role'] + ': ' + "
          "message['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}")
    write(w, "llama3", msgs + "\n" + "{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
          "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = "
          "bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
    write(w, "namespace_slices", "x\n{%- set ns = namespace(i=0) %}\n{%- for m in messages[::-1] %}\n"
          "  {%- set ns.i = ns.i + 1 %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}\n"
          "{%- endfor %}{{ ns.i }}{{ messages | tojson(indent=2) }}")
    write(w, "raise", "\n{{ raise_exception('roles must alternate') }}")
    write(w, "macro_recursion", "\n{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
    write(w, "unterminated", "\n{% if messages %}{{ 'x' ")
    write(w, "deep_parens", "\n{{ " + "(" * 300 + "1" + ")" * 300 + " }}")


if __name__ == "__main__":
    record_seeds()
    safetensors_seeds()
    config_seeds()
    eagle3_config_seeds()
    generation_config_seeds()
    channel_seeds()
    tokenizer_seeds()
    completion_seeds()
    http_seeds()
    chat_template_seeds()
