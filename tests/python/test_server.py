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
