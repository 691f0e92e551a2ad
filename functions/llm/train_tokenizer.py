"""Trains the llm function's tokenizer: a byte-level BPE (the GPT-2/Qwen2 kind: every byte is a token, so any
UTF-8 text round-trips) with the pinned `tokenizers` (0.23.3), from text files given on the command line.

    git ls-files -z "*.md" "*.go" | xargs -0 python3 functions/llm/train_tokenizer.py --out functions/llm/tokenizer.json

The shipped tokenizer.json was trained so from this repository's Markdown and Go files at the commit that added
it. Special tokens: <|endoftext|> (0, the end of a completion), <|im_start|> (1) and <|im_end|> (2) (the chat
format of handler.py). Nothing is downloaded.
"""

import argparse

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=8192, help="vocabulary size (tokens, special ones included)")
    ap.add_argument("--out", default="tokenizer.json", help="where to write the tokenizer")
    ap.add_argument("files", nargs="+", help="text files to train on")
    a = ap.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(a.files, trainer)
    tok.save(a.out)
    print("%s: %d tokens" % (a.out, tok.get_vocab_size()))


if __name__ == "__main__":
    main()
