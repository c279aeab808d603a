import numpy as np
import pytest

from layerwise._features.layers import resolve_layers
from layerwise.errors import LayerSpecError


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("all", (0, 1, 2, 3, 4, 5, 6)),
        (3, (3,)),
        (-1, (6,)),
        (0, (0,)),
        ([0, 4, -1], (0, 4, 6)),
        ([-1, -2], (6, 5)),  # order as given
        ((2, 1), (2, 1)),
        ("0,4,-1", (0, 4, 6)),
        (" 0 , 4 ", (0, 4)),
        ("-1", (6,)),
        ("0:4", (0, 1, 2, 3)),
        ("-4:", (3, 4, 5, 6)),
        (":2", (0, 1)),
        ("1:-1", (1, 2, 3, 4, 5)),
        ("last4", (3, 4, 5, 6)),
        ("LAST1", (6,)),
        ("last7", (0, 1, 2, 3, 4, 5, 6)),
        ("embeddings", (0,)),
        (np.int64(2), (2,)),
        ([np.int32(1), 2], (1, 2)),
        # relative depths: round(f x 6), half up
        ("0.5", (3,)),
        (0.5, (3,)),
        (".5", (3,)),
        ("0.25,0.5,0.75", (2, 3, 5)),
        ([0.25, 1.0], (2, 6)),
        ("0,0.5,-1", (0, 3, 6)),
        ("0.0", (0,)),
        ("1.0", (6,)),
        ("1.", (6,)),
    ],
)
def test_specs_resolve(spec, expected):
    assert resolve_layers(spec, 7) == expected


def test_out_of_range_message_states_convention():
    with pytest.raises(LayerSpecError) as info:
        resolve_layers(13, 7)
    assert str(info.value) == (
        "layer 13 out of range: this model has 7 hidden states, 0 = embeddings … 6; use -1 for the last"
    )
    with pytest.raises(LayerSpecError, match="layer -8 out of range"):
        resolve_layers([0, -8], 7)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("last8", "asks for 8 hidden states"),
        ("last0", "asks for 0"),
        ("3:3", "is empty"),
        ("0:9", "bound 9 out of range"),
        ([], "empty layer list"),
        ([1, 1], "more than once"),
        ("1,,2", "empty item"),
        ("top", "not understood"),
        ("a,b", "neither an index nor a relative depth"),
        (True, "bool"),
        (1.5, r"relative depth 1\.5 must lie in 0\.0 … 1\.0"),
        ("1.5", r"relative depth '1\.5' must lie in"),
        ([0.5, 3.0], "must lie in"),
        (float("nan"), "must lie in"),
        ("-0.5", "not understood"),
        ("0.1,0.12", "more than once"),
        ("\u0663", "not understood"),  # Arabic-Indic 3: int() would take it, a layer spec must not
        ("last\u0663", "not understood"),
        ("\u0663:", "not understood"),
    ],
)
def test_bad_specs(spec, fragment):
    with pytest.raises(LayerSpecError, match=fragment):
        resolve_layers(spec, 7)


def test_layer_spec_error_is_value_error():
    with pytest.raises(ValueError):
        resolve_layers(99, 7)
