"""A BERT-layout encoder's config and tokenizer, read without transformers' Auto registry.

``AutoConfig`` and ``AutoTokenizer`` import ``transformers.models``, whose import builds a table
of every model transformers knows: about 0.2× the import of torch and transformers together, on a
one-line command that needs none of it (``benchmarks/start_cost.py``). A local folder of one of the
families the light model reads (:data:`~layerwise._model.families.kinds.BERT_LAYOUT`) is read here instead:

- the **tokenizer** is the class ``AutoTokenizer`` picks (the one ``tokenizer_config.json`` names,
  else the family's: :data:`FAMILY_TOKENIZERS`, held to transformers' own mapping by a test),
  loaded by its own ``from_pretrained``. Its module is
  read from its file and registered under its own name, so a later import through the registry
  finds that module: one class, the same object either way;
- the **config** is a ``PreTrainedConfig`` holding ``config.json`` over the family config's field
  defaults, read from the field declarations of its class (``BertConfig`` …) in its source file
  without running the module, whose docstring decorator imports the registry. Every field the class
  declares is there with the class's default; tests hold the values to ``AutoConfig``'s for every
  packaged and test model. ``Encoder.config`` gives transformers' own class when asked for.

Anything else (a hub name, a GGUF file, a model's own code, another family, a tokenizer class other
than the family's, a config class whose fields are not plain literals) returns None, and
``AutoConfig``/``AutoTokenizer`` load it as before, with their errors.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

from ..families.kinds import BERT_LAYOUT

logger = logging.getLogger("layerwise")

# the tokenizer class AutoTokenizer picks for each family when tokenizer_config.json names none
FAMILY_TOKENIZERS = {
    "bert": "BertTokenizer",
    "electra": "BertTokenizer",
    "roberta": "RobertaTokenizer",
    "xlm-roberta": "XLMRobertaTokenizer",
    "camembert": "CamembertTokenizer",
}
# the tokenizer classes read here, by the module folder of transformers.models that holds each: a
# folder's tokenizer_config.json may name any of them (AutoTokenizer then loads that class)
TOKENIZER_MODULES = {
    "BertTokenizer": "bert",
    "RobertaTokenizer": "roberta",
    "XLMRobertaTokenizer": "xlm_roberta",
    "CamembertTokenizer": "camembert",
}


def is_plain(config: Any) -> bool:
    """Whether ``config`` was read here (a bare ``PreTrainedConfig``, not transformers' class)."""
    from transformers import PreTrainedConfig

    return type(config) is PreTrainedConfig


def transformers_config(config: Any, source: str) -> Any:
    """``config`` as transformers' own class: one read here is read again by ``AutoConfig`` (which
    builds the registry, once, when a caller asks for it)."""
    if not is_plain(config):
        return config
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(source)


def read_plain(source: str) -> tuple[Any, Any] | None:
    """``(config, tokenizer)`` of the local folder ``source``, or None when it is not one this
    module reads (see the module docstring). The caller quiets transformers' log around it."""
    folder = Path(source)
    raw = _json(folder / "config.json") if folder.is_dir() else None
    if raw is None or raw.get("model_type") not in BERT_LAYOUT or "auto_map" in raw:
        return None
    model_type = raw["model_type"]
    settings = _json(folder / "tokenizer_config.json")
    if settings is None or "auto_map" in settings or not (folder / "tokenizer.json").is_file():
        return None
    declared = settings.get("tokenizer_class") or raw.get("tokenizer_class") or FAMILY_TOKENIZERS[model_type]
    class_name = str(declared).removesuffix("Fast")  # a file of transformers 4 names the Fast class
    if class_name not in TOKENIZER_MODULES:  # AutoTokenizer's rules for another class
        return None
    defaults = config_defaults(model_type)
    if defaults is None:
        return None
    try:
        from transformers import PreTrainedConfig

        values = {**defaults, **raw, "_name_or_path": source}
        config = PreTrainedConfig.from_dict(values)
        # a field the base class sets aside (use_cache) is kept, as the family's class keeps it
        for key, value in values.items():
            if key not in config.__dict__ and key != "model_type":
                setattr(config, key, value)
        tokenizer = _tokenizer_class(TOKENIZER_MODULES[class_name], class_name).from_pretrained(source)
    except Exception as exc:  # the Auto classes read it again and name what is wrong
        logger.debug("reading %s with the Auto classes: %s", source, exc)
        return None
    return config, tokenizer


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _models_folder() -> Path:
    import transformers

    return Path(transformers.__file__).parent / "models"


@functools.cache
def config_defaults(model_type: str) -> dict[str, Any] | None:
    """The fields ``model_type``'s config class declares, with their defaults, read from its source;
    None unless the class is only literal field declarations (no method that could change them)."""
    package = model_type.replace("-", "_")  # transformers' module folder: xlm-roberta -> xlm_roberta
    path = _models_folder() / package / f"configuration_{package}.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and _declares(node, model_type):
            # fields inherited from another config class would be missed: only the base class's own
            bases = [getattr(base, "id", None) for base in node.bases]
            return _literal_fields(node) if bases == ["PreTrainedConfig"] else None
    return None


def _declares(node: ast.ClassDef, model_type: str) -> bool:
    return any(
        isinstance(item, ast.Assign)
        and [getattr(t, "id", None) for t in item.targets] == ["model_type"]
        and isinstance(item.value, ast.Constant)
        and item.value.value == model_type
        for item in node.body
    )


def _literal_fields(node: ast.ClassDef) -> dict[str, Any] | None:
    fields: dict[str, Any] = {}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if item.value is None:
                return None
            try:
                fields[item.target.id] = ast.literal_eval(item.value)
            except (ValueError, TypeError, SyntaxError):  # not a literal: the class computes it
                return None
        elif not isinstance(item, ast.Assign | ast.Expr | ast.Pass):  # a method: defaults may change
            return None
    return fields


def _tokenizer_class(package: str, class_name: str) -> Any:
    """transformers' tokenizer class ``class_name`` of ``transformers.models.<package>``, its module
    read from its file unless the registry has already imported it."""
    name = f"transformers.models.{package}.tokenization_{package}"
    module = sys.modules.get(name)
    if module is None:
        path = _models_folder() / package / f"tokenization_{package}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"no module {name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # the registry's later import of this name finds it
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return getattr(module, class_name)
