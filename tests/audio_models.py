"""Tiny random speech encoders of every audio family, saved with their real feature extractor
classes, and clips to read: the speech tests' models."""

from __future__ import annotations

from pathlib import Path

import numpy as np

RATE = 16000
# a feature encoder of two convolutions: 5 x 2 = stride 10 samples per frame, receptive field 14
CONV = dict(conv_dim=(16, 16), conv_kernel=(10, 5), conv_stride=(5, 2), num_feat_extract_layers=2)
SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **CONV,
)  # fmt: skip
AUDIO_TYPES = ("wav2vec2", "wav2vec2-layer", "hubert", "wavlm", "data2vec-audio", "whisper")


def _model_and_extractor(model_type: str):
    import transformers as T

    masked = T.Wav2Vec2FeatureExtractor(sampling_rate=RATE, return_attention_mask=True)
    plain = T.Wav2Vec2FeatureExtractor(sampling_rate=RATE, return_attention_mask=False)
    if model_type == "wav2vec2":  # wav2vec2-base's layout: group norm over time, one clip a batch
        return T.Wav2Vec2Config(**SMALL, feat_extract_norm="group"), plain
    if model_type == "wav2vec2-layer":  # wav2vec2-large's: each frame normalised alone, batches padded
        return T.Wav2Vec2Config(**SMALL, feat_extract_norm="layer", do_stable_layer_norm=True), masked
    if model_type == "hubert":
        return T.HubertConfig(**SMALL, feat_extract_norm="layer", do_stable_layer_norm=True), masked
    if model_type == "wavlm":
        config = T.WavLMConfig(**SMALL, num_buckets=32, max_bucket_distance=64, feat_extract_norm="layer")
        return config, masked
    if model_type == "data2vec-audio":
        config = T.Data2VecAudioConfig(**{**SMALL, "num_conv_pos_embeddings": 5})
        return config, masked
    config = T.WhisperConfig(
        d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=1500,
    )  # fmt: skip
    return config, T.WhisperFeatureExtractor(feature_size=16, sampling_rate=RATE)


def save_audio_model(model_type: str, folder: Path, seed: int = 0, layers: int = 2) -> Path:
    """A tiny random speech encoder of ``model_type`` (``layers`` layers) and its feature extractor,
    in ``folder``."""
    import torch
    from transformers import AutoModel

    config, extractor = _model_and_extractor(model_type)
    setattr(config, "encoder_layers" if model_type == "whisper" else "num_hidden_layers", layers)
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(folder)
    extractor.save_pretrained(folder)
    return folder


def clips(n: int = 3, seed: int = 0) -> list[np.ndarray]:
    """``n`` clips of different lengths (0.05 s to 0.2 s at 16 kHz): a tone with noise."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        t = np.arange(800 + 1100 * k) / RATE
        tone = 0.3 * np.sin(2 * np.pi * (220 + 50 * k) * t) + 0.05 * rng.standard_normal(len(t))
        out.append(tone.astype(np.float32))
    return out


def reference_states(folder: Path, waves: list[np.ndarray]) -> list[np.ndarray]:
    """transformers' own hidden states of each clip alone: ``(n_states, frames, H)`` per clip, from the
    folder's feature extractor and model (Whisper: its encoder, the frames of the clip's audio)."""
    import math

    import torch
    from transformers import AutoConfig, AutoFeatureExtractor, AutoModel

    extractor = AutoFeatureExtractor.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    whisper = AutoConfig.from_pretrained(folder).model_type == "whisper"
    states = []
    for wave in waves:
        with torch.no_grad():
            if whisper:
                features = extractor(wave, sampling_rate=RATE, return_tensors="pt")["input_features"]
                out = model.encoder(features, output_hidden_states=True)
                n = math.ceil(len(wave) / (2 * extractor.hop_length))
            else:
                values = extractor(wave, sampling_rate=RATE, return_tensors="pt")["input_values"]
                out = model(values, output_hidden_states=True)
                n = out.hidden_states[0].shape[1]
        states.append(torch.stack(out.hidden_states)[:, 0, :n].numpy())
    return states
