"""The batcher on its own: the next run goes to a stream before the last one's answers go out, each
job's Finish is applied to its own rows, and a request that cannot be told stops nothing."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import layerwise as lw
from layerwise._features.plan import OutputPlan
from layerwise._inputs.raw import normalize_inputs
from layerwise.serve._batcher import Batcher, Finish, Job, LocalRunner, Run


@pytest.fixture(scope="module")
def tiny(make_tiny_model):
    return lw.Encoder(make_tiny_model("bert", 2), device="cpu")


def job_for(encoder, texts, finish, on_done, model="tiny"):
    encoded = encoder.inputs.encode(normalize_inputs(texts=texts))
    return Job(model, encoded, finish, on_done)


def counted_batcher(tiny) -> tuple[Batcher, list[Run]]:
    """A batcher (one stream, no waiting) and the list of the runs it hands its runner."""
    runs: list[Run] = []

    class Counted(LocalRunner):
        def start(self, slot, run):
            runs.append(run)
            super().start(slot, run)

    return Batcher({"tiny": tiny}, max_wait=0.0, runner=Counted({"tiny": tiny})), runs


class Recorder:
    """A job's answer, and when it came."""

    def __init__(self, events: list, name: str) -> None:
        self.events, self.name = events, name
        self.results = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def __call__(self, results, error) -> None:
        self.events.append(("answered", self.name))
        self.results, self.error = results, error
        self.done.set()


def test_the_next_run_starts_before_the_last_runs_answers_go_out(tiny):
    """One stream: while run 1 computes, job 2 arrives; when run 1's results are in, run 2 is handed
    to the stream first, then run 1's request is answered (the stream never waits on delivery)."""
    events: list = []
    first_started, second_queued = threading.Event(), threading.Event()

    class Watched(LocalRunner):
        def start(self, slot, run):
            events.append(("started", len(run.jobs), run.encoded[0].text))
            super().start(slot, run)
            first_started.set()

        def collect(self, slot):
            if len(events) == 1:  # run 1: finish once job 2 is waiting
                second_queued.wait(10)
            return super().collect(slot)

    batcher = Batcher({"tiny": tiny}, max_wait=0.0, runner=Watched({"tiny": tiny}))
    batcher.start()
    try:
        first, second = Recorder(events, "first"), Recorder(events, "second")
        batcher.submit(job_for(tiny, ["one"], Finish((0, 2)), first))
        assert first_started.wait(10)
        batcher.submit(job_for(tiny, ["two"], Finish((0, 2)), second))
        second_queued.set()
        assert first.done.wait(30) and second.done.wait(30)
    finally:
        batcher.close(30)
    assert events == [
        ("started", 1, "one"),
        ("started", 1, "two"),
        ("answered", "first"),
        ("answered", "second"),
    ]
    want = tiny.extract(["one"], layers=[0, 2])[0].hidden
    np.testing.assert_allclose(first.results[0].hidden, want, atol=1e-6)


def test_each_job_gets_its_finish_applied_to_its_own_rows(tiny):
    """Jobs with different layers and plans in one run: each gets exactly what it asked for."""
    events: list = []
    batcher, runs = counted_batcher(tiny)
    n_hidden = tiny.n_hidden_states
    sentence = OutputPlan.parse(layers="last2", pool="sentence:mean", fuse="mean")
    word = OutputPlan.parse(layers=1, pool="word:first")
    asks = {
        "tokens": (["a river bank"], Finish((1,))),
        "sentence": (["the bank", "a loan"], Finish(sentence.hidden_states(n_hidden), sentence, n_hidden)),
        "words": (["river bank rates"], Finish(word.hidden_states(n_hidden), word, n_hidden)),
    }
    recorders = {name: Recorder(events, name) for name in asks}
    for name, (texts, finish) in asks.items():  # queued before the stream starts: one run for all
        batcher.submit(job_for(tiny, texts, finish, recorders[name]))
    batcher.start()
    try:
        assert all(r.done.wait(30) for r in recorders.values())
    finally:
        batcher.close(30)
    assert (
        len(runs) == 1 and len(runs[0].jobs) == 3 and runs[0].forward.layers == (1, 2)
    )  # the union of the three
    tokens = recorders["tokens"].results[0]
    assert tokens.layers == (1,)
    np.testing.assert_allclose(tokens.hidden, tiny.extract(["a river bank"], layers=[1])[0].hidden, atol=1e-6)
    got = np.stack([recorders["sentence"].results[i].vector for i in range(2)])
    want = tiny.embed(["the bank", "a loan"], layers="last2", pool="mean", fuse="mean")
    np.testing.assert_allclose(got, want, atol=1e-6)
    words = recorders["words"].results[0]
    assert words.words == ("river", "bank", "rates")
    want_words = tiny.embed_words(["river bank rates"], layers=1, subword="first")[0].vectors
    np.testing.assert_allclose(words.vectors[0], want_words, atol=1e-6)  # the plan keeps the layer axis


def test_a_request_that_cannot_be_told_stops_nothing(tiny, caplog):
    """An answer that fails to arrive (its event loop is gone) is logged; the stream goes on."""
    events: list = []

    def closed_loop(results, error):
        raise RuntimeError("Event loop is closed")

    batcher = Batcher({"tiny": tiny}, max_wait=0.0)
    batcher.start()
    try:
        batcher.submit(job_for(tiny, ["lost"], Finish((2,)), closed_loop))
        later = Recorder(events, "later")
        batcher.submit(job_for(tiny, ["kept"], Finish((2,)), later))
        assert later.done.wait(30)
        assert batcher.alive
    finally:
        batcher.close(30)
    assert later.error is None
    np.testing.assert_allclose(
        later.results[0].hidden, tiny.extract(["kept"], layers=[2])[0].hidden, atol=1e-6
    )
    assert "could not be delivered" in caplog.text


def test_a_run_is_the_jobs_inputs_renumbered_with_their_owners(tiny):
    jobs = [job_for(tiny, texts, Finish(layers), lambda r, e: None) for texts, layers in
            ((["a", "b"], (1,)), (["c"], (0, 2)))]  # fmt: skip
    run = Run.of(jobs)
    assert [item.index for item in run.encoded] == [0, 1, 2]
    assert [item.text for item in run.encoded] == ["a", "b", "c"]
    assert run.owners == [(jobs[0], 0), (jobs[0], 1), (jobs[1], 0)]
    assert run.forward.layers == (0, 1, 2) and run.finishes == [
        jobs[0].finish,
        jobs[0].finish,
        jobs[1].finish,
    ]
    assert run.n_tokens == sum(len(item) for item in run.encoded)


def test_a_lone_client_is_served_by_slot_zero_and_a_crowd_by_every_slot(tiny):
    """Only stream 0 runs a lone job on all threads (model_process.py), so with every stream idle a
    lone client's job goes to stream 0, whichever stream's thread sees it first; under load, every
    stream takes runs."""
    slots: list[int] = []
    release = threading.Event()

    class Slots(LocalRunner):
        def start(self, slot, run):
            slots.append(slot)
            super().start(slot, run)

        def collect(self, slot):
            if len(slots) > 40:  # the crowd: hold runs until the queue has built up
                release.wait(10)
            return super().collect(slot)

    runner = Slots({"tiny": tiny}, forwards=2)
    batcher = Batcher({"tiny": tiny}, max_wait=0.0, runner=runner)
    lone = job_for(tiny, ["alone"], Finish((2,)), Recorder([], "alone"))
    batcher._jobs.append(lone)  # the rule itself, before any thread runs
    assert batcher._for_slot_zero(1) and not batcher._for_slot_zero(0)
    batcher._running = 1  # a stream is busy: any idle stream takes it
    assert not batcher._for_slot_zero(1)
    batcher._running = 0
    batcher._jobs.append(lone)  # two jobs waiting: a crowd
    assert not batcher._for_slot_zero(1)
    batcher._jobs.clear()
    batcher.start()
    try:
        for i in range(40):  # one client: each request after the last one's answer
            done = Recorder([], str(i))
            batcher.submit(job_for(tiny, [f"text {i}"], Finish((2,)), done))
            assert done.done.wait(30) and done.error is None
        assert slots == [0] * 40
        crowd = [Recorder([], str(i)) for i in range(8)]
        for i, done in enumerate(crowd):
            batcher.submit(job_for(tiny, [f"crowd {i}"], Finish((2,)), done))
            time_to_gather = threading.Event()
            time_to_gather.wait(0.02)
        release.set()
        assert all(done.done.wait(30) and done.error is None for done in crowd)
    finally:
        release.set()
        batcher.close(30)
    assert set(slots[40:]) == {0, 1}


def test_queue_wait_is_measured_from_arrival_to_the_start_of_the_run(tiny):
    """/metrics' queue-wait histogram: a job that arrives while the only stream computes waits
    until that run ends (held here for 0.3 s); the first job, with max_wait 0, waits for nothing."""
    from layerwise.serve._metrics import Metrics

    hold = 0.3
    first_started = threading.Event()

    class Held(LocalRunner):
        def start(self, slot, run):
            super().start(slot, run)
            first_started.set()

        def collect(self, slot):
            if not held.is_set():
                held.set()
                threading.Event().wait(hold)
            return super().collect(slot)

    held = threading.Event()
    metrics = Metrics()
    batcher = Batcher({"tiny": tiny}, max_wait=0.0, runner=Held({"tiny": tiny}), metrics=metrics)
    batcher.start()
    try:
        events: list = []
        first, second = Recorder(events, "first"), Recorder(events, "second")
        batcher.submit(job_for(tiny, ["one"], Finish((2,)), first))
        assert first_started.wait(10)
        batcher.submit(job_for(tiny, ["two"], Finish((2,)), second))
        assert first.done.wait(30) and second.done.wait(30)
    finally:
        batcher.close(30)
    sample = metrics.registry.get_sample_value
    assert sample("layerwise_queue_wait_seconds_count") == 2
    assert sample("layerwise_queue_wait_seconds_bucket", {"le": "0.1"}) == 1  # the first job
    assert hold * 0.9 <= sample("layerwise_queue_wait_seconds_sum") <= hold + 5


def test_a_poisoned_input_fails_only_its_own_request(tiny):
    """31 good jobs and one whose input has a token id past the model's embedding rows (what a
    tokenizer that disagrees with its model produces) are merged into one run: the run fails with an
    IndexError, the batcher runs the jobs again in halves, and only the poisoned job gets the error;
    the 31 others get the vectors an offline extraction gives."""
    import dataclasses

    events: list = []
    batcher, runs = counted_batcher(tiny)
    texts = [f"request {i} about the river bank" for i in range(32)]
    recorders = [Recorder(events, str(i)) for i in range(32)]
    poisoned = 13
    for i, text in enumerate(texts):
        job = job_for(tiny, [text], Finish((0, 2)), recorders[i])
        if i == poisoned:
            item = job.encoded[0]
            ids = (item.ids[0], tiny.config.vocab_size + 5, *item.ids[2:])
            job = Job("tiny", [dataclasses.replace(item, ids=ids)], Finish((0, 2)), recorders[i])
        batcher.submit(job)  # all queued before the stream starts: one merged run
    batcher.start()
    try:
        assert all(r.done.wait(60) for r in recorders)
    finally:
        batcher.close(30)
    assert len(runs[0].jobs) == 32  # merged, then split: 1 + 2 per level of halving (5 levels)
    assert len(runs) == 1 + 2 * 5
    assert isinstance(recorders[poisoned].error, IndexError)
    want = tiny.extract([t for i, t in enumerate(texts) if i != poisoned], layers=[0, 2])
    good = [r for i, r in enumerate(recorders) if i != poisoned]
    for recorder, stack in zip(good, want, strict=True):
        assert recorder.error is None
        np.testing.assert_allclose(recorder.results[0].hidden, stack.hidden, atol=1e-5)


def test_the_vocabulary_check_refuses_an_id_the_model_lacks_at_encode_time(tiny):
    from layerwise._inputs.encoding import InputEncoder
    from layerwise.errors import InputError

    tokenizer = tiny.tokenizer.backend_tokenizer
    small = InputEncoder(tokenizer, tiny.max_length, vocab_size=1000)  # [CLS]=101, "!"=999 fit
    expected = r"token 'river' with id 2314 >= the model's vocab size 1000"
    with pytest.raises(InputError, match=expected) as caught:
        small.encode(normalize_inputs(texts=["!", "! river"]))  # "!" = 999
    assert caught.value.index == 1


def test_a_run_is_one_forward_and_requests_that_differ_in_it_run_apart(tiny):
    """A run's forward (model, hidden states, stride, final norm) is one value, sent whole; requests
    with another window stride or final norm are not merged into it (the forward would not be
    theirs)."""
    from layerwise.serve._jobs import Forward

    finish = Finish((1,))
    a, b = (job_for(tiny, ["the river bank"], finish, lambda r, e: None) for _ in range(2))
    strided = job_for(tiny, ["the river bank"], finish, lambda r, e: None)
    strided.stride = 5
    normed = job_for(tiny, ["the river bank"], finish, lambda r, e: None)
    normed.final_norm = False
    assert a.key == b.key and len({a.key, strided.key, normed.key}) == 3
    assert Run.of([a, b]).forward == Forward("tiny", (1,), None, True)
    assert Run.of([strided]).forward == Forward("tiny", (1,), 5, True)
    batcher, runs = counted_batcher(tiny)
    answered = threading.Event()
    count = [0]

    def done(results, error):
        count[0] += 1
        if count[0] == 3:
            answered.set()

    jobs = [job_for(tiny, ["the river bank"], finish, done) for _ in range(3)]
    jobs[1].stride = 7
    for job in jobs:  # queued before the stream starts: merged where they can be
        batcher.submit(job)
    batcher.start()
    try:
        assert answered.wait(30)
    finally:
        batcher.close(30)
    assert sorted((r.forward.stride or 0, len(r.jobs)) for r in runs) == [(0, 2), (7, 1)]
