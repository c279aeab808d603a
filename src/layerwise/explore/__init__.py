"""The layer explorer's numbers: what the web page at ``layerwise serve``'s ``/`` shows, as functions.

token_statistics(stack)           norm, cosine to previous/last layer, drift per token and layer
ReferenceSet.sample(encoder)      the built-in UD EWT sample (or .from_store(path)) at every layer
ReferenceSet.neighbours(vecs)     nearest reference tokens per layer
attention_maps(encoder, text)     every head's attention at every layer
word_projection(stacks, words)    layerwise plot's per-layer PCA/t-SNE/UMAP, as data
logit_lens(encoder, text)         each layer's top predictions through the model's own head: at
                                  [MASK] (masked-LM head), or a decoder's next token (norm + lm_head)
"""

from ._lens import CausalLMHead, MaskedLMHead, load_lens_head, logit_lens
from ._reference import Neighbour, ReferenceSet, sample_license, sample_sentences
from ._views import STATISTICS, attention_maps, token_statistics, word_projection, word_sites

__all__ = [
    "STATISTICS",
    "CausalLMHead",
    "MaskedLMHead",
    "Neighbour",
    "ReferenceSet",
    "attention_maps",
    "load_lens_head",
    "logit_lens",
    "sample_license",
    "sample_sentences",
    "token_statistics",
    "word_projection",
    "word_sites",
]
