"""Property test: any sequence of try_push/try_pop/pop_many on a ring behaves like a bounded deque."""

import collections

from hypothesis import given, settings
from hypothesis import strategies as st

from lumenrt.native import RING_KINDS, make_ring

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 2**64 - 1)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("pop_many"), st.integers(1, 20)),
    ),
    max_size=200,
)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(RING_KINDS), capacity_log2=st.integers(1, 5), program=ops)
def test_ring_matches_bounded_deque(kind: str, capacity_log2: int, program: list[tuple[str, int]]) -> None:
    capacity = 1 << capacity_log2
    ring = make_ring(kind, capacity)
    model: collections.deque[int] = collections.deque()
    for op, arg in program:
        if op == "push":
            accepted = ring.try_push(arg)
            assert accepted == (len(model) < capacity)
            if accepted:
                model.append(arg)
        elif op == "pop":
            item = ring.try_pop()
            assert (item.request_id if item else None) == (model.popleft() if model else None)
        else:
            got = [x.request_id for x in ring.pop_many(arg, timeout_s=0)]
            want = [model.popleft() for _ in range(min(arg, len(model)))]
            assert got == want
        assert len(ring) == len(model)
