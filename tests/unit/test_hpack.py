"""HPACK (protocols/hpack.py): the Huffman code and the decoder checked against an independent
implementation (the ``hpack`` package, h2's), its bounds and errors, and the block cache."""

import hpack as theirs
import pytest
from hpack import huffman_constants
from hypothesis import given, settings
from hypothesis import strategies as st

from lumenrt.protocols.hpack import (
    HUFFMAN_CODES,
    HeaderListTooLarge,
    HpackDecoder,
    HpackError,
    encode_block,
    encode_int,
    huffman_decode,
    huffman_encode,
)


def test_the_huffman_code_rebuilt_from_its_lengths_is_rfc_7541s() -> None:
    expected = list(zip(huffman_constants.REQUEST_CODES, huffman_constants.REQUEST_CODES_LENGTH, strict=True))
    assert expected == HUFFMAN_CODES


@given(st.binary(max_size=64))
def test_huffman_round_trips_and_matches_hpacks_encoder(data: bytes) -> None:
    coded = huffman_encode(data)
    assert coded == theirs.huffman.HuffmanEncoder(
        huffman_constants.REQUEST_CODES, huffman_constants.REQUEST_CODES_LENGTH
    ).encode(data)
    assert huffman_decode(coded) == data


def test_huffman_refuses_eos_and_bad_padding() -> None:
    with pytest.raises(HpackError, match="EOS"):
        huffman_decode(b"\xff\xff\xff\xff")  # 30 ones: EOS
    with pytest.raises(HpackError, match="padding"):
        huffman_decode(huffman_encode(b"a")[:-1] + b"\x00")  # padding of zeros
    with pytest.raises(HpackError, match="padding"):
        huffman_decode(huffman_encode(b"abc") + b"\xff")  # 8 bits of padding: too long


_names = st.sampled_from([b"content-type", b"te", b"grpc-timeout", b":path", b"x-key", b"authorization"])
_fields = st.lists(
    st.tuples(st.one_of(_names, st.binary(min_size=1, max_size=20).map(bytes.lower)), st.binary(max_size=40)),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_fields, st.booleans(), st.sampled_from([None, 0, 64, 256, 4096])),
        min_size=1,
        max_size=12,
    )
)
def test_decoding_what_hpacks_encoder_sends_block_after_block(blocks: list) -> None:
    """The peer's encoder indexes as it likes, codes strings or not and resizes its table; the
    decoder keeps in step over a connection's blocks (the cache included)."""
    encoder, decoder = theirs.Encoder(), HpackDecoder()
    for fields, huffman, table_size in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        block = encoder.encode(fields, huffman=huffman)
        assert decoder.decode(block) == fields
        assert decoder.decode(encoder.encode(fields, huffman=huffman)) == fields  # again (cached or not)


def test_a_cached_block_is_not_served_once_the_table_changed() -> None:
    decoder = HpackDecoder()
    decoder.decode(b"\x40\x03x-a\x011")  # a literal added to the table: x-a: 1 at index 62
    indexed = b"\xbe"  # index 62
    assert decoder.decode(indexed) == [(b"x-a", b"1")]
    decoder.decode(b"\x40\x03x-b\x012")  # a new entry takes index 62
    assert decoder.decode(indexed) == [(b"x-b", b"2")]


def test_encode_block_decodes_the_same_with_both_decoders() -> None:
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"0")]
    block = encode_block(fields)
    assert block[0] == 0x88  # :status 200 indexed from the static table
    assert HpackDecoder().decode(block) == fields
    assert theirs.Decoder().decode(block, raw=True) == fields
    resized = encode_block(fields, table_size_update=0)
    assert resized[0] == 0x20
    assert HpackDecoder().decode(resized) == fields


@pytest.mark.parametrize(
    ("block", "match"),
    [
        (b"\x80", "outside the tables"),  # index 0
        (b"\xff\x00", "outside the tables"),  # index 127: the dynamic table is empty
        (b"\x40\x05ab", "claims 5 octets"),  # a name longer than the block
        (b"\x00", "past the end"),  # a literal with no name length
        (encode_int(5000, 5, 0x20), "limit is 4096"),  # a table size update past our setting
        (b"\x88\x20", "after a header field"),
        (b"\xff\xff\xff\xff\xff\xff\xff\x7f", "too long"),  # an integer that never ends
        (b"\x00\x84\xff\xff\xff\xff", "EOS"),  # a Huffman-coded name of 32 ones: EOS
    ],
)
def test_malformed_blocks_are_compression_errors(block: bytes, match: str) -> None:
    with pytest.raises(HpackError, match=match):
        HpackDecoder().decode(block)


def test_a_header_list_over_the_limit_leaves_the_decoder_in_step() -> None:
    decoder = HpackDecoder(max_list_bytes=100)
    big = b"\x40\x03x-a" + encode_int(60, 7) + b"v" * 60 + b"\x88"  # 95 + 42 octets listed
    with pytest.raises(HeaderListTooLarge):
        decoder.decode(big)
    assert decoder.decode(b"\xbe") == [(b"x-a", b"v" * 60)]  # the entry was added: still in step


def test_an_entry_larger_than_the_table_empties_it() -> None:
    decoder = HpackDecoder(max_table_size=64)
    decoder.decode(b"\x40\x01a\x01b")
    decoder.decode(b"\x40\x01c" + encode_int(40, 7) + b"d" * 40)  # 1 + 40 + 32 > 64
    with pytest.raises(HpackError, match="outside"):
        decoder.decode(b"\xbe")
