"""kcap serve against the official openai client: a real server process on 127.0.0.1 serving
SmolLM2-135M-Instruct, each answer compared with the same request run in this process."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from conftest import MODEL_PATHS

MODEL_NAME = "smol"
STARTUP_SECONDS = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "kcap", "serve", MODEL_PATHS["smollm2_135m"](), "--host", "127.0.0.1",
         "--port", str(port), "--model-name", MODEL_NAME, "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        assert process.poll() is None, f"kcap serve exited: {process.stdout.read()}"
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "kcap serve did not start"
        time.sleep(0.2)
    yield base
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=120, max_retries=0)


def test_health_and_models(server, client):
    health = httpx.get(f"{server}/health", timeout=5).json()
    assert health["status"] == "ok" and health["model"] == MODEL_NAME
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]


def test_chat_matches_model_chat(client, smollm):
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0, max_tokens=48)
    expected = smollm.chat(messages, temperature=0, max_tokens=48)
    stats = smollm.last_stats
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected and expected.strip()
    assert "<|im_end|>" not in choice.message.content
    assert choice.finish_reason == ("stop" if stats.finish_reason == "stop" else "length")
    assert reply.usage.prompt_tokens == stats.prompt_tokens
    assert reply.usage.completion_tokens == stats.generated_tokens
    assert reply.usage.total_tokens == stats.prompt_tokens + stats.generated_tokens


def test_completion_stops_at_max_tokens(client, smollm):
    prompt = "The three primary colors are"
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0)
    assert reply.choices[0].text == smollm.generate(prompt, max_tokens=6)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 6
    assert reply.usage.prompt_tokens == len(smollm.tokenize(prompt))


def test_stop_string(client, smollm):
    prompt = "Count: 1, 2, 3, 4,"
    full = smollm.generate(prompt, max_tokens=24)
    assert " 7" in full, full
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=24, temperature=0, stop=[" 7"])
    assert reply.choices[0].text == full[: full.index(" 7")]
    assert reply.choices[0].finish_reason == "stop"


def test_streaming_chat_equals_the_whole_answer(client):
    messages = [{"role": "user", "content": "Name two fruits."}]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0, max_tokens=40)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0, max_tokens=40,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streaming_completion(client, smollm):
    prompt = "def fibonacci(n):"
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True)]
    assert "".join(pieces) == smollm.generate(prompt, max_tokens=12)


def test_seeded_sampling_repeats(client):
    kwargs = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=12, temperature=1.0, top_p=0.95)
    a = client.completions.create(seed=5, **kwargs).choices[0].text
    b = client.completions.create(seed=5, **kwargs).choices[0].text
    assert a == b
    assert len({client.completions.create(seed=s, **kwargs).choices[0].text for s in range(1, 5)}) > 1


def test_concurrent_clients_each_get_their_answer(client, smollm):
    questions = ["What is 2 + 2?", "Name a color.", "What is the capital of Italy?", "Say hello in French."]
    expected = [smollm.chat([{"role": "user", "content": q}], temperature=0, max_tokens=24) for q in questions]
    results = [None] * len(questions)
    start = threading.Barrier(len(questions))

    def ask(i):
        start.wait()
        reply = client.chat.completions.create(model=MODEL_NAME, temperature=0, max_tokens=24,
                                               messages=[{"role": "user", "content": questions[i]}],
                                               stream=i % 2 == 1)
        if i % 2 == 1:
            results[i] = "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        else:
            results[i] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert results == expected


def test_bad_requests_get_openai_errors(server, client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "invalid_request_error" and "temperature" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=[])
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"
    broken = httpx.post(f"{server}/v1/completions", content=b"{not json", timeout=10,
                        headers={"content-type": "application/json"})
    assert broken.status_code == 400 and set(broken.json()["error"]) == {"message", "type", "param", "code"}
    missing = httpx.get(f"{server}/v1/nothing", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    long_prompt = "word " * 9000
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt=long_prompt, max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded"


def test_disconnect_stops_the_generation(server):
    def active():
        return httpx.get(f"{server}/health", timeout=5).json()["active_generations"]

    body = {"model": MODEL_NAME, "prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server}/v1/completions", json=body) as response:
            assert response.status_code == 200
            events = 0
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payload = json.loads(line[6:])
                    assert "error" not in payload, payload
                    events += 1
                if events == 5:
                    # Asked while the stream is open (leaving iter_lines closes it): 4000 tokens
                    # take far longer than this test waits.
                    assert active() == 1
                    break
    deadline = time.monotonic() + 5
    while active() != 0:
        assert time.monotonic() < deadline, "the generation kept running after its client left"
        time.sleep(0.1)


def test_a_non_streaming_client_that_leaves_stops_its_generation(server):
    def active():
        return httpx.get(f"{server}/health", timeout=5).json()["active_generations"]

    body = {"model": MODEL_NAME, "prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server}/v1/completions", json=body, timeout=2)  # tokens keep coming meanwhile
    deadline = time.monotonic() + 5
    while active() != 0:
        assert time.monotonic() < deadline, "the generation kept running after its client left"
        time.sleep(0.1)


def test_null_options_take_their_defaults_and_llama_cpp_names_are_read(server, client):
    chat = f"{server}/v1/chat/completions"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    plain = httpx.post(chat, json={"messages": messages, "max_tokens": 8, "temperature": 0}, timeout=60).json()
    nulls = httpx.post(chat, json={"messages": messages, "max_tokens": 8, "temperature": 0, "top_p": None,
                                   "top_k": None, "n": None, "stream": None, "presence_penalty": None,
                                   "frequency_penalty": None, "seed": None}, timeout=60)
    assert nulls.status_code == 200, nulls.text
    assert nulls.json()["choices"][0]["message"] == plain["choices"][0]["message"]
    # top_p 0 keeps only the most likely token, whatever the temperature; seed -1 is a random seed.
    greedy = httpx.post(chat, json={"messages": messages, "max_tokens": 8, "temperature": 1.5, "top_p": 0,
                                    "seed": -1}, timeout=60).json()
    assert greedy["choices"][0]["message"] == plain["choices"][0]["message"]
    penalty = {"messages": messages, "max_tokens": 8, "temperature": 0}
    assert httpx.post(chat, json={**penalty, "repeat_penalty": 1.3}, timeout=60).json()["choices"] == \
        httpx.post(chat, json={**penalty, "repetition_penalty": 1.3}, timeout=60).json()["choices"]


@pytest.mark.parametrize("field, value", [
    ("tools", [{"type": "function", "function": {"name": "weather", "parameters": {}}}]),
    ("tool_choice", "required"),
    ("response_format", {"type": "json_object"}),
    ("grammar", "root ::= \"yes\""),
])
def test_what_kcap_does_not_implement_is_refused_by_name(server, field, value):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, field: value}
    reply = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported_parameter" and field in error["message"]
    # Their neutral values are accepted.
    neutral = {"tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "grammar": ""}[field]
    assert httpx.post(f"{server}/v1/chat/completions", json={**body, field: neutral}, timeout=60).status_code == 200


def test_logit_bias_and_penalties_are_the_models(server, client, smollm):
    prompt = "Count: 1, 1, 1, 1,"
    plain = smollm.generate(prompt, max_tokens=8)
    first = smollm.tokenize(prompt + plain, add_special_tokens=True)[len(smollm.tokenize(prompt, add_special_tokens=True))]
    cases = [dict(logit_bias={str(first): -100}), dict(frequency_penalty=1.5), dict(presence_penalty=1.2),
             dict(frequency_penalty=0.5, presence_penalty=-0.5, logit_bias={str(first): 3.0})]
    for options in cases:
        reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                                          **{k: v for k, v in options.items() if k != "logit_bias"},
                                          extra_body={"logit_bias": options["logit_bias"]} if "logit_bias" in options
                                          else None)
        expected = smollm.generate(prompt, max_tokens=8, **{
            k: ({int(t): b for t, b in v.items()} if k == "logit_bias" else v) for k, v in options.items()})
        assert reply.choices[0].text == expected, options
    assert smollm.generate(prompt, max_tokens=8, logit_bias={first: -100}) != plain
    assert smollm.generate(prompt, max_tokens=8, frequency_penalty=1.5) != plain
    for bias, message in (({"999999": 1}, "outside the vocabulary"), ({"5": 200}, "must be in"),
                          ({"x": 1}, "not a token id")):
        reply = httpx.post(f"{server}/v1/completions", json={"prompt": prompt, "max_tokens": 2, "logit_bias": bias},
                           timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "logit_bias", reply.text
        assert message in reply.json()["error"]["message"]


def log_softmax(logits):
    scores = np.asarray(logits, dtype=np.float64)
    return scores - scores.max() - np.log(np.exp(scores - scores.max()).sum())


def test_logprobs_are_the_models(server, client, smollm):
    prompt = "The three primary colors are"
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=3)
    choice = reply.choices[0]
    assert "".join(choice.logprobs.tokens) == choice.text and len(choice.logprobs.tokens) == 6
    # Each token's log probability is the log-softmax of the model's logits after the tokens before it.
    ids = smollm.tokenize(prompt, add_special_tokens=True)
    for step, token_text in enumerate(choice.logprobs.tokens):
        smollm.reset()
        expected = log_softmax(smollm.eval(ids))
        token = int(np.argmax(expected))
        assert choice.logprobs.token_logprobs[step] == pytest.approx(expected[token], abs=1e-4)
        top = choice.logprobs.top_logprobs[step]
        assert len(top) == 3 and next(iter(top)) == token_text and max(top.values()) == pytest.approx(expected[token], abs=1e-4)
        assert choice.logprobs.text_offset[step] == len("".join(choice.logprobs.tokens[:step]))
        ids.append(token)
    smollm.reset()

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert b"".join(bytes(item.bytes) for item in content) == chat.choices[0].message.content.encode()
    assert all(len(item.top_logprobs) == 2 and item.top_logprobs[0].token == item.token for item in content)
    assert all(item.logprob <= 0 and item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob for item in content)
    # Streamed: the same entries, spread over the chunks that carry their text.
    streamed = [entry for event in client.chat.completions.create(
                    model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2,
                    stream=True)
                if event.choices and event.choices[0].logprobs for entry in event.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == chat.choices[0].message.content

    # A stop string cuts the tokens after it off.
    full = client.completions.create(model=MODEL_NAME, prompt="Count: 1, 2, 3, 4,", max_tokens=24, temperature=0,
                                     logprobs=0)
    cut = client.completions.create(model=MODEL_NAME, prompt="Count: 1, 2, 3, 4,", max_tokens=24, temperature=0,
                                    logprobs=0, stop=[" 7"])
    assert len(cut.choices[0].logprobs.tokens) < len(full.choices[0].logprobs.tokens)
    assert "".join(cut.choices[0].logprobs.tokens).startswith(cut.choices[0].text)
    assert cut.choices[0].logprobs.top_logprobs[0] == {}
    reply = httpx.post(f"{server}/v1/chat/completions", json={"messages": messages, "top_logprobs": 2}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "top_logprobs"


def test_echo_gives_the_prompts_logprobs(server, client, smollm):
    # What evaluation harnesses send for a log-likelihood: the prompt echoed with each token's
    # log probability after the tokens before it (the first: null), no new token.
    prompt = "The capital of France is Paris"
    reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                      temperature=0)
    choice = reply.choices[0]
    ids = smollm.tokenize(prompt, add_special_tokens=True)
    assert choice.text == prompt and reply.usage.completion_tokens == 0
    assert "".join(choice.logprobs.tokens) == prompt and len(choice.logprobs.tokens) == len(ids)
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    smollm.reset()
    expected = np.array([log_softmax(row)[token] for row, token in zip(smollm.eval(ids, all_logits=True), ids[1:])])
    smollm.reset()
    np.testing.assert_allclose(choice.logprobs.token_logprobs[1:], expected, atol=1e-4)
    assert all(len(top) == 1 for top in choice.logprobs.top_logprobs[1:])
    # With new tokens: the prompt's entries, then the answer's, offsets running through both.
    more = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=3, echo=True, logprobs=0,
                                     temperature=0)
    answer = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=3, temperature=0)
    assert more.choices[0].text == prompt + answer.choices[0].text
    assert "".join(more.choices[0].logprobs.tokens) == more.choices[0].text
    assert more.choices[0].logprobs.text_offset[-1] == len(more.choices[0].text) - len(more.choices[0].logprobs.tokens[-1])
    for body, param in (({"prompt": prompt, "echo": True, "stream": True}, "echo"), ({"prompt": prompt, "max_tokens": 0}, "max_tokens")):
        reply = httpx.post(f"{server}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_model_route_bad_ids_and_cors(server, client):
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    reply = httpx.post(f"{server}/v1/completions", json={"prompt": [True, 5], "max_tokens": 2}, timeout=60)
    assert reply.status_code == 400  # a bool is not a token id
    reply = httpx.post(f"{server}/v1/completions", json={"prompt": "x", "max_tokens": 2,
                                                         "stream_options": {"include_usage": True}}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "stream_options"
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    local = httpx.options(f"{server}/v1/chat/completions", headers={"Origin": "http://localhost:5173", **preflight})
    assert local.status_code == 200 and local.headers["access-control-allow-origin"] == "http://localhost:5173"
    other = httpx.options(f"{server}/v1/chat/completions", headers={"Origin": "https://example.com", **preflight})
    assert "access-control-allow-origin" not in other.headers


def test_chat_template_kwargs_and_reasoning_effort_are_template_variables(server):
    chat = f"{server}/v1/chat/completions"
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 6,
            "temperature": 0}
    plain = httpx.post(chat, json=body, timeout=60).json()["choices"]
    # SmolLM2's template reads neither variable: the same answer, not a refusal.
    both = httpx.post(chat, json={**body, "chat_template_kwargs": {"enable_thinking": False},
                                  "reasoning_effort": "high"}, timeout=60)
    assert both.status_code == 200 and both.json()["choices"] == plain
    reserved = httpx.post(chat, json={**body, "chat_template_kwargs": {"add_generation_prompt": False}}, timeout=60)
    assert reserved.status_code == 400 and "set by kcap itself" in reserved.json()["error"]["message"]
