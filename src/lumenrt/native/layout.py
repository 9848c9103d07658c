"""Placing several native structures in one region: offsets, each aligned."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class Layout:
    """Hands out aligned offsets in order; ``size_bytes`` is the region size needed so far.

    >>> lay = Layout()
    >>> ring_at = lay.add(ring_required_bytes(1024))
    >>> pool_at = lay.add(slab_required_bytes(4096, 256), align=4096)
    """

    size_bytes: int = 0
    offsets: dict[str, int] = field(default_factory=dict)

    def add(self, nbytes: int, *, align: int = 64, name: str | None = None) -> int:
        if nbytes <= 0:
            raise ValueError(f"nbytes must be > 0, got {nbytes}")
        if align <= 0 or align & (align - 1):
            raise ValueError(f"align must be a power of two, got {align}")
        offset = (self.size_bytes + align - 1) & ~(align - 1)
        self.size_bytes = offset + nbytes
        if name is not None:
            self.offsets[name] = offset
        return offset
