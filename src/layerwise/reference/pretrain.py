"""Pretraining a small BERT from scratch: WordPiece vocabulary, masked LM and next-sentence
prediction as in the BERT paper (Devlin et al. 2019, section 3.1), on CPU.

The corpus, its vocabulary and the examples (``examples.py``): one sentence per line, a blank line
between documents, as google-research/bert's create_pretraining_data.py reads them.

    masked LM   15 % of the tokens of each example are chosen (at least one); of those 80 % become
                [MASK], 10 % a random token, 10 % stay unchanged; the model predicts the originals.
                The output layer is tied to the token embeddings (plus a bias).
    NSP         50 % of the examples pair a segment with the text that follows it in the document,
                50 % with text from another document; a classifier on the pooled [CLS] tells which.

The result is a Hugging Face folder (config.json, model.safetensors, tokenizer) that
``layerwise.Encoder`` and ``transformers.AutoModel`` load.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._host.progress import progress_bar
from ..errors import OptionError
from .examples import (
    SPECIAL_TOKENS,
    Example,
    build_examples,
    collate,
    mask_tokens,
    read_documents,
    train_wordpiece,
)
from .model import Bert, BertConfig, reference_to_hf, save_config

logger = logging.getLogger("layerwise")


class PreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.word_embeddings = word_embeddings  # tied decoder: logits = t E^T + b
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.next_sentence = nn.Linear(config.hidden_size, 2)

    def masked_lm(self, h: torch.Tensor) -> torch.Tensor:
        t = self.transform_norm(F.gelu(self.transform(h)))  # (M, H)
        return t @ self.word_embeddings.weight.T + self.decoder_bias  # (M, vocab)

    def nsp(self, h_cls: torch.Tensor) -> torch.Tensor:
        return self.next_sentence(torch.tanh(self.pooler(h_cls)))  # (B, 2)


class BertForPreTraining(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.bert = Bert(config)
        self.heads = PreTrainingHeads(config, self.bert.embeddings.word_embeddings)

    def forward(self, input_ids, token_type_ids, attention_mask, mlm_positions):
        """MLM logits at ``mlm_positions`` (a boolean (B, T) mask) and NSP logits."""
        h = self.bert(input_ids, token_type_ids, attention_mask)[-1]  # (B, T, H)
        return self.heads.masked_lm(h[mlm_positions]), self.heads.nsp(h[:, 0])

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Parameters under Hugging Face BertForPreTraining names (decoder weight tied, not saved)."""
        state = {f"bert.{k}": v for k, v in reference_to_hf(self.bert.state_dict()).items()}
        heads = self.heads
        state.update(
            {
                "bert.pooler.dense.weight": heads.pooler.weight,
                "bert.pooler.dense.bias": heads.pooler.bias,
                "cls.predictions.transform.dense.weight": heads.transform.weight,
                "cls.predictions.transform.dense.bias": heads.transform.bias,
                "cls.predictions.transform.LayerNorm.weight": heads.transform_norm.weight,
                "cls.predictions.transform.LayerNorm.bias": heads.transform_norm.bias,
                "cls.predictions.bias": heads.decoder_bias,
                "cls.seq_relationship.weight": heads.next_sentence.weight,
                "cls.seq_relationship.bias": heads.next_sentence.bias,
            }
        )
        return {k: v.detach().contiguous().clone() for k, v in state.items()}


# ---------------------------------------------------------------------------------------------- training
@dataclass
class PretrainSettings:
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    intermediate: int | None = None
    vocab_size: int = 8000
    max_length: int = 128
    batch_size: int = 32
    steps: int = 2000
    learning_rate: float = 5e-4
    warmup: float = 0.05
    eval_fraction: float = 0.05
    seed: int = 0


def evaluate(
    model: BertForPreTraining, examples: list[Example], ids_of: dict, settings: PretrainSettings, seed: int
):
    """Held-out MLM accuracy, the most-frequent-token baseline on the same positions, NSP accuracy."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    correct = total = nsp_correct = 0
    gold_counts: Counter = Counter()
    with torch.no_grad():
        for start in range(0, len(examples), 64):
            batch = examples[start : start + 64]
            ids, types, mask, special, labels = collate(batch, ids_of["cls"], ids_of["sep"], ids_of["pad"])
            masked, chosen = mask_tokens(
                ids, special, ids_of["mask"], settings.vocab_size, len(SPECIAL_TOKENS), generator
            )
            mlm, nsp = model(masked, types, mask, chosen)
            gold = ids[chosen]
            correct += int((mlm.argmax(-1) == gold).sum())
            total += len(gold)
            gold_counts.update(gold.tolist())
            nsp_correct += int((nsp.argmax(-1) == labels).sum())
    model.train()
    baseline = gold_counts.most_common(1)[0][1] / max(total, 1)
    return {
        "mlm_accuracy": correct / max(total, 1),
        "mlm_baseline": baseline,
        "nsp_accuracy": nsp_correct / len(examples),
    }


def pretrain(
    corpus: str | Path,
    output: str | Path,
    settings: PretrainSettings | None = None,
    *,
    progress: bool | None = None,
) -> dict:
    """Train a WordPiece vocabulary and a BERT with MLM + NSP on ``corpus``; save to ``output``.
    Returns the training log (final held-out metrics included)."""
    settings = settings or PretrainSettings()
    output = Path(output)
    _check(settings, output)
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    started = time.perf_counter()
    # the data: documents shuffled, a held-out share, a WordPiece vocabulary from the rest
    documents = read_documents(corpus)
    rng.shuffle(documents)
    n_eval = max(2, int(len(documents) * settings.eval_fraction))
    tokenizer = train_wordpiece(documents[n_eval:], settings.vocab_size)
    vocab = tokenizer.get_vocab()
    ids_of = {name: vocab[f"[{name.upper()}]"] for name in ("pad", "unk", "cls", "sep", "mask")}

    def encode(docs):
        return [[e.ids for e in tokenizer.encode_batch(d, add_special_tokens=False)] for d in docs]

    train_examples = build_examples(encode(documents[n_eval:]), settings.max_length, rng)
    eval_examples = build_examples(
        encode(documents[:n_eval]), settings.max_length, random.Random(settings.seed + 1)
    )
    # the model, trained, then scored on the held-out examples
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=settings.hidden,
        num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads,
        intermediate_size=settings.intermediate or 4 * settings.hidden,
        max_position_embeddings=max(settings.max_length, 128),
        pad_token_id=ids_of["pad"],
    )
    settings.vocab_size = len(vocab)
    model = BertForPreTraining(config)
    log = _train(model, train_examples, ids_of, settings, rng, progress)
    final = evaluate(model, eval_examples, ids_of, settings, settings.seed + 2)
    _save(model, config, tokenizer, output)
    result = {
        "settings": asdict(settings),
        "documents": {"train": len(documents) - n_eval, "held_out": n_eval},
        "examples": {"train": len(train_examples), "held_out": len(eval_examples)},
        "held_out": final,
        "log": log,
        "seconds": time.perf_counter() - started,
    }
    (output / "pretraining_log.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def _check(settings: PretrainSettings, output: Path) -> None:
    """Settings that cannot train, and an output folder that holds something, refused up front."""
    if settings.hidden % settings.heads:
        raise OptionError(f"hidden={settings.hidden} must be divisible by heads={settings.heads}")
    if not (math.isfinite(settings.learning_rate) and settings.learning_rate > 0):
        raise OptionError(
            f"learning_rate={settings.learning_rate!r} must be a positive number, e.g. 5e-4 (the default)"
        )
    if not (math.isfinite(settings.warmup) and 0 <= settings.warmup < 1):
        raise OptionError(
            f"warmup={settings.warmup!r} is the share of steps spent warming up: use 0 <= warmup < 1"
        )
    if output.exists() and any(output.iterdir()):
        raise OptionError(f"output folder {str(output)!r} is not empty; choose a new folder")


def _train(
    model: BertForPreTraining,
    examples: list,
    ids_of: dict[str, int],
    settings: PretrainSettings,
    rng: random.Random,
    progress: bool | None,
) -> list[dict]:
    """``settings.steps`` steps of AdamW (linear warm-up, then linear decay) on MLM + NSP, batches
    drawn from ``examples`` in epochs of a new order; returns the log, one entry per 50 steps."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.01)
    warmup = max(1, int(settings.steps * settings.warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min((s + 1) / warmup, max(0.0, (settings.steps - s) / max(1, settings.steps - warmup))),
    )
    generator = torch.Generator().manual_seed(settings.seed)
    log: list[dict] = []
    bar = _progress(progress)
    order: list[int] = []
    n_vocab = settings.vocab_size
    with bar if bar is not None else contextlib.nullcontext():
        task = bar.add_task("pretraining", total=settings.steps, info="") if bar else None
        window = _Window()
        for step in range(settings.steps):
            if len(order) < settings.batch_size:
                order += rng.sample(range(len(examples)), len(examples))
            batch = [examples[i] for i in order[: settings.batch_size]]
            del order[: settings.batch_size]
            ids, types, mask, special, labels = collate(batch, ids_of["cls"], ids_of["sep"], ids_of["pad"])
            masked, chosen = mask_tokens(
                ids, special, ids_of["mask"], n_vocab, len(SPECIAL_TOKENS), generator
            )
            mlm, nsp = model(masked, types, mask, chosen)
            gold = ids[chosen]
            loss = F.cross_entropy(mlm, gold) + F.cross_entropy(nsp, labels)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            window.add(loss, mlm, gold, nsp, labels)
            if (step + 1) % 50 == 0 or step + 1 == settings.steps:
                entry = window.entry(step)
                log.append(entry)
                logger.info(
                    "step %(step)d loss %(loss).3f mlm acc %(mlm_accuracy).3f nsp acc %(nsp_accuracy).3f",
                    entry,
                )
                window = _Window()
                if bar is not None:
                    bar.update(
                        task,
                        info=f"loss {entry['loss']:.2f} · MLM {entry['mlm_accuracy']:.1%} "
                        f"· NSP {entry['nsp_accuracy']:.1%}",
                    )
            if bar is not None:
                bar.advance(task)
    return log


class _Window:
    """The loss and accuracies of the steps since the last log entry."""

    def __init__(self) -> None:
        self.loss, self.mlm, self.mlm_n, self.nsp, self.n = 0.0, 0, 0, 0, 0

    def add(
        self,
        loss: torch.Tensor,
        mlm: torch.Tensor,
        gold: torch.Tensor,
        nsp: torch.Tensor,
        labels: torch.Tensor,
    ) -> None:
        self.loss += float(loss.detach())
        self.mlm += int((mlm.argmax(-1) == gold).sum())
        self.mlm_n += len(gold)
        self.nsp += int((nsp.argmax(-1) == labels).sum())
        self.n += len(labels)

    def entry(self, step: int) -> dict:
        return {
            "step": step + 1,
            "loss": self.loss / max(1, (step % 50) + 1),
            "mlm_accuracy": self.mlm / max(1, self.mlm_n),
            "nsp_accuracy": self.nsp / max(1, self.n),
        }


def _save(model: BertForPreTraining, config: BertConfig, tokenizer: Any, output: Path) -> None:
    """The model as a transformers BERT folder: config, safetensors weights, the fast tokenizer."""
    from safetensors.torch import save_file
    from transformers import PreTrainedTokenizerFast

    output.mkdir(parents=True, exist_ok=True)
    save_config(config, output, ["BertForPreTraining"])
    save_file(model.hf_state_dict(), str(output / "model.safetensors"), metadata={"format": "pt"})
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer._tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=config.max_position_embeddings,
    ).save_pretrained(output)


def _progress(enabled: bool | None):
    return progress_bar("pretraining", "steps", enabled, extra="info")
