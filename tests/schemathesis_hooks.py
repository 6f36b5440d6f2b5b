"""Teaches Schemathesis the one string format of ruled's OpenAPI document
that JSON Schema has no word for: `cron` (see the CronText schema's
description). Loaded through SCHEMATHESIS_HOOKS by tests/schemathesis.rs.

Every expression drawn here fires at least once: days of the month stay
within 1-28, so no month can lack them; ranges run forwards.
"""

import schemathesis
from hypothesis import strategies as st


def _field(low, high):
    number = st.integers(low, high).map(str)
    ranged = st.tuples(st.integers(low, high), st.integers(low, high)).map(
        lambda pair: f"{min(pair)}-{max(pair)}"
    )
    stepped = st.integers(1, high - low + 1).map(lambda step: f"*/{step}")
    item = st.one_of(st.just("*"), number, ranged, stepped)
    return st.lists(item, min_size=1, max_size=3).map(",".join)


_FIVE_FIELDS = st.tuples(
    _field(0, 59), _field(0, 23), _field(1, 28), _field(1, 12), _field(0, 6)
).map(" ".join)

_ALIASES = st.sampled_from(
    ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]
)

schemathesis.openapi.format("cron", st.one_of(_FIVE_FIELDS, _ALIASES))
