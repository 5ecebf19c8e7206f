"""Band-class policies are validated when they load (as Swift does) and code systematically."""

from __future__ import annotations

import os

import pytest

from engine.base.errors import ConfigError
from engine.coding.erasure import (
    DecodeError,
    fragment_bytes,
    fragment_length,
    load_policies,
    policy_from_dict,
)


def test_defaults():
    policies = load_policies()
    warm, hot, cold = policies["warm"], policies["hot"], policies["cold"]
    assert (warm.redundancy, warm.k, warm.m, warm.backend, warm.fragment_size) == (
        "ec",
        8,
        2,
        "isa_l_rs_vand",
        1 << 20,
    )
    assert (hot.redundancy, hot.copies, hot.width) == ("replicate", 3, 3)
    assert (cold.k, cold.m, cold.compression) == (8, 2, "zstd")
    assert warm.header_size > 0 and warm.stripe_size == 8 << 20


@pytest.mark.parametrize(
    "options, key, fragment",
    [
        ({"backend": "jerasure_rs_vand"}, "band_classes.warm.backend", "present in pyeclib"),
        ({"backend": "no_such_backend"}, "band_classes.warm.backend", "present in pyeclib"),
        ({"k": 1}, "band_classes.warm.k", "from 2 to 32"),
        ({"k": 33}, "band_classes.warm.k", "from 2 to 32"),
        ({"k": "8"}, "band_classes.warm.k", "integer"),
        ({"m": 0}, "band_classes.warm.m", "from 1 to 8"),
        ({"fragment_size": 1000}, "band_classes.warm.fragment_size", "from 4096"),
        ({"fragment_size": 4097}, "band_classes.warm.fragment_size", "multiple of 4096"),
        ({"redundancy": "raid5"}, "band_classes.warm.redundancy", "one of"),
        ({"compression": "lz4"}, "band_classes.warm.compression", "zstd"),
        ({"kk": 3}, "band_classes.warm.kk", "one of the options"),
        ({"redundancy": "replicate", "copies": 1}, "band_classes.warm.copies", "from 2"),
    ],
)
def test_bad_policies_are_refused_at_load_with_key_value_and_expectation(options, key, fragment):
    with pytest.raises(ConfigError) as info:
        policy_from_dict("warm", options)
    assert info.value.key == key
    assert fragment in info.value.expected
    assert repr(list(options.values())[-1]) in str(info.value)


@pytest.mark.parametrize("backend", ["isa_l_rs_vand", "isa_l_rs_cauchy", "liberasurecode_rs_vand"])
def test_any_two_fragments_may_be_lost(backend):
    policy = policy_from_dict("warm", {"backend": backend, "fragment_size": 4096})
    data = os.urandom(policy.stripe_size - 1234)
    fragments = policy.encode(data)
    assert len(fragments) == 10
    assert len({len(f) for f in fragments}) == 1
    assert len(fragments[0]) <= policy.fragment_length(len(data))
    p = len(fragments[0]) - policy.header_size
    assert (
        fragments[3][policy.header_size : policy.header_size + p] == data[3 * p : 4 * p]
    )  # systematic
    for lost in [(0, 1), (3, 9), (8, 9)]:
        kept = {i: f for i, f in enumerate(fragments) if i not in lost}
        assert policy.decode(kept, len(data)) == data
    with pytest.raises(DecodeError):
        policy.decode({i: fragments[i] for i in range(7)}, len(data))


def test_replica_policy():
    policy = policy_from_dict("hot", {})
    assert (
        policy.layout == "replica" and policy.k == 1 and policy.m == 2 and policy.header_size == 0
    )
    data = b"small random write"
    copies = policy.encode(data)
    assert copies == [data] * 3
    assert policy.decode({2: copies[2]}, len(data)) == data


def test_the_slice_encoder_writes_liberasurecode_fragments_from_the_stripe_itself():
    """isa_l backends encode on slices of the stripe's buffer (no copy of the data): each
    fragment is a header and a payload that equal liberasurecode's, byte for byte, for a
    length seen before (the headers learned) or not; the data fragments' payloads are the
    stripe's own memory until released."""
    policy = policy_from_dict("warm", {"fragment_size": 4096})
    assert type(policy._native).__name__ == "_SliceEncoder"
    for length in (policy.stripe_size, 3 * 4096 + 5, 777):
        for _ in range(2):
            data = bytearray(os.urandom(length))
            encoded = policy.encode_stripe(data)
            fragments = [bytes(fragment_bytes(f)) for f in encoded.fragments]
            assert fragments == policy.encode(bytes(data))
            assert {fragment_length(f) for f in encoded.fragments} == {len(fragments[0])}
            if isinstance(encoded.fragments[0], tuple):  # the second time: slices
                payload = encoded.fragments[0][1]
                assert payload.obj is data and len(payload) == len(fragments[0]) - 80
                with pytest.raises(BufferError):
                    data.append(0)  # pinned while its fragments are being written
            encoded.release()
            data.append(0)  # free again once released
        assert isinstance(encoded.fragments, list)
