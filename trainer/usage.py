"""``python -m trainer --help`` in well under a second: parsing imports transformers and trl (10-20
seconds) for their SFTConfig and TrainingArguments, and help needs neither. Our own flags come from
our dataclasses; every training flag of the installed SFTConfig and TrainingArguments is read from
their source with ``ast`` (name, type, default, help), never imported, so the list is the one the
parser takes, for the versions installed. Each default is said once: where a flag's help already
says it, the help is left as it is."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any, TextIO

from trainer.args import DataArguments, ModelArguments
from trainer.argv_rewrite import PEFT_METHOD, RENAMED_FLAGS
from trainer.fms_flags import FMS_ALIASES, FMS_SWITCHES
from trainer.tracker_flags import TrackingArguments

#: The dataclass whose fields are the training flags (module, class): the parser's.
TRAINING = ("trl.trainer.sft_config", "SFTConfig")
_NONE = object()
#: The types HfArgumentParser gives a --no_ form.
_BOOLEAN = {"bool", "bool | None", "Optional[bool]"}
#: Names a package exports lazily from a module of its own (transformers' __init__ maps them at
#: import).
_LAZY = {("transformers", "TrainingArguments"): "transformers.training_args"}


def print_help(out: TextIO = sys.stdout) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trainer", add_help=False,
        usage="python -m trainer [--demo | --model_name_or_path PATH --data_path FILE]\n"
              "                         --output_dir DIR [flags]",
        description="Fine-tune with SFT (trl) and publish every rank's metrics to a relay "
                    "(docs/trainer.md). torchrun --nproc_per_node=N -m trainer ... runs it on N "
                    "ranks; --demo trains the bundled tiny model offline.")
    parser.add_argument("-h", "--help", action="store_true", help="Show this message and exit.")
    groups = (("model", ModelArguments), ("data", DataArguments), ("tracking", TrackingArguments))
    for title, cls in groups:
        group = parser.add_argument_group(title, (cls.__doc__ or cls.__name__).splitlines()[0])
        for field in dataclasses.fields(cls):
            default = field.default if field.default is not dataclasses.MISSING else _NONE
            _add(group, field.name, field.metadata.get("help", ""), default,
                 field.type in ("bool", bool))
    try:
        fields = training_fields()
    except (OSError, SyntaxError, LookupError, ValueError) as exc:
        # not installed ([train]), or unreadable
        fields, note = {}, f" They could not be read here ({type(exc).__name__}: {exc})."
    else:
        note = ""
    group = parser.add_argument_group(
        "training (trl's SFTConfig and transformers' TrainingArguments, as installed)",
        "Every field of SFTConfig is a flag: --output_dir is required, --learning_rate, "
        "--num_train_epochs, --max_steps, --per_device_train_batch_size ..." + note)
    for name, (help_text, default, boolean) in fields.items():
        _add(group, name, help_text, default, boolean)
    seed = parser.add_argument_group("the seed's flag names (still accepted)")
    for old, new in RENAMED_FLAGS.items():
        if "-" not in old[2:]:
            seed.add_argument(old, metavar=new[2:].upper(), help=f"same as {new}")
    fms = parser.add_argument_group("fms-hf-tuning's flag names (same meaning; docs/trainer.md)")
    for old, new in FMS_ALIASES.items():
        fms.add_argument(old, metavar=new[2:].upper(), help=f"same as {new}")
    fms.add_argument(PEFT_METHOD, metavar="{lora,none}",
                     help="lora: --use_peft True; none: --use_peft False")
    for old, new_words in FMS_SWITCHES.items():
        fms.add_argument(old, action="store_true", help=f"same as {' '.join(new_words)}")
    parser.print_help(out)


def _add(group: Any, name: str, help_text: str, default: Any, boolean: bool) -> None:
    """One flag, its default said unless its help says it already (or there is none worth saying);
    a yes/no flag that is on by default also has its --no_ form, as the parser gives it."""
    text = " ".join(help_text.split())
    if default is not _NONE and default is not None and "default" not in text.lower():
        text = f"{text} (default: {default})".strip()
    group.add_argument(f"--{name}", metavar=name.upper(), help=text.replace("%", "%%"))
    if boolean and default is True:
        group.add_argument(f"--no_{name}", action="store_true", help=f"same as --{name} False")


def training_fields() -> dict[str, tuple[str, Any, bool]]:
    """name -> (help, default, whether it is a yes/no flag) of every init field of SFTConfig and the
    dataclasses it derives from (trl's base config, TrainingArguments), read from their source."""
    return _class_fields(*TRAINING)


def _class_fields(module: str, cls: str) -> dict[str, tuple[str, Any, bool]]:
    """A dataclass's fields, its bases' first (a field redefined keeps its base's place, as
    dataclasses keep it); a base is found through the module's imports."""
    tree = ast.parse(_source(module).read_text(encoding="utf-8"))
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    if node is None:
        raise LookupError(f"no class {cls} in {module}")
    fields: dict[str, tuple[str, Any, bool]] = {}
    imported = {alias.asname or alias.name: (_absolute(module, item), alias.name)
                for item in tree.body if isinstance(item, ast.ImportFrom) for alias in item.names}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in imported:
            where, name = imported[base.id]
            fields.update(_class_fields(_LAZY.get((where, name), where), name))
        elif isinstance(base, ast.Name) and any(isinstance(n, ast.ClassDef) and n.name == base.id
                                                for n in tree.body):
            fields.update(_class_fields(module, base.id))
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                and not item.target.id.startswith("_"):
            found = _field(item.value)
            if found is not None:
                fields[item.target.id] = (*found, ast.unparse(item.annotation) in _BOOLEAN)
    return fields


def _absolute(module: str, item: ast.ImportFrom) -> str:
    """The module an ``from ... import`` in ``module`` names (``.base_config`` in
    trl.trainer.sft_config)."""
    if not item.level:
        return item.module or ""
    package = module.split(".")[:-item.level]
    return ".".join(package + ([item.module] if item.module else []))


def _field(value: ast.expr | None) -> tuple[str, Any] | None:
    """(help, default) of ``field(default=..., metadata={"help": ...})`` or of a plain default; None
    for a field that is not an argument (``init=False``)."""
    if not (isinstance(value, ast.Call)
            and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field"):
        return "", _literal(value) if value is not None else _NONE
    keywords = {k.arg: k.value for k in value.keywords if k.arg}
    init = keywords.get("init")
    if isinstance(init, ast.Constant) and init.value is False:
        return None
    help_text = ""
    metadata = keywords.get("metadata")
    if isinstance(metadata, ast.Dict):
        for key, item in zip(metadata.keys, metadata.values, strict=True):
            if isinstance(key, ast.Constant) and key.value == "help":
                help_text = _literal(item) if isinstance(_literal(item), str) else ""
    return help_text, _literal(keywords["default"]) if "default" in keywords else _NONE


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NONE  # a name, a call: not shown


def _source(module: str) -> Path:
    """The file of ``module``, found without importing it (nor its package: the slow part)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"{top} is not installed (pip install './[train]')")
    return Path(next(iter(spec.submodule_search_locations)), *rest).with_suffix(".py")
