"""The queueing (sojourn) delay packets saw at a bottleneck the delay line owns, from its own histogram.

delayline.c counts each packet the bottleneck sends in bucket i = floor(4 log2(sojourn in us)), so bucket i
holds [2^(i/4), 2^((i+1)/4)) us: about 19 % wide, from 1 us to 16 s. The stats file has one line per bucket
that is not empty (`sojourn_bucket_<i> <count>`). A percentile is its bucket's geometric middle (within 9 %).
Under dualpi2 the packets of its L queue are also counted apart (`sojourn_l_bucket_<i>`): the C queue's are
the rest.
"""

from __future__ import annotations

import math

PREFIX = "sojourn_bucket_"
L_PREFIX = "sojourn_l_bucket_"
PREFIXES = (PREFIX, L_PREFIX)  # every histogram's keys


def buckets(stats: dict[str, int], prefix: str = PREFIX) -> dict[int, int]:
    return {int(key.removeprefix(prefix)): count for key, count in stats.items() if key.startswith(prefix) and count}


def summaries(stats: dict[str, int]) -> dict[str, dict]:
    """`sojourn`: every packet's; with dualpi2's L queue counted apart, `sojourn_l` and `sojourn_c` too."""
    every, low = buckets(stats), buckets(stats, L_PREFIX)
    found = {"sojourn": summary(every)}
    if low:
        found["sojourn_l"] = summary(low)
        found["sojourn_c"] = summary({i: n - low.get(i, 0) for i, n in every.items()})
    return {name: value for name, value in found.items() if value is not None}


def summary(counts_by_bucket: dict[int, int]) -> dict | None:
    """{count, median_ms, p95_ms, p99_ms} of these buckets; None if no packet was counted."""
    total = sum(counts_by_bucket.values())
    if not total:
        return None
    return {"count": total, **{f"{name}_ms": percentile_ms(counts_by_bucket, q)
                               for name, q in (("median", 0.50), ("p95", 0.95), ("p99", 0.99))}}


def percentile_ms(counts_by_bucket: dict[int, int], q: float) -> float:
    """The sojourn at quantile q (at most 1; at or below 0, the lowest bucket's) of these buckets, which hold at
    least one packet."""
    counts = sorted((i, n) for i, n in counts_by_bucket.items() if n)
    total = sum(n for _, n in counts)
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, n in counts:
        seen += n
        if seen >= rank:
            return 2 ** ((index + 0.5) / 4) / 1e3
    raise AssertionError("unreachable: rank <= total")
