"""Teaches Schemathesis what ruled's OpenAPI document cannot say in JSON
Schema: the string format `cron` (see the CronText schema's description),
and that a simulation's `to` comes after its `from` (see `map_case`).
Loaded through SCHEMATHESIS_HOOKS by tests/schemathesis.rs.

Every expression drawn here fires at least once: days of the month stay
within 1-28, so no month can lack them; ranges run forwards.
"""

import re
from datetime import datetime, timedelta, timezone

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


# `POST /simulate` takes a range, `from` to `to`, which JSON Schema cannot
# order: a positive case (one the document says is valid) is given a `to`
# after its `from`, within the bounds the operation's description states
# (at most 2,678,400 ticks of `resolution_ms`; here at most a quarter of an
# hour, which keeps the reports of the rules the run creates small), and
# `down` windows that end after they start. Negative cases are left alone.
# (The decision bound depends on those rules, not on the body: see CONFIG
# in schemathesis.rs.)

_EARLIEST = datetime(1970, 1, 1, tzinfo=timezone.utc)
_LATEST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_MAX_TICKS = 2_678_400
_MAX_SPAN_MS = 15 * 60_000
_RFC3339 = re.compile(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _millis(text):
    """An RFC 3339 text as epoch milliseconds; None for another text."""
    match = _RFC3339.match(text)
    if match is None:
        return None
    head, fraction, offset = match.groups()
    millis = (fraction or ".0")[1:4].ljust(3, "0")
    offset = "+00:00" if offset == "Z" else offset
    instant = datetime.fromisoformat(f"{head}.{millis}{offset}")
    return (instant - _EARLIEST) // timedelta(milliseconds=1)


def _text(millis):
    instant = _EARLIEST + timedelta(milliseconds=millis)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"


def _ordered(start, end, longest):
    """`start` and an end after it, at most `longest` later, both in range."""
    span = max(1, min(abs(end - start), longest))
    end = min(start + span, _LATEST_MS)
    if end <= start:
        start = end - span
    return max(start, 0), end


@schemathesis.hook.apply_to(operation_id="simulate")
def map_case(context, case):
    meta = case.meta
    body = case.body
    if meta is None or not meta.generation.mode.is_positive or not isinstance(body, dict):
        return case
    start, end = _millis(str(body.get("from"))), _millis(str(body.get("to")))
    if start is not None and end is not None:
        resolution = int(body.get("resolution_ms", 1000))
        start, end = _ordered(start, end, min(_MAX_SPAN_MS, resolution * _MAX_TICKS))
        body["from"], body["to"] = _text(start), _text(end)
    for window in body.get("down", []):
        down = _millis(str(window.get("from"))), _millis(str(window.get("to")))
        if None not in down:
            start, end = _ordered(min(down), max(down), _LATEST_MS)
            window["from"], window["to"] = _text(start), _text(end)
    return case
