"""Any HF causal LM: span scoring, sampling, the generative audit and a LoRA pilot step on
tiny random models of each architecture found in real ladders (built offline, seconds).

Oracles: lm-eval's ``HFLM.loglikelihood`` for span scores and HF ``generate`` (greedy) for
samples. ``phi`` and ``opt`` stand for "any other AutoModelForCausalLM" (no special path)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from probeselect.probes import generate_items, spec_from_dict
from probeselect.score import load_model, load_tokenizer

_DEC = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=256)
ARCHS = {
    "llama": dict(_DEC, num_key_value_heads=2),
    "mistral": dict(_DEC, num_key_value_heads=2, sliding_window=None),
    "qwen2": dict(_DEC, num_key_value_heads=2),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=256),
    "gpt_neox": dict(_DEC),
    "olmo": dict(_DEC),
    "olmo2": dict(_DEC),
    "phi": dict(_DEC),
    "opt": dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256,
                word_embed_proj_dim=32),
}
#: the LoRA targets of ``all-linear`` (attention + MLP, never the output head)
LINEAR = {
    "llama": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"},
    "gpt2": {"c_attn", "c_proj", "c_fc"},
    "gpt_neox": {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"},
    "phi": {"q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"},
    "opt": {"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"},
}
for _a in ("mistral", "qwen2", "olmo", "olmo2"):
    LINEAR[_a] = LINEAR["llama"]


@pytest.fixture(scope="module")
def arch_models(tiny_ladder, ladder_checkpoints, tmp_path_factory):
    """``{arch: checkpoint folder}``: a random model of each architecture (seed 0) saved with
    the toy tokenizer as ``<arch>/step000001``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = load_tokenizer(ladder_checkpoints[-1])
    root = tmp_path_factory.mktemp("archs")
    out = {}
    for arch, kw in ARCHS.items():
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(arch, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                   initializer_range=0.3, **kw)
        d = root / arch / "step000001"
        AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        tok.save_pretrained(d)
        out[arch] = d
    return out


@pytest.fixture(scope="module")
def items():
    return generate_items(spec_from_dict({"family": "arith_pattern", "n_items": 3, "n_demos": 3}), [0])


def _load(path):
    return load_model(path, torch.float32, torch.device("cpu")), load_tokenizer(path)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_span_scores_match_lm_eval(arch, arch_models, items):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from probeselect.spans import encode_pair, score_pairs

    model, tok = _load(arch_models[arch])
    assert model.config.model_type == arch
    reqs = [(it.prompt, c) for it in items for c in it.candidates] + [("Ana lives in", " Oslo. She has a cat.")]
    ours = score_pairs(model, [encode_pair(tok, c, x) for c, x in reqs], batch_size=5)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=4, device="cpu")
    theirs = lm.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=r, idx=i)
                               for i, r in enumerate(reqs)], disable_tqdm=True)
    assert max(abs(o.logprob - t[0]) for o, t in zip(ours, theirs)) < 1e-4
    assert [o.is_greedy for o in ours] == [bool(t[1]) for t in theirs]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_samples_match_hf_generate_and_fallback_warns_once(arch, arch_models, items, monkeypatch):
    import probeselect.generation as gen
    from probeselect._shared_kv import SUPPORTED_MODEL_TYPES

    monkeypatch.setattr(gen, "_FALLBACK_NOTED", set(), raising=False)  # as at the start of a run
    model, tok = _load(arch_models[arch])
    prompts = [it.prompt for it in items]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = gen.greedy_generations(model, tok, prompts, max_new_tokens=6)
        gen.sample_generations(model, tok, prompts[:2], n=3, max_new_tokens=4, seed=1)
    fallbacks = [w for w in caught if "falling back to engine='expand'" in str(w.message)]
    assert len(fallbacks) == (0 if arch in SUPPORTED_MODEL_TYPES else 1), [str(w.message) for w in fallbacks]
    for p, g in zip(prompts, got):
        ids = torch.tensor([tok.encode(p)])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                             pad_token_id=tok.pad_token_id)
        ref = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert g.text == ref.split(tok.eos_token)[0].split("\n")[0]


@pytest.mark.parametrize("arch", ["olmo", "olmo2"])
def test_shared_kv_engine_samples_like_expand(arch, arch_models, items):
    """OLMo/OLMo2 use the fast shared-KV engine; it draws the same samples as ``expand``
    (float64, so no floating-point near-ties)."""
    from probeselect._shared_kv import unsupported_reason
    from probeselect.generation import sample_generations

    model, tok = _load(arch_models[arch])
    model = model.double()
    assert unsupported_reason(model, 100) is None
    prompts = [it.prompt for it in items]
    a = sample_generations(model, tok, prompts, n=6, max_new_tokens=5, seed=3, engine="shared")
    b = sample_generations(model, tok, prompts, n=6, max_new_tokens=5, seed=3, engine="expand")
    assert a == b and len({g.text for gs in a for g in gs}) > 1


@pytest.mark.parametrize("arch", list(ARCHS))
def test_score_with_audit_runs(arch, arch_models, tmp_path):
    from probeselect.score import score_checkpoints

    spec = spec_from_dict({"family": "arith_pattern", "n_items": 2, "n_demos": 3})
    res = score_checkpoints(arch_models[arch].parent, [spec], seeds=[0], out=tmp_path / "run", audit_items=2,
                            progress=False)
    assert res.manifest["status"] == "complete" and res.audit is not None and len(res.audit) == 2  # audit_items per family


@pytest.mark.parametrize("arch", list(ARCHS))
def test_lora_pilot_step_with_default_targets(arch, arch_models, tiny_ladder, tmp_path):
    from _sft_helpers import small_recipe

    from probeselect.checkpoints import discover_checkpoints
    from probeselect.sft.data import data_hash, encode_rows, load_rows
    from probeselect.sft.loop import train
    from probeselect.sft.manifest import build_data_manifest

    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 1},
                          method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0})  # target_modules: default
    (base,) = discover_checkpoints(arch_models[arch].parent)
    tok = load_tokenizer(base.path)
    ex = encode_rows(load_rows(recipe.train_path)[:16], tok, max_length=recipe.max_length)
    m = build_data_manifest(ex, recipe, seed=0, tokenizer_hash=base.tokenizer_hash,
                            data_sha256=data_hash(recipe.train_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = train(base.path, recipe, 0, tmp_path / "run", manifest=m, examples={e.id: e for e in ex},
                    pad_id=tok.pad_token_id, base_fingerprint=base.fingerprint, device="cpu", progress=False)
    assert not [w for w in caught if "fan_in_fan_out" in str(w.message)]
    assert recipe.method.target_modules == ("all-linear",)
    assert res.steps_trained == 1 and torch.isfinite(torch.tensor(res.rows[0]["loss"]))
    from probeselect.sft import loop as loop_mod

    model = loop_mod._build_model(base.path, recipe, 0, torch.device("cpu"))
    adapted = {n.split(".lora_A")[0].split(".")[-1] for n, _ in model.named_parameters() if ".lora_A" in n}
    assert adapted == LINEAR[arch]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_sft_loss_on_supervised_positions_only_matches_full_logits(arch, arch_models, tiny_ladder):
    """The SFT loss runs the output head on the supervised positions only; on every architecture
    (behind a peft LoRA wrapper, padded and packed rows) it takes that path (no fallback warning) and
    equals the full-logits cross-entropy, gradients included."""
    import torch.nn.functional as F
    from _sft_helpers import small_recipe

    from probeselect.sft import loop as loop_mod
    from probeselect.sft._nll import _FLAG, supervised_nll
    from probeselect.sft.batched import pack_rows
    from probeselect.sft.data import IGNORE, collate, encode_rows, load_rows

    recipe = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0})
    tok = load_tokenizer(arch_models[arch])
    ex = encode_rows(load_rows(recipe.train_path)[:6], tok, max_length=recipe.max_length)
    model = loop_mod._build_model(arch_models[arch], recipe, 0, torch.device("cpu"))
    model.eval()
    layouts = [collate(ex, tok.pad_token_id), pack_rows([ex[:3], ex[3:]], tok.pad_token_id, 10 ** 6)[0]]
    for batch in layouts:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
        logits = model(**inputs, use_cache=False).logits
        targets = batch["labels"][:, 1:]
        sel = targets != IGNORE
        ref = F.cross_entropy(logits[:, :-1][sel].float(), targets[sel], reduction="none")
        ref.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            nll, _ = supervised_nll(model, batch)
        assert getattr(model.get_base_model(), _FLAG) is True
        torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)
        nll.sum().backward()
        for n, p in model.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6)
        model.zero_grad(set_to_none=True)


def test_wrong_target_module_lists_the_layers_that_exist(arch_models, tiny_ladder):
    from _sft_helpers import small_recipe

    from probeselect.errors import RecipeError
    from probeselect.sft import loop as loop_mod

    recipe = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0,
                                               "target_modules": ["q_proj", "v_proj"]})
    with pytest.raises(RecipeError, match=r"\['q_proj', 'v_proj'\] match no linear layer.*gpt2.*GPT2LMHeadModel.*"
                                          r"c_attn, c_fc, c_proj.*all-linear"):
        loop_mod._build_model(arch_models["gpt2"], recipe, 0, torch.device("cpu"))
    wte = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0,
                                            "target_modules": ["wte"]})
    with pytest.raises(RecipeError, match="wte exist but are not linear layers"):
        loop_mod._build_model(arch_models["gpt2"], wte, 0, torch.device("cpu"))
