"""A BERT-layout encoder's folder is read without transformers' Auto registry (loading/plain.py): the
same tokenizer class, tokens, special tokens and settings as AutoTokenizer gives, a config with the
values AutoConfig gives, and a one-line command that never imports ``transformers.models``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

import layerwise as lw
from layerwise._model.families.kinds import BERT_LAYOUT, _mapping, check_text_transformer, kind_of
from layerwise._model.loading import plain
from layerwise._model.loading.light import _PREFIX

TEXTS = [
    "The bank raised rates.",
    "  Café déjà vu — naïve façade, 3.14159 and URLs like https://x.org/a?b=c  ",
    "\x00\x00",
    "",
    "中文字符 and emoji 🙂 mixed in",
    "a " * 300,
]
PAIRS = [("Is it raining?", "Yes, it is."), ("", "second only")]


def _trained(kind: str):
    """A small tokenizers.Tokenizer of ``kind`` ("bpe": byte-level, "unigram"), trained on UD EWT."""
    from tokenizer_kinds import byte_level, unigram

    made = byte_level("bart") if kind == "bpe" else unigram("t5")
    return json.loads(made.backend_tokenizer.to_str())["model"]


def _roberta_folder(tmp_path):
    """A RoBERTa folder whose tokenizer is transformers' RobertaTokenizer (byte-level BPE)."""
    from transformers import RobertaConfig, RobertaTokenizer

    model = _trained("bpe")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = dict(model["vocab"])
    for token in specials:
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    RobertaTokenizer(vocab=vocab, merges=merges).save_pretrained(tmp_path)
    RobertaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64).save_pretrained(tmp_path)  # fmt: skip
    return tmp_path


def _xlmr_folder(tmp_path):
    """An XLM-R folder whose tokenizer is transformers' XLMRobertaTokenizer (SentencePiece Unigram)."""
    from transformers import XLMRobertaConfig, XLMRobertaTokenizer

    pieces = [(p, s) for p, s in _trained("unigram")["vocab"] if p not in ("<pad>", "</s>", "<unk>")]
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces, ("<mask>", 0.0)]
    XLMRobertaTokenizer(vocab=vocab).save_pretrained(tmp_path)
    XLMRobertaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64).save_pretrained(tmp_path)  # fmt: skip
    return tmp_path


@pytest.fixture(scope="module")
def folders(default_model_dir, make_tiny_model, make_roberta_family, tmp_path_factory):
    """Every packaged and test model of a BERT-layout family, and tokenizers of each class read here."""
    return {
        "all-MiniLM-L6-v2": default_model_dir,
        "bert": make_tiny_model("bert"),
        "roberta (BERT vocabulary)": make_tiny_model("roberta"),
        "electra": make_tiny_model("electra"),
        "xlm-roberta (BERT vocabulary)": make_roberta_family("xlm-roberta"),
        "camembert (BERT vocabulary)": make_roberta_family("camembert"),
        "roberta (RobertaTokenizer)": _roberta_folder(tmp_path_factory.mktemp("plain-roberta")),
        "xlm-roberta (XLMRobertaTokenizer)": _xlmr_folder(tmp_path_factory.mktemp("plain-xlmr")),
    }


def _config_of(model_type: str):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type)


def _encodings(tokenizer, backend=None):
    backend = backend or tokenizer.backend_tokenizer
    singles = backend.encode_batch(TEXTS)
    pairs = backend.encode_batch(PAIRS)
    return [(e.ids, e.offsets, e.word_ids, e.type_ids, e.special_tokens_mask) for e in singles + pairs]


def test_every_folder_reads_to_what_the_auto_classes_give(folders):
    from transformers import AutoConfig, AutoTokenizer

    for name, folder in folders.items():
        read = plain.read_plain(str(folder))
        assert read is not None, name
        config, tokenizer = read
        auto_config, auto_tokenizer = (
            AutoConfig.from_pretrained(folder),
            AutoTokenizer.from_pretrained(folder),
        )
        assert plain.is_plain(config) and not plain.is_plain(auto_config)
        # every value of transformers' config, the plain one holds the same
        for key, value in auto_config.to_dict().items():
            if key not in ("transformers_version", "architectures", "dtype", "torch_dtype"):
                assert getattr(config, key) == value, f"{name}: {key}"
        assert type(tokenizer) is type(auto_tokenizer), name
        assert tokenizer.backend_tokenizer.to_str() == auto_tokenizer.backend_tokenizer.to_str(), name
        assert tokenizer.init_kwargs == auto_tokenizer.init_kwargs, name
        for attribute in ("all_special_tokens", "all_special_ids", "model_max_length", "padding_side",
                          "truncation_side", "cls_token_id", "sep_token_id", "pad_token_id", "mask_token_id",
                          "unk_token_id", "bos_token_id", "eos_token_id"):  # fmt: skip
            assert getattr(tokenizer, attribute) == getattr(auto_tokenizer, attribute), f"{name}: {attribute}"
        assert tokenizer.get_vocab() == auto_tokenizer.get_vocab(), name
        assert _encodings(tokenizer) == _encodings(auto_tokenizer), name


@pytest.mark.parametrize("model_type", BERT_LAYOUT)
def test_the_field_defaults_are_the_config_class_defaults(model_type):
    from transformers import AutoConfig

    defaults = plain.config_defaults(model_type)
    assert defaults, f"{model_type}: its config class is read as literal fields"
    real = AutoConfig.for_model(model_type)
    assert {key: getattr(real, key) for key in defaults} == defaults
    fields = set(type(real).__dataclass_fields__) - set(type(real).__mro__[1].__dataclass_fields__)
    assert fields <= set(defaults), f"{model_type}: fields not read: {fields - set(defaults)}"


def test_the_tables_follow_transformers_mappings():
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

    for model_type in BERT_LAYOUT:
        assert TOKENIZER_MAPPING_NAMES[model_type].removesuffix("Fast") == plain.FAMILY_TOKENIZERS[model_type]
        # the kind known without the mappings is the one the mappings give
        assert model_type in _mapping("MODEL_FOR_MASKED_LM_MAPPING_NAMES")
        check_text_transformer(_config_of(model_type), "x")
    assert set(plain.FAMILY_TOKENIZERS.values()) <= set(plain.TOKENIZER_MODULES)
    for class_name, package in plain.TOKENIZER_MODULES.items():
        found = tokenizer_class_from_name(class_name)
        assert found.__module__ == f"transformers.models.{package}.tokenization_{package}"
    assert set(_PREFIX) == set(BERT_LAYOUT)


def test_bert_layout_encoders_are_encoders_without_the_mappings():
    for model_type in BERT_LAYOUT:
        config = _config_of(model_type)
        assert kind_of(config) == "encoder"
        causal = model_type in _mapping("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
        masked = model_type in _mapping("MODEL_FOR_MASKED_LM_MAPPING_NAMES")
        assert not (causal and not masked)  # what kind_of would read from the mappings


def test_what_is_not_read_plainly_goes_to_the_auto_classes(tmp_path, default_model_dir, family_folder):
    def copy(edit_config=None, edit_tokenizer=None):
        folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        shutil.copytree(default_model_dir, folder)
        for name, edit in (("config.json", edit_config), ("tokenizer_config.json", edit_tokenizer)):
            if edit:
                data = json.loads((folder / name).read_text())
                edit(data)
                (folder / name).write_text(json.dumps(data))
        return folder

    assert plain.read_plain(str(copy())) is not None
    assert (
        plain.read_plain(
            str(copy(edit_tokenizer=lambda d: d.update(tokenizer_class="PreTrainedTokenizerFast")))
        )
        is None
    )
    assert plain.read_plain(str(copy(edit_config=lambda d: d.update(auto_map={"AutoModel": "x.Y"})))) is None
    assert (
        plain.read_plain(str(copy(edit_tokenizer=lambda d: d.update(auto_map={"AutoTokenizer": ["a", "b"]}))))
        is None
    )
    no_json = copy()
    (no_json / "tokenizer.json").unlink()
    assert plain.read_plain(str(no_json)) is None
    broken = copy()
    (broken / "tokenizer_config.json").write_text("{not json")
    assert plain.read_plain(str(broken)) is None
    assert plain.read_plain(str(family_folder("gpt_neox"))) is None  # not a BERT layout
    assert plain.read_plain("sentence-transformers/all-MiniLM-L6-v2") is None  # a hub name


def test_an_encoder_read_plainly_gives_the_auto_classes_numbers(make_tiny_model, monkeypatch):
    folder = make_tiny_model("roberta")
    fast = lw.Encoder(folder, device="cpu")
    assert plain.is_plain(fast.models.config)
    monkeypatch.setattr(plain, "read_plain", lambda source: None)
    import layerwise._model.loading.source as source

    monkeypatch.setattr(source, "read_plain", lambda source: None)
    auto = lw.Encoder(folder, device="cpu")
    assert not plain.is_plain(auto.models.config)
    for got, want in zip(fast.extract(TEXTS, layers="all"), auto.extract(TEXTS, layers="all"), strict=True):
        assert got.tokens == want.tokens
        np.testing.assert_array_equal(got.hidden, want.hidden)
    assert fast.run_meta(lw.OutputPlan()) == auto.run_meta(lw.OutputPlan())
    # the public config is transformers' own class, read when asked for
    assert type(fast.config) is type(auto.config) and fast.config.to_dict() == auto.config.to_dict()


def test_a_one_line_command_never_builds_the_registry(tmp_path):
    (tmp_path / "one.txt").write_text("The bank raised rates.\n", encoding="utf-8")
    code = (
        "import sys\n"
        "from layerwise.cli import main\n"
        "sys.argv = ['layerwise', 'extract', 'one.txt', '-o', 'one.npz']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "print('transformers.models' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr[-2000:]
    assert (tmp_path / "one.npz").is_file()


def test_the_registry_later_finds_the_same_tokenizer_class():
    code = (
        "import layerwise as lw\n"
        "enc = lw.Encoder()\n"
        "from transformers import AutoTokenizer, BertTokenizer\n"
        "assert type(enc.tokenizer) is BertTokenizer\n"
        "assert type(AutoTokenizer.from_pretrained(enc.source)) is BertTokenizer\n"
        "print(type(enc.config).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "BertConfig", out.stderr[-2000:]
