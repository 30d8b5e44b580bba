"""Checks a kevin tokenizer.json against Hugging Face's own readers.

Usage: python tests/tokenizer_parity.py TOKENIZER_JSON CASES_JSON

CASES_JSON is a list of [text, ids] pairs as kevin encoded them (the policy crate's
`save_and_load_give_the_same_ids` test writes it when KEVIN_PYTHON is set). The file must load
with `tokenizers` and with `transformers`' PreTrainedTokenizerFast, both must give kevin's ids
for every text (no special tokens added), and decoding the ids must give the text back.
Exit status 1 on the first disagreement.
"""

import json
import sys

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast


def main(tokenizer_json: str, cases_json: str) -> int:
    with open(cases_json, encoding="utf-8") as f:
        cases = json.load(f)
    tok = Tokenizer.from_file(tokenizer_json)
    fast = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json)
    for text, want in cases:
        got = tok.encode(text, add_special_tokens=False).ids
        if got != want:
            print(f"tokenizers: {text!r}: got {got}, kevin {want}", file=sys.stderr)
            return 1
        got_fast = fast.encode(text, add_special_tokens=False)
        if got_fast != want:
            print(f"transformers: {text!r}: got {got_fast}, kevin {want}", file=sys.stderr)
            return 1
        back = tok.decode(want, skip_special_tokens=False)
        if back != text:
            print(f"tokenizers decode: {text!r} came back as {back!r}", file=sys.stderr)
            return 1
        back_fast = fast.decode(want, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back_fast != text:
            print(f"transformers decode: {text!r} came back as {back_fast!r}", file=sys.stderr)
            return 1
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        if tok.token_to_id(special) is None:
            print(f"special token {special} missing", file=sys.stderr)
            return 1
    print(f"{len(cases)} texts: tokenizers and transformers agree with kevin (vocab {tok.get_vocab_size()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
