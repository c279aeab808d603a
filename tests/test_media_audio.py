"""Speech encoders: every audio family equals transformers' own ``output_hidden_states`` of each clip
alone (its feature extractor, its model; Whisper: its encoder, the frames of the audio given), batched
or not; frames carry their times; files are decoded and resampled by real libraries."""

from __future__ import annotations

import numpy as np
import pytest
from audio_models import AUDIO_TYPES, RATE, clips, reference_states, save_audio_model

import layerwise as lw

TOL = 1e-5


@pytest.fixture(scope="module")
def waves():
    return clips(3)


@pytest.fixture(scope="module")
def hubert(tmp_path_factory):
    return lw.Encoder(save_audio_model("hubert", tmp_path_factory.mktemp("hubert") / "hubert"))


@pytest.mark.parametrize("model_type", AUDIO_TYPES)
def test_every_speech_family_equals_transformers(model_type, waves, tmp_path):
    folder = save_audio_model(model_type, tmp_path / model_type)
    enc = lw.Encoder(folder)
    assert enc.modality == "audio" and enc.n_layers == 2 and enc.run_path == "general"
    # alone, and sharing a batch where the family allows it (padded, or clips of one length)
    for batch_size, given in ((1, waves), (4, [*waves, waves[1]])):
        stacks = enc.extract(given, batch_size=batch_size)
        for stack, want in zip(stacks, reference_states(folder, given), strict=True):
            assert stack.hidden.shape == want.shape
            np.testing.assert_allclose(stack.hidden, want, atol=TOL, rtol=0)
            assert stack.units.kinds == ("frame",) * want.shape[1] and not stack.truncated


def test_frames_have_their_times(hubert, waves):
    stack = hubert.extract(waves[1])
    times = stack.units.times
    # two convolutions of strides 5 and 2 (10 samples a frame), kernels 10 and 5: a frame sees
    # (5 - 1) x 5 + 10 = 30 samples
    np.testing.assert_allclose(times[:3], [[0, 30 / RATE], [10 / RATE, 40 / RATE], [20 / RATE, 50 / RATE]])
    assert stack.tokens[:2] == ("0.00s", "0.00s") and stack.word_ids.tolist() == list(range(len(times)))
    span = stack.units.during(0.01, 0.02)
    assert span.tolist() == list(range(16, 32))
    np.testing.assert_allclose(
        stack.hidden[:, span].mean(axis=1), stack.hidden[:, 16:32].mean(axis=1), atol=TOL
    )
    with pytest.raises(lw.OptionError, match="is empty"):
        stack.units.during(0.02, 0.01)


def test_a_flac_file_is_decoded_and_resampled(hubert, waves, tmp_path):
    import soundfile
    from scipy.signal import resample_poly

    stereo = np.stack([waves[2], waves[2] * 0.5], axis=1)
    soundfile.write(tmp_path / "clip.flac", stereo, 48000)
    soundfile.write(tmp_path / "clip.wav", waves[2], RATE, subtype="FLOAT")
    decoded, _ = soundfile.read(tmp_path / "clip.flac", dtype="float32", always_2d=True)
    want = resample_poly(decoded.mean(axis=1).astype(np.float64), 1, 3).astype(np.float32)
    from_file = hubert.extract(str(tmp_path / "clip.flac"))
    np.testing.assert_allclose(from_file.hidden, hubert.extract(want).hidden, atol=TOL, rtol=0)
    np.testing.assert_allclose(
        hubert.extract(str(tmp_path / "clip.wav")).hidden, hubert.extract(waves[2]).hidden, atol=TOL, rtol=0
    )
    pair = hubert.extract((stereo, 48000))  # an array with its rate: resampled too
    np.testing.assert_allclose(pair.hidden, from_file.hidden, atol=1e-4, rtol=0)
    assert from_file.text == str(tmp_path / "clip.flac")


def test_whisper_reads_the_given_audio_and_cuts_at_thirty_seconds(tmp_path, caplog):
    enc = lw.Encoder(save_audio_model("whisper", tmp_path / "whisper"))
    assert enc.max_length == 1500
    short = enc.extract(np.zeros(RATE // 2, dtype=np.float32))  # half a second: 25 frames of 20 ms
    assert short.hidden.shape[1] == 25 and short.units.times[-1].tolist() == pytest.approx([0.48, 0.5])
    long = enc.extract(np.zeros(31 * RATE, dtype=np.float32))
    assert long.hidden.shape[1] == 1500 and long.truncated
    said = "longer than 1500 frames (30.0 s), the most one forward reads here (Whisper's window)"
    assert said in caplog.text
    windowed = enc.extract(np.zeros(45 * RATE, dtype=np.float32), long_texts="window")
    assert windowed.hidden.shape[1] == 2250 and not windowed.truncated  # windows at 0 and 750 frames
    np.testing.assert_allclose(windowed.hidden[:, :750], long.hidden[:, :750], atol=TOL, rtol=0)
    with pytest.raises(lw.OptionError, match="Whisper reads a 30-second window"):
        lw.Encoder(tmp_path / "whisper", max_length=100)


def test_sentence_pools_of_a_clip(hubert, waves):
    stacks = hubert.extract(waves)
    mean = hubert.embed(waves, layers=-1, pool="mean")
    for k, stack in enumerate(stacks):
        np.testing.assert_allclose(mean[k], stack.hidden[-1].mean(axis=0), atol=TOL)
    with pytest.raises(lw.OptionError, match="no \\[CLS\\] unit"):
        hubert.embed(waves, pool="cls")
    with pytest.raises(lw.OptionError, match="a clip has no words"):
        hubert.embed_words([waves[0]])


def test_bad_audio_is_refused_by_name(hubert, tmp_path):
    with pytest.raises(lw.InputError, match="does not exist"):
        hubert.extract(str(tmp_path / "missing.wav"))
    (tmp_path / "noise.wav").write_bytes(b"RIFF not really")
    with pytest.raises(lw.InputError, match="cannot be decoded as audio"):
        hubert.extract(str(tmp_path / "noise.wav"))
    with pytest.raises(lw.InputError, match="NaN or inf"):
        hubert.extract(np.array([0.0, np.nan, 0.0] * 100, dtype=np.float32))
    with pytest.raises(lw.InputError, match="rate"):
        hubert.extract((np.zeros(100, dtype=np.float32), 0))


def test_the_command_line_reads_audio_folders(tmp_path, waves):
    import soundfile
    from typer.testing import CliRunner

    from layerwise.cli import app

    folder = save_audio_model("wavlm", tmp_path / "wavlm")
    (tmp_path / "clips").mkdir()
    for k, wave in enumerate(waves):
        soundfile.write(tmp_path / "clips" / f"clip{k}.wav", wave, RATE, subtype="FLOAT")
    result = CliRunner().invoke(app, ["extract", str(tmp_path / "clips"), "-m", str(folder), "-o",
                                      str(tmp_path / "c.lw")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "stored 3 clips," in result.output
    store = lw.open_store(tmp_path / "c.lw")
    assert len(store) == 3 and store[0].text.endswith("clip0.wav")
    np.testing.assert_allclose(store[2].units.times, lw.Encoder(folder).extract(waves[2]).units.times)
    want = lw.Encoder(folder).extract(waves[0]).hidden
    np.testing.assert_allclose(store[0].hidden.astype(np.float32), want, atol=2e-2)
    assert lw.read_meta(tmp_path / "c.lw")["modality"] == "audio"
    result = CliRunner().invoke(app, ["info", "-m", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    import json

    said = json.loads(result.output)
    assert said["modality"] == "audio" and said["units"].startswith("frames of 10 samples")


def _frames_of(folder, wave):
    """transformers' states of ``wave`` alone: ``(n_states, frames, H)``."""
    return reference_states(folder, [wave])[0]


def test_long_clips_are_cut_or_read_in_windows_stitched_by_context(waves, tmp_path):
    folder = save_audio_model("wavlm", tmp_path / "wavlm")
    enc = lw.Encoder(folder, max_length=40)
    wave = waves[1]  # 188 frames
    stride, span = 10, 30
    cut = enc.extract(wave)
    assert cut.truncated and cut.hidden.shape[1] == 40
    np.testing.assert_allclose(cut.hidden, _frames_of(folder, wave[: 39 * stride + span]), atol=TOL, rtol=0)
    whole = enc.extract(wave, long_texts="window", stride=15)
    assert not whole.truncated and whole.hidden.shape[1] == 188
    starts = [*range(0, 188 - 40, 15), 188 - 40]  # the last window ends at the last frame
    parts = [_frames_of(folder, wave[o * stride : o * stride + 39 * stride + span]) for o in starts]
    for frame in range(188):  # the window in which the frame has the most context on both sides
        best = max((min(frame - o, o + 39 - frame), -k) for k, o in enumerate(starts) if o <= frame < o + 40)
        k = -best[1]
        np.testing.assert_allclose(
            whole.hidden[:, frame], parts[k][:, frame - starts[k]], atol=TOL, rtol=0, err_msg=f"frame {frame}"
        )
    with pytest.raises(lw.OptionError, match="stride=15 applies to windows"):
        enc.extract(wave, stride=15)
    with pytest.raises(lw.OptionError, match="between 1 and 40"):
        enc.extract(wave, long_texts="window", stride=41)


def test_options_a_media_model_has_no_use_for_are_refused(tmp_path):
    from media_models import save_image_model

    vit = save_image_model("vit", tmp_path / "vit")
    with pytest.raises(lw.OptionError, match="an image's units are fixed by its processor"):
        lw.Encoder(vit, max_length=50)
    for option, value in (("max_tokens", 4096), ("concurrent_forwards", 2), ("method", "hooks")):
        with pytest.raises(lw.OptionError, match=f"{option}="):
            lw.Encoder(vit, **{option: value})
    with pytest.raises(lw.OptionError, match="an image is read whole"):
        lw.Encoder(vit).extract(np.zeros((8, 8, 3), np.uint8), long_texts="window", stride=4)
