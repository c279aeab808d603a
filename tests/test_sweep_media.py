"""The sweep of transformers' image and audio types (tests/sweep_media.py): each equal to
transformers, or refused by name for a reason that holds; none wrong."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("PIL")
pytest.importorskip("soundfile")

from sweep_media import media_types, sweep

from layerwise._model.families.media import MEDIA_FAMILIES, TOWERS

pytestmark = pytest.mark.xdist_group("media-sweep")


def test_every_image_and_audio_type_is_equal_or_refused_with_its_reason():
    outcomes = sweep()
    wrong = [o for o in outcomes if o["outcome"] not in ("equal", "refused", "skipped")]
    assert not wrong, wrong
    equal = {o["type"] for o in outcomes if o["outcome"] == "equal"}
    ours = (set(MEDIA_FAMILIES) | set(TOWERS)) & set(media_types())
    assert equal == ours, equal ^ ours  # every family in the mappings is compared, and equal
    reasons = Counter(o["reason"] for o in outcomes if o["outcome"] == "refused")
    assert reasons["hierarchical"] >= 20 and reasons["multimodal"] >= 5 and reasons["other"] == 7
    assert sum(o["outcome"] == "skipped" for o in outcomes) <= 5
