"""The SSE layer: lines from raw bytes, events from lines (data, multi-line data, comments, error)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loopfence.models._sse import SSEEvent, iter_events, iter_lines, parse_events


def test_data_events_comments_and_done():
    body = ": OPENROUTER PROCESSING\n\ndata: {\"a\": 1}\n\n: keep-alive\ndata: [DONE]\n\n"
    assert parse_events(body) == [SSEEvent('{"a": 1}'), SSEEvent("[DONE]")]


def test_multi_line_data_joins_with_newlines_and_fields_are_read():
    body = "event: error\nid: 7\ndata: {\"error\":\ndata:  {\"message\": \"x\"}}\nretry: 100\n\n"
    (ev,) = parse_events(body)
    assert ev.event == "error" and ev.id == "7"
    assert ev.data == '{"error":\n {"message": "x"}}'  # only the first space after the colon goes


def test_crlf_cr_and_lf_line_endings():
    for eol in ("\n", "\r\n", "\r"):
        body = f"data: one{eol}{eol}data: two{eol}{eol}"
        assert [e.data for e in parse_events(body)] == ["one", "two"], repr(eol)


def test_leading_space_before_a_field_is_tolerated():
    assert [e.data for e in parse_events(' data: {"x": 1}\n\n')] == ['{"x": 1}']


def test_pending_event_at_end_of_input_is_dispatched():
    assert [e.data for e in parse_events("data: a\n\ndata: b")] == ["a", "b"]


def test_blank_lines_and_empty_events_yield_nothing():
    assert parse_events("\n\n\n: only a comment\n\n") == []


def test_unicode_line_separators_inside_json_do_not_split_a_line():
    body = 'data: {"content": "a\u2028b\x85c"}\n\n'
    assert [e.data for e in iter_events(iter_lines([body.encode()]))] == ['{"content": "a\u2028b\x85c"}']


@given(st.lists(st.integers(0, 400), max_size=30))
def test_iter_lines_is_independent_of_read_boundaries(cuts):
    raw = ("data: {\"t\": \"héllo → wörld\"}\r\n\r\ndata: x\rdata: y\n\n: c\n" * 3).encode()
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    assert list(iter_lines(pieces)) == list(iter_lines([raw]))
    assert [e.data for e in iter_events(iter_lines(pieces))] == [e.data for e in parse_events(raw.decode())]
