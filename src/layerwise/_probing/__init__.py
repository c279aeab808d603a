"""Layer-wise probing: which layer, which fusion? Answered with numbers on your own data.

For every hidden state and every named fusion (the BERT paper's Table 7 rows), a linear probe
(scikit-learn logistic regression on standardised features, fixed seed) is trained on frozen
features and scored on the dev set; all features come from one extraction pass. A scalar-mix
probe learns softmax weights over the layers (Tenney et al. 2019 read them as "where the
information sits": the centre of gravity). Two controls say whether a number means anything:

* random model: the same probe on a randomly initialised model of the same architecture;
* control task (Hewitt & Liang 2019): every word type gets a random label drawn from the label
  distribution; selectivity = task accuracy - control accuracy. High selectivity means the probe
  reads the representation rather than memorising word identities.

Tasks: ``conllu`` (UPOS/XPOS/deprel per word, accuracy), ``conll`` (CoNLL-2003 NER, entity F1 with
BIO decoding), ``tsv`` (sentence classification, accuracy), ``pairs`` (sentence-pair similarity:
cosine of sentence vectors against gold scores, Spearman; nothing is trained).
"""

from __future__ import annotations

from .linear import control_labels, fit_predict, scalar_mix_probe, standardize
from .result import ProbeResult, ProbeRow
from .runners import TASKS, probe

__all__ = [
    "TASKS",
    "ProbeResult",
    "ProbeRow",
    "control_labels",
    "fit_predict",
    "probe",
    "scalar_mix_probe",
    "standardize",
]
