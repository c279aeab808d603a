"""Concurrent forwards on the CPU: same numbers, their own thread counts, a lock that keeps
the Hugging Face forward alone."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from conftest import ud_sentences

import layerwise as lw
from layerwise._model.forward.concurrent import ForwardLock, check_forwards
from layerwise.errors import OptionError

TEXTS = ud_sentences("dev", 120)


@pytest.fixture(scope="module")
def two_threads():
    """The tests need two torch threads to split (CI's machine has two cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def encoders(make_tiny_model, two_threads):
    folder = make_tiny_model("bert", 3)
    return (
        lw.Encoder(folder, device="cpu", concurrent_forwards=2, max_tokens=512),
        lw.Encoder(folder, device="cpu", concurrent_forwards=1, max_tokens=512),
    )


def test_concurrent_forwards_give_the_numbers_of_one_at_every_layer(encoders):
    concurrent, single = encoders
    assert concurrent.engine.pool is not None and single.engine.pool is None
    a, b = concurrent.extract(TEXTS, layers="all"), single.extract(TEXTS, layers="all")
    assert [s.tokens for s in a] == [s.tokens for s in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x.hidden, y.hidden, atol=1e-5, rtol=0)


def test_batches_run_on_the_forward_threads_each_with_its_share_of_threads(encoders, monkeypatch):
    concurrent, _ = encoders
    engine = concurrent.engine
    seen: list[tuple[str, int]] = []
    forward = engine.packed.forward

    def spy(batch, layers):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return forward(batch, layers)

    monkeypatch.setattr(engine.packed, "forward", spy)
    concurrent.extract(TEXTS, layers=-1)
    assert len(seen) >= 4  # 120 sentences under a 512-token budget
    assert {name.rsplit("_", 1)[0] for name, _ in seen} == {"layerwise-forward"}
    assert len({name for name, _ in seen}) == 2
    assert {threads for _, threads in seen} == {1}  # 2 torch threads split over 2 forwards
    assert torch.get_num_threads() == 2  # the caller's own setting is untouched


def test_a_small_call_is_split_so_that_no_forward_idles(encoders, monkeypatch):
    concurrent, single = encoders
    sizes: list[int] = []
    forward = concurrent.engine.packed.forward

    def spy(batch, layers):
        sizes.append(len(batch.lengths))
        return forward(batch, layers)

    monkeypatch.setattr(concurrent.engine.packed, "forward", spy)
    texts = TEXTS[:8]  # one batch's worth
    result = concurrent.extract(texts)
    assert len(sizes) == 2 and sum(sizes) == 8
    for x, y in zip(result, single.extract(texts), strict=True):
        np.testing.assert_allclose(x.hidden, y.hidden, atol=1e-5, rtol=0)


def test_an_error_in_a_forward_reaches_the_caller_and_the_pool_goes_on(encoders, monkeypatch):
    concurrent, single = encoders
    forward = concurrent.engine.packed.forward
    calls = 0

    def failing(batch, layers):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("batch two broke")
        return forward(batch, layers)

    monkeypatch.setattr(concurrent.engine.packed, "forward", failing)
    with pytest.raises(RuntimeError, match="batch two broke"):
        concurrent.extract(TEXTS)
    monkeypatch.undo()
    result = concurrent.extract(TEXTS[:5])
    np.testing.assert_allclose(result[0].hidden, single.extract(TEXTS[:1])[0].hidden, atol=1e-5, rtol=0)


def test_a_caller_that_stops_early_leaves_the_forwards_usable(encoders):
    concurrent, single = encoders
    stream = concurrent.iter_extract(TEXTS, layers=-1)
    first = next(stream)
    stream.close()  # the batches not yet started are dropped
    index, stack = first
    assert stack.hidden.shape[0] == 1 and 0 <= index < len(TEXTS)
    # what came before the stop is right, and so is what runs after it
    np.testing.assert_allclose(
        stack.hidden, single.extract([TEXTS[index]], layers=-1)[0].hidden, atol=1e-5, rtol=0
    )
    after = concurrent.extract(TEXTS[:3])
    for got, want in zip(after, single.extract(TEXTS[:3]), strict=True):
        assert got.text == want.text
        np.testing.assert_allclose(got.hidden, want.hidden, atol=1e-5, rtol=0)


def test_hugging_face_forwards_wait_for_packed_ones_and_run_alone():
    lock = ForwardLock()
    events: list[str] = []
    shared_in = threading.Event()

    def packed() -> None:
        with lock.shared():
            shared_in.set()
            time.sleep(0.2)
            events.append("packed done")

    def padded() -> None:
        with lock.exclusive():
            events.append("padded in")
            with lock.exclusive():  # reentrant for its owner
                events.append("padded again")

    reader = threading.Thread(target=packed)
    reader.start()
    shared_in.wait(5)
    writer = threading.Thread(target=padded)
    writer.start()
    writer.join(5)
    reader.join(5)
    assert events == ["packed done", "padded in", "padded again"]


def test_a_waiting_hugging_face_forward_is_not_starved_by_new_packed_ones():
    lock = ForwardLock()
    order: list[str] = []
    first_in = threading.Event()

    def packed(name: str, hold: float) -> None:
        with lock.shared():
            first_in.set()
            time.sleep(hold)
            order.append(name)

    first = threading.Thread(target=packed, args=("first", 0.3))
    first.start()
    first_in.wait(5)

    def padded() -> None:
        with lock.exclusive():
            order.append("padded")
            time.sleep(0.1)

    writer = threading.Thread(target=padded)
    writer.start()
    time.sleep(0.05)  # the writer is waiting now
    late = threading.Thread(target=packed, args=("late", 0.0))
    late.start()
    for thread in (first, writer, late):
        thread.join(5)
    assert order == ["first", "padded", "late"]  # the late reader waited behind the writer


def test_concurrent_forwards_option_names_the_bad_value():
    with pytest.raises(OptionError, match=r"concurrent_forwards=0 must be a whole number >= 1"):
        check_forwards(0, torch.device("cpu"), 384)
    with pytest.raises(OptionError, match=r"concurrent_forwards=2 runs batches side by side on the CPU only"):
        check_forwards(2, torch.device("cuda"), 384)
    assert check_forwards(None, torch.device("cuda"), 384) == 1
    assert check_forwards(None, torch.device("cpu"), 768) == 1  # BERT-base: one forward is faster
    assert check_forwards(3, torch.device("cpu"), 768) == 3


def test_small_models_get_two_concurrent_forwards_by_default(make_tiny_model, two_threads):
    assert check_forwards(None, torch.device("cpu"), 384) == 2
    assert lw.Encoder(make_tiny_model("bert", 2), device="cpu").engine.pool is not None  # 32 wide


def test_the_padded_forward_has_no_concurrent_forwards(make_tiny_model, two_threads):
    encoder = lw.Encoder(make_tiny_model("bert", 2), device="cpu", packed=False, concurrent_forwards=2)
    assert encoder.engine.pool is None


def test_streams_is_a_deprecated_alias_that_warns_and_names_the_new_option(make_tiny_model, tmp_path):
    """``streams`` (the earlier name) still works for one release: a FutureWarning naming
    concurrent_forwards, and the same setting; both names at once, disagreeing, is an error; an
    output recorded with the old name reads back under the new one."""
    model = make_tiny_model("bert", 2)
    with pytest.warns(FutureWarning, match=r"streams=2 is deprecated .* use concurrent_forwards=2"):
        encoder = lw.Encoder(model, device="cpu", streams=2)
    assert encoder.settings.concurrent_forwards == 2 and encoder.engine.pool.forwards == 2
    with pytest.warns(FutureWarning), pytest.raises(OptionError, match=r"give concurrent_forwards only"):
        lw.Settings(streams=2, concurrent_forwards=1)
    assert lw.Settings.from_dict({**lw.Settings().as_dict(), "streams": 3}).concurrent_forwards == 3
    assert "streams" not in lw.Settings().as_dict()


def test_the_command_line_s_streams_warns_and_sets_concurrent_forwards(make_tiny_model, tmp_path):
    from typer.testing import CliRunner

    from layerwise.cli import app

    model, out, texts = make_tiny_model("bert", 2), tmp_path / "out.npz", tmp_path / "texts.txt"
    texts.write_text("hello\n")
    with pytest.warns(FutureWarning, match=r"--concurrent-forwards"):
        result = CliRunner().invoke(
            app,
            ["extract", str(texts), "-m", str(model), "--device", "cpu", "--streams", "1", "-o", str(out)],
        )
    assert result.exit_code == 0, result.output
    assert lw.read_meta(out)["concurrent_forwards"] == 1


def test_the_server_s_settings_take_streams_as_the_deprecated_alias():
    from layerwise.serve import ServeSettings

    with pytest.warns(FutureWarning, match=r"use concurrent_forwards=2"):
        assert ServeSettings(streams=2).concurrent_forwards == 2
    assert ServeSettings(concurrent_forwards=3).concurrent_forwards == 3
