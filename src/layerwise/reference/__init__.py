"""A from-scratch BERT that reproduces Hugging Face's layer by layer, and MLM/NSP pretraining."""

from .model import Bert, BertConfig
from .pretrain import BertForPreTraining, PretrainSettings, pretrain

__all__ = ["Bert", "BertConfig", "BertForPreTraining", "PretrainSettings", "pretrain"]
