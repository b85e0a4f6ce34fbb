"""Characterization of :func:`probeselect.generation.sample_generations` across its stages.

Golden values: sha256 hashes PINNED from the code before it was split into stages
(``sample_generations`` of commit 20518a0), one per case. Each hash covers every field of
every returned :class:`Generation` (text, terminated, n_new_tokens, stop, truncated_tokens),
the ``stats`` dict and, where the case has them, the progress-object calls and the warnings
raised (category, message, the file they are attributed to). The cases run float64 copies of
the tiny random models of tests/test_generation.py (seeded initialisation, float64: the same
samples on any CPU) on a BPE tokenizer trained in the test on its prompts: the fast ``shared`` engine and the general HF
``expand`` path, a prefix group split across batches, chunked decode rows (``max_rows``),
greedy decoding, ``prompt_seeds``, truncation on context overflow, a GPT-2 model (the
``expand`` fallback with its one RuntimeWarning) and every argument error. A changed hash
means the samples (or counts, warnings, progress calls, messages) changed: compare with the
old code before updating it. tests/test_generation.py checks the same paths against HF
``generate`` and against each other, independently of these pins.
"""

from __future__ import annotations

import hashlib
import json
import warnings

import pytest
import torch

import probeselect.generation as gen
from probeselect.generation import ContextOverflowError, sample_generations

FACTS = ("Ana is a baker from Oslo. She has a cat. She likes chess. Her favourite colour is red.\n"
         "Bo is a pilot from Lima. He has an owl. He likes golf.\n")
PROMPTS = [  # a prefix group of four (split across batches of 3) mixed with prompts that share nothing
    FACTS + "Q: Where do you live? A:",
    "12 + 5 =",
    FACTS + "Q: What pet do you have? A:",
    "The opposite of hot is",
    FACTS + "Q: What is your job? A:",
    FACTS + "Q: What do you like to do? A: I like",
    "Q: What is 3 + 4? A:",
]
LONG = ["The opposite of hot is cold. The opposite of up is down. The opposite of big is",
        "Bo is a pilot from Lima. He has an owl. Q: What pet does Bo have? A:", "7 + 1 ="]


@pytest.fixture(scope="module")
def models():
    """float64 copies of tiny random models (a Llama, which the shared-KV engine supports, and a
    GPT-2, which falls back to ``expand``), as in tests/test_generation.py, on a BPE tokenizer
    trained here on this file's prompts: seeded initialisation, float64 arithmetic and a fixed
    tokenizer keep the samples the same on any CPU and whatever the toy corpus becomes (no
    trained weights, no float32 near-ties; see ``random_model64`` in tests/test_generation.py)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from probeselect.toy.ladder import train_tokenizer

    tok = train_tokenizer([FACTS, *PROMPTS, *LONG] * 3, vocab_size=300)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    llama64 = LlamaForCausalLM(cfg).eval().double()
    torch.manual_seed(0)
    gcfg = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=256,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.3)
    return {"llama64": llama64, "gpt2_64": GPT2LMHeadModel(gcfg).eval().double(), "tok": tok}


class _Progress:
    def __init__(self):
        self.calls = []

    def update(self, k):
        self.calls.append(("update", k))

    def set_postfix_str(self, s):  # the rate is wall-clock: record only that it was set and its unit
        self.calls.append(("postfix", s.endswith(" samples/s")))


def _digest(gens, stats, extra=None) -> str:
    rec = {"gens": [[[g.text, g.terminated, g.n_new_tokens, g.stop, g.truncated_tokens] for g in gs] for gs in gens],
           "stats": stats, "extra": extra}
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()


CASES = {
    # name: (model, prompts, keyword arguments)
    "llama64-shared-groups": ("llama64", PROMPTS, dict(n=9, max_new_tokens=6, seed=3, batch_prompts=3)),
    "llama64-expand-groups": ("llama64", PROMPTS, dict(n=9, max_new_tokens=6, seed=3, batch_prompts=3,
                                                       engine="expand")),
    "llama64-shared-chunked": ("llama64", PROMPTS, dict(n=11, max_new_tokens=5, seed=1, batch_prompts=2,
                                                        max_rows=7, compact_fraction=0.5)),
    "llama64-expand-chunked": ("llama64", PROMPTS, dict(n=11, max_new_tokens=5, seed=1, batch_prompts=2,
                                                        max_rows=7, compact_fraction=0.5, engine="expand")),
    "llama64-prompt-seeds-no-sharing": ("llama64", PROMPTS[:5], dict(n=6, max_new_tokens=4, temperature=0.7,
                                                                     prompt_seeds=[5, -1, 7, 2**70, 0],
                                                                     min_shared_prefix=0)),
    "llama64-greedy": ("llama64", PROMPTS, dict(n=4, temperature=0.0, max_new_tokens=7, batch_prompts=4)),
    "llama64-truncate-shared": ("llama64", LONG, dict(n=5, max_new_tokens=6, max_length=20, on_overflow="truncate",
                                                    seed=2)),
    "llama64-truncate-expand-greedy": ("llama64", LONG, dict(n=1, temperature=0.0, max_new_tokens=6, max_length=20,
                                                           on_overflow="truncate", engine="expand")),
}

GOLDEN = {
    'gpt2-fallback': "b6dc6556dce7578ace4cb036ef24135ddd8af54752a4e26ac948668b7452ce14",
    'llama64-expand-chunked': "9331a1643b19170a29db3a192825cda2d0da8e871c392727a0a75f6c03ed9574",
    'llama64-expand-groups': "f61f37f2baac251475a94300f7dc63072c9e75de76037fdc96a3ecf04913a131",
    'llama64-greedy': "14d773b78c2b842fab2f295b082cd49710b35260a7f372ece8ee787c1bbdeeb9",
    'llama64-prompt-seeds-no-sharing': "ab68f373bd8fbe0f71cf69f4b9463d1514da0dcb108b72f487df5b84f800d7aa",
    'llama64-shared-chunked': "9331a1643b19170a29db3a192825cda2d0da8e871c392727a0a75f6c03ed9574",
    'llama64-shared-groups': "f61f37f2baac251475a94300f7dc63072c9e75de76037fdc96a3ecf04913a131",
    'llama64-truncate-expand-greedy': "1fffac3a8c1861c961884f92476074cb6c731e5e9a9e4d7cdac20538779d4bf6",
    'llama64-truncate-shared': "85929ad2a322afce4fccd120883e204a5406d05d1f4747449fcbe0eee3735b7d",
}


@pytest.mark.parametrize("case", list(CASES))
def test_samples_match_the_pinned_outputs(case, models):
    which, prompts, kw = CASES[case]
    stats: dict = {}
    progress = _Progress()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported model never warns
        got = sample_generations(models[which], models["tok"], prompts, stats=stats, progress=progress, **kw)
    assert len(got) == len(prompts) and all(len(g) == kw["n"] for g in got)
    if kw.get("temperature", 1.0) != 0:  # a non-trivial record: varied samples
        assert len({g.text for gs in got for g in gs}) > 5
    if "on_overflow" in kw:  # the first long prompt really is cut
        assert got[0][0].truncated_tokens > 0
    digest = _digest(got, stats, progress.calls)
    assert digest == GOLDEN.get(case), case


def test_fallback_warning_and_samples_match_the_pinned_outputs(models, monkeypatch):
    """GPT-2: the shared engine falls back to ``expand`` with one RuntimeWarning per process and model type."""
    monkeypatch.setattr(gen, "_FALLBACK_NOTED", set())
    stats: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = sample_generations(models["gpt2_64"], models["tok"], PROMPTS, n=6, max_new_tokens=4, seed=1,
                                 batch_prompts=3, stats=stats)
        again = sample_generations(models["gpt2_64"], models["tok"], PROMPTS, n=6, max_new_tokens=4, seed=1,
                                   batch_prompts=3)
    shown = [(w.category.__name__, str(w.message), w.filename.rsplit("/", 1)[-1]) for w in caught]
    assert again == got
    assert len(shown) == 1 and "falling back to engine='expand'" in shown[0][1]
    digest = _digest(got, stats, shown)
    assert digest == GOLDEN.get("gpt2-fallback"), "gpt2-fallback"


@pytest.mark.parametrize("kw, err", [
    (dict(n=0), ValueError), (dict(max_new_tokens=0), ValueError), (dict(batch_prompts=0), ValueError),
    (dict(temperature=-1.0), ValueError), (dict(temperature=float("nan")), ValueError),
    (dict(prompt_seeds=[1]), ValueError), (dict(engine="paged"), ValueError), (dict(max_rows=0), ValueError),
    (dict(min_shared_prefix=-1), ValueError), (dict(on_overflow="drop"), ValueError),
    (dict(max_length=20, max_new_tokens=6), ContextOverflowError),
    (dict(max_length=20, max_new_tokens=20, on_overflow="truncate"), ContextOverflowError),
])
def test_errors_match_the_pinned_messages(kw, err, models):
    with pytest.raises(err) as info:
        sample_generations(models["llama64"], models["tok"], LONG, **{"n": 2, **kw})
    assert type(info.value) is err
    key = json.dumps(kw, sort_keys=True, default=str)
    digest = hashlib.sha256(str(info.value).encode()).hexdigest()
    assert digest == GOLDEN_ERRORS.get(key), (key, str(info.value))


def test_edge_cases_match_the_old_code(models):
    assert sample_generations(models["llama64"], models["tok"], [], n=3) == []
    stats: dict = {}
    assert sample_generations(models["llama64"], models["tok"], [], n=3, stats=stats) == [] and stats == {}


GOLDEN_ERRORS = {
    '{"batch_prompts": 0}': "832da3d65a73892ce126ab3efbd5bb51b82d7cf5dade23d0ff031f7c8b864ad8",
    '{"engine": "paged"}': "cca9e2f48d28e02061cf55d2c91d40d530461fdccc6741061c0b94b432b265f9",
    '{"max_length": 20, "max_new_tokens": 20, "on_overflow": "truncate"}': "c1f602497de7cec9851638361dc9b9e7b94085b696d53998c6f42efa471be298",
    '{"max_length": 20, "max_new_tokens": 6}': "315e28eb59e9b88650cbaddbb73ca9023be737b980d68b5b7d8e3a79df48a4c3",
    '{"max_new_tokens": 0}': "832da3d65a73892ce126ab3efbd5bb51b82d7cf5dade23d0ff031f7c8b864ad8",
    '{"max_rows": 0}': "6cf4321db4839ea9bfa483bd1e7735f66fe863ff5f1859452c96f24f95631a2f",
    '{"min_shared_prefix": -1}': "96cad96b87e9cc0b8326ee99162002cf8e99ac97e128722126548efbf7aa79f0",
    '{"n": 0}': "832da3d65a73892ce126ab3efbd5bb51b82d7cf5dade23d0ff031f7c8b864ad8",
    '{"on_overflow": "drop"}': "2d41b75b9372c114e2301f42b4e02e59c1ead66f89626289de908907ac46e3af",
    '{"prompt_seeds": [1]}': "4fa505907d86d9039890e2d985c366987205c6c0826cbf9b3c765948c8cd1d57",
    '{"temperature": -1.0}': "1725386318330fbbd758896ebf9cdaee456abd93dc7f58b643ebda614cbc264a",
    '{"temperature": NaN}': "74f35fda98416394d3d43accea144aba6f11bb271ccc55794530b62269a742b5",
}
