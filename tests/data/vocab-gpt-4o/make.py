#!/usr/bin/env python3
# make.py - writes the expected token ids of test_vocab's gpt-4o check
# (README.md beside it says why): llama.cpp's tokenizer on the vocabulary
# of ggml-vocab-llama-bpe.gguf with tokenizer.ggml.pre set to "gpt-4o".
#
#   python3 make.py SHARED_DIR LLAMA_TOKENIZE
#   (e.g. python3 make.py /work/shared /tmp/llsched/src/build/bin/llama-tokenize)
#
# Needs only the Python standard library and llama.cpp's llama-tokenize.
import os, struct, subprocess, sys, tempfile

SEP = "\n__ggml_vocab_test__\n"
# the shared .inp files with different texts (the others are copies of these)
INPUTS = ["ggml-vocab-gpt-2.gguf.inp", "ggml-vocab-llama-bpe.gguf.inp",
          "ggml-vocab-gemma-4.gguf.inp", "ggml-vocab-qwen35.gguf.inp"]

def texts_of(raw):
    # as test_vocab's split_inp: each text ends at SEP
    parts = raw.split(SEP)
    return parts[:-1] if parts and parts[-1] == "" else parts

def gpt4o_vocab(shared, out):
    # llama-bpe's vocab GGUF with the value of tokenizer.ggml.pre replaced
    # (the file has no tensors, so nothing after the keys moves)
    data = open(os.path.join(shared, "vocab", "ggml-vocab-llama-bpe.gguf"), "rb").read()
    key = b"tokenizer.ggml.pre"
    old = struct.pack("<QQ", len(key), 0)[:8] + key + struct.pack("<IQ", 8, 9) + b"llama-bpe"
    new = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", 8, 6) + b"gpt-4o"
    assert data.count(old) == 1, "tokenizer.ggml.pre is not 'llama-bpe'"
    open(out, "wb").write(data.replace(old, new))

def tokenize(tool, vocab, text, tmp):
    path = os.path.join(tmp, "text")
    open(path, "wb").write(text.encode("utf-8"))
    # no BOS, no special-token parsing, no escape processing: the bytes as they are
    out = subprocess.run([tool, "-m", vocab, "-f", path, "--ids", "--no-bos", "--no-escape",
                          "--log-disable"], check=True, capture_output=True).stdout.decode()
    ids = out.strip().strip("[]")
    return " ".join(x.strip() for x in ids.split(",") if x.strip())

def main():
    shared, tool = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "ggml-vocab-llama-bpe-gpt-4o.gguf")
        gpt4o_vocab(shared, vocab)
        for name in INPUTS + ["extra.inp"]:
            src = os.path.join(here, name) if name == "extra.inp" else os.path.join(shared, "vocab", name)
            raw = open(src, "rb").read().decode("utf-8")
            lines = [tokenize(tool, vocab, t, tmp) for t in texts_of(raw)]
            out = os.path.join(here, name.replace("ggml-vocab-", "").replace(".gguf.inp", "") + ".out")
            if name == "extra.inp": out = os.path.join(here, "extra.out")
            open(out, "w").write("".join(l + "\n" for l in lines))
            print(out, len(lines), "texts")

main()
