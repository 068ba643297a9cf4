"""``--data_formatter_template``: each record's text made from its fields, as fms-hf-tuning makes
it.

The template is Jinja in a sandbox with undefined names an error (fms's
``apply_custom_jinja_template``): ``{{input}}``, ``{{element['input']}}`` and the tokenizer's
special tokens (``{{eos_token}}``). The data is checked before any model loads, when there is no
tokenizer yet, so a special token is rendered as a marker first and replaced by the tokenizer's
token once it is loaded (:func:`fill_special_tokens`); a record without a field the template uses is
one line, exit 2.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.errors import UsageError

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase

#: The names of a tokenizer's ``special_tokens_map`` a template may use.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
FLAG = "--data_formatter_template"


def _marker(name: str) -> str:
    return f"\x00{name}\x00"


def compile_template(text: str) -> Callable[[dict[str, Any]], str]:
    """A function rendering one record with ``text``; UsageError if it is not a Jinja template."""
    from jinja2 import StrictUndefined, TemplateError
    from jinja2.sandbox import SandboxedEnvironment

    try:
        template = SandboxedEnvironment(undefined=StrictUndefined).from_string(text)
    except TemplateError as exc:
        raise UsageError(f"{FLAG}: not a valid Jinja template: {exc}") from None
    markers = {name: _marker(name) for name in SPECIAL_TOKENS}

    def render(record: dict[str, Any]) -> str:
        try:
            return template.render(element=record, **{**markers, **record})
        except TemplateError as exc:
            raise UsageError(f"{FLAG}: {exc}") from None

    return render


def fill_special_tokens(ds: datasets.Dataset,
                        tokenizer: PreTrainedTokenizerBase) -> datasets.Dataset:
    """Replace the markers :func:`compile_template` left with the tokenizer's special tokens."""
    import datasets

    tokens = {name: getattr(tokenizer, name, None) for name in SPECIAL_TOKENS}
    rows = ds.to_list()
    for row in rows:
        for column, text in row.items():
            for name, token in tokens.items():
                if _marker(name) in text:
                    if not token:
                        raise UsageError(f"{FLAG} uses {{{{{name}}}}}, which the tokenizer does "
                                         "not have")
                    text = text.replace(_marker(name), token)
            row[column] = text
    return datasets.Dataset.from_list(rows)
