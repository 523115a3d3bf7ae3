"""The assembler's tolerances and its complete-object gate, one shape at a time."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopfence import Reply, StopReason
from loopfence._contract import parse_arguments
from loopfence._stops import StopError
from loopfence.models._stream import assemble, assemble_sse, reply_from_response


def ch(delta=None, finish=None, **extra):
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}


def tc(index=None, id=None, name=None, arguments=None, **fn_extra):
    d: dict = {"type": "function", "function": {}}
    if index is not None:
        d["index"] = index
    if id is not None:
        d["id"] = id
    if name is not None:
        d["function"]["name"] = name
    if arguments is not None or "null" in fn_extra:
        d["function"]["arguments"] = arguments
    return d


def calls(reply):
    return [(c.id, c.name, c.arguments, c.index) for c in reply.tool_calls]


def test_fragments_join_by_index_and_parallel_calls_stay_apart():
    r = assemble([ch({"tool_calls": [tc(0, "a", "read", "")]}), ch({"tool_calls": [tc(1, "b", "list", "")]}),
                  ch({"tool_calls": [tc(0, arguments='{"pa')]}), ch({"tool_calls": [tc(1, arguments="{}")]}),
                  ch({"tool_calls": [tc(0, arguments='th": "x"}')]}), ch(finish="tool_calls")])
    assert calls(r) == [("a", "read", '{"path": "x"}', 0), ("b", "list", "{}", 1)]
    assert r.complete and r.finish_reason == "tool_calls"


def test_first_index_may_be_one():
    r = assemble([ch({"tool_calls": [tc(1, "x", "read", '{"p"')]}), ch({"tool_calls": [tc(1, arguments=": 1}")]}),
                  ch(finish="tool_calls")])
    assert calls(r) == [("x", "read", '{"p": 1}', 1)]


def test_id_and_name_repeated_in_every_delta_are_not_concatenated():
    r = assemble([ch({"tool_calls": [tc(0, "call_1", "llm_version", "")]}),
                  ch({"tool_calls": [tc(0, "call_1", "llm_version", "{")]}),
                  ch({"tool_calls": [tc(0, "call_1", "llm_version", "}")]})], done=True)
    assert calls(r) == [("call_1", "llm_version", "{}", 0)]


def test_calls_keyed_by_id_when_the_index_is_missing():
    r = assemble([ch({"tool_calls": [tc(None, "A", "read", '{"a"')]}), ch({"tool_calls": [tc(None, "B", "list", "{")]}),
                  ch({"tool_calls": [tc(None, "A", arguments=": 1}")]}), ch({"tool_calls": [tc(None, "B", arguments="}")]})],
                 done=True)
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [("A", "read", '{"a": 1}'), ("B", "list", "{}")]


def test_no_id_and_no_index_continues_the_current_call():
    r = assemble([ch({"tool_calls": [tc(name="read", arguments="")]}), ch({"tool_calls": [tc(arguments='{"a":')]}),
                  ch({"tool_calls": [tc(arguments=" 2}")]}), ch(finish="tool_calls")])
    assert calls(r) == [("call_0", "read", '{"a": 2}', 0)]


def test_an_index_reused_with_a_new_id_is_a_new_call():
    r = assemble([ch({"tool_calls": [tc(0, "A", "read", "{}")]}), ch({"tool_calls": [tc(0, "B", "list", "{}")]})],
                 done=True)
    assert [(c.id, c.name) for c in r.tool_calls] == [("A", "read"), ("B", "list")]


@pytest.mark.parametrize("args", [None, "", "missing"])
def test_null_missing_or_empty_arguments_become_an_empty_object(args):
    head = tc(0, "x", "ping") if args == "missing" else tc(0, "x", "ping", args, null=True)
    r = assemble([ch({"tool_calls": [head]}), ch(finish="tool_calls")])
    assert calls(r) == [("x", "ping", "{}", 0)]


def test_arguments_sent_as_an_object_stay_an_object():
    r = assemble([ch({"tool_calls": [tc(0, "x", "read", {"path": "a"})]}), ch(finish="tool_calls")])
    assert r.tool_calls[0].arguments == {"path": "a"}
    assert json.loads(r.tool_calls[0].raw_arguments) == {"path": "a"}


def test_empty_ids_get_stable_synthesized_ids():
    chunks = [ch({"tool_calls": [tc(0, "", "a", "{}"), tc(1, "", "b", "{}")]}), ch(finish="tool_calls")]
    assert [c.id for c in assemble(chunks).tool_calls] == ["call_0", "call_1"]
    assert [c.id for c in assemble(chunks).tool_calls] == [c.id for c in assemble(list(chunks)).tool_calls]


def test_a_name_streamed_in_pieces_is_joined():
    r = assemble([ch({"tool_calls": [tc(0, "x", "read_")]}), ch({"tool_calls": [tc(0, name="file")]})], done=True)
    assert r.tool_calls[0].name == "read_file"


def test_finish_reason_missing_or_empty_needs_done():
    chunks = [ch({"content": "hi"}, finish=""), ch({"content": "!"})]
    assert assemble(chunks, done=True).complete
    r = assemble(chunks)
    assert not r.complete and "without [DONE] or a finish_reason" in r.problem
    assert r.finish_reason is None and r.content == "hi!"


def test_finish_reason_without_done_is_complete():
    assert assemble([ch({"content": "hi"}, finish="stop")]).complete


def test_usage_comes_from_the_final_chunk():
    r = assemble([ch({"content": "x"}, finish="stop"), {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}],
                 done=True)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (7, 2)


def test_an_empty_stream_is_incomplete_never_an_empty_answer():
    r = assemble_sse("")
    assert not r.complete and r.problem == "HTTP 200 with an empty event stream"
    assert r.tool_calls == () and r.content is None


def test_a_stream_cut_mid_arguments_is_incomplete():
    body = 'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"rm","arguments":"{\\"p\\""}}]}}]}\n\n'
    r = assemble_sse(body)
    assert not r.complete and r.tool_calls[0].arguments == '{"p"'


def test_a_cut_inside_a_chunk_is_incomplete_with_the_reason():
    r = assemble_sse('data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: {"choices":[{"ind')
    assert not r.complete and "not valid JSON" in r.problem and r.content == "a"


def test_error_event_raises_a_named_stop_not_a_call():
    body = ('data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"rm",'
            '"arguments":"{}"}}]}}]}\n\nevent: error\ndata: {"error": {"message": "overloaded", "code": 503}}\n\n')
    with pytest.raises(StopError) as e:
        assemble_sse(body)
    assert e.value.stop.reason is StopReason.ENDPOINT_ERROR and "overloaded" in e.value.stop.detail


def test_error_inside_a_data_chunk_raises_even_with_done_after():
    body = 'data: {"choices":[],"error":{"code":400,"message":"Token limit reached"}}\n\ndata: [DONE]\n\n'
    with pytest.raises(StopError) as e:
        assemble_sse(body)
    assert e.value.stop.reason is StopReason.ENDPOINT_ERROR


def test_streamed_context_overflow_is_named():
    body = ('event: error\ndata: {"error": {"type": "exceed_context_size_error", "n_prompt_tokens": 900, '
            '"n_ctx": 512, "message": "request (900 tokens) exceeds the available context size (512 tokens)"}}\n\n')
    with pytest.raises(StopError) as e:
        assemble_sse(body)
    assert e.value.stop.reason is StopReason.CONTEXT_OVERFLOW
    assert (e.value.stop.data["value"], e.value.stop.data["limit"]) == (900, 512)


def test_done_without_any_choice_is_empty_choices():
    with pytest.raises(StopError) as e:
        assemble_sse('data: {"choices": []}\n\ndata: [DONE]\n\n')
    assert e.value.stop.reason is StopReason.ENDPOINT_ERROR and "empty choices" in e.value.stop.detail


def test_legacy_function_call_delta():
    r = assemble([ch({"function_call": {"name": "read", "arguments": '{"a"'}}), ch({"function_call": {"arguments": ":1}"}}),
                  ch(finish="function_call")])
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("read", '{"a":1}')]


def test_raw_is_a_response_object_that_round_trips():
    r = assemble([ch({"content": "hi", "tool_calls": [tc(0, "", "read", '{"a": 1}')]}), ch(finish="tool_calls")], done=True)
    again = reply_from_response(r.raw)
    assert calls(again) == calls(r) and again.content == "hi"


def test_response_object_tolerances():
    obj = {"choices": [{"finish_reason": "", "message": {"content": "", "function_call": {"name": "", "arguments": ""},
           "tool_calls": None}}]}
    r = reply_from_response(obj)
    assert r.tool_calls == () and r.complete  # an empty legacy function_call is no call
    same_name = {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"id": "", "function": {"name": "read", "arguments": '{"p": 1}'}},
        {"id": "", "function": {"name": "read", "arguments": '{"p": 2}'}}]}}]}
    assert calls(reply_from_response(same_name)) == [("call_0", "read", '{"p": 1}', 0), ("call_1", "read", '{"p": 2}', 1)]


@pytest.mark.parametrize("obj", [{"choices": []}, {"id": "x"}, {"choices": [{"index": 0}]}, [1]])
def test_response_objects_without_a_message_are_endpoint_errors(obj):
    with pytest.raises(StopError) as e:
        reply_from_response(obj)
    assert e.value.stop.reason is StopReason.ENDPOINT_ERROR


# -- what the log keeps rebuilds what the run acted on ---------------------------------------------
_IDS = st.one_of(st.none(), st.just(""), st.sampled_from(["call_0", "call_1", "x"]), st.integers(0, 2))
_NAMES = st.one_of(st.none(), st.just(""), st.sampled_from(["read", "write"]), st.integers(0, 9))
_ARGS = st.one_of(st.none(), st.just(""), st.sampled_from(['{"p": 1}', '{"p"', "[1]"]),
                  st.dictionaries(st.sampled_from("ab"), st.integers(), max_size=2),
                  st.sampled_from([False, True, 0, 1.5, [], ["a"]]))
_CALL = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "id": _IDS, "type": st.just("function"),
    "function": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"name": _NAMES, "arguments": _ARGS}))}))
_CONTENT = st.one_of(st.none(), st.text(max_size=4),
                     st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=3)}), max_size=2))
_MESSAGE = st.fixed_dictionaries({"role": st.just("assistant")}, optional={
    "content": _CONTENT, "tool_calls": st.one_of(st.none(), st.lists(_CALL, max_size=4)),
    "reasoning_content": st.text(max_size=3)})


def _acted_on(reply: Reply) -> tuple:
    """What the ring acts on: the text, and each call's id, name and what the contract makes of its
    arguments."""
    return reply.content, [(c.id, c.name, c.index, parse_arguments(c.arguments)) for c in reply.tool_calls]


@given(message=_MESSAGE, finish=st.sampled_from([None, "stop", "tool_calls"]), streamed=st.booleans())
def test_the_logged_raw_rebuilds_the_reply_the_run_acted_on(message, finish, streamed):
    """Live, a reply is read leniently (`reply_from_response`, `assemble`); replay and reconcile
    rebuild it from the log's `raw` with the strict `Reply.from_response`. Both readings agree, and
    an id made up for a call never repeats another call's."""
    choice = {"index": 0, "finish_reason": finish, ("delta" if streamed else "message"): message}
    obj = {"id": "r", "model": "m", "choices": [choice]}
    live = assemble([obj], done=True) if streamed else reply_from_response(obj)
    again = Reply.from_response(json.loads(json.dumps(live.raw)))  # as the log writes and reads it
    assert _acted_on(again) == _acted_on(live)
    given_ids = [c.get("id") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    if len({str(i) for i in given_ids if i not in (None, "")}) == len([i for i in given_ids if i not in (None, "")]):
        assert len({c.id for c in live.tool_calls}) == len(live.tool_calls)


def test_a_made_up_id_never_repeats_a_real_one():
    obj = {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"id": "call_1", "function": {"name": "a", "arguments": "{}"}},
        {"id": "", "function": {"name": "b", "arguments": "{}"}}]}}]}
    assert [c.id for c in reply_from_response(obj).tool_calls] == ["call_1", "call_1_1"]
    assert [c.id for c in Reply.from_response(obj).tool_calls] == ["call_1", "call_1_1"]


def test_numbers_as_ids_and_names_are_read_as_text():
    r = assemble([ch({"tool_calls": [{"index": 0, "id": 7, "function": {"name": 5, "arguments": "{}"}}]}),
                  ch(finish="tool_calls")])
    assert calls(r) == [("7", "5", "{}", 0)]


@pytest.mark.parametrize("args", [False, 0, [], "[1]"])
def test_arguments_that_are_not_an_object_are_kept_for_the_contract_to_refuse(args):
    obj = {"choices": [{"finish_reason": "tool_calls", "message": {
        "tool_calls": [{"id": "c", "function": {"name": "ping", "arguments": args}}]}}]}
    reason = parse_arguments(reply_from_response(obj).tool_calls[0].arguments)[1]
    assert reason is StopReason.SCHEMA_MISMATCH  # never read as "no arguments" and run


@pytest.mark.parametrize(("chunk", "words"), [
    ({"choices": {"0": {}}}, "choices must be a list, got dict"),
    ({"choices": ["x"]}, "choice must be an object, got str"),
    ({"choices": [{"index": 0, "delta": "hi"}]}, "delta must be an object, got str"),
    (ch({"tool_calls": {"id": "c"}}), "tool_calls must be a list, got dict"),
    (ch({"tool_calls": [7]}), "tool_calls item must be an object, got int"),
    (ch({"tool_calls": [{"index": 0, "function": "read"}]}), "function must be an object, got str"),
    (ch({"function_call": "read"}), "function_call must be an object, got str")])
def test_a_malformed_part_of_a_reply_is_a_named_stop_that_says_which(chunk, words):
    with pytest.raises(StopError) as e:
        assemble([chunk], done=True)
    assert e.value.stop.reason is StopReason.ENDPOINT_ERROR and words in e.value.stop.detail


@pytest.mark.parametrize(("message", "words"), [
    ({"content": 42}, "content must be a string or null, got int"),
    ({"content": None, "tool_calls": {"id": "c"}}, "tool_calls must be a list, got dict"),
    ({"content": None, "tool_calls": [None, 7]}, "tool_calls item must be an object, got int")])
def test_a_malformed_response_object_is_a_named_stop_that_says_which(message, words):
    with pytest.raises(StopError) as e:
        reply_from_response({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
    assert e.value.stop.reason is StopReason.ENDPOINT_ERROR and words in e.value.stop.detail
