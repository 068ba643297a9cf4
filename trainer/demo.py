"""The offline demo: a tiny Llama-shaped model and a tokenizer trained on the bundled data.

Both are written with ``save_pretrained`` and loaded back by the entry point through the normal
``from_pretrained`` path, so the demo exercises exactly what a real fine-tuning job does, on a
CPU, in seconds, with nothing downloaded.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from trainer.argv_rewrite import DEMO_DATA

#: Written last: a folder holding it is a complete build.
_MARKER = "demo-complete.json"
_SPECIAL = ["<pad>", "<s>", "</s>"]


def _texts(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line)["output"] for line in fh if line.strip()]


def build_demo(folder: str, data_path: str = DEMO_DATA, vocab_size: int = 512,
               seed: int = 0) -> str:
    """Build the demo model and tokenizer into ``folder`` (kept if already complete) and return it.

    The build goes to a temporary sibling folder that is renamed into place, so concurrent or
    interrupted builds never leave a half-written model behind.
    """
    if os.path.isfile(os.path.join(folder, _MARKER)):
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        _texts(data_path),
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=_SPECIAL, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        model_max_length=256,
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".demo-build-", dir=parent)
    progress_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        with open(os.path.join(tmp, _MARKER), "w", encoding="utf-8") as fh:
            json.dump({"data": os.path.basename(data_path), "vocab_size": len(tokenizer),
                       "seed": seed}, fh)
        # another process may have won the race
        if not os.path.isfile(os.path.join(folder, _MARKER)):
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if progress_was_on:
            hf_logging.enable_progress_bar()
    return folder
