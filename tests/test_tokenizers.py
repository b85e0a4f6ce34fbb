"""Real tokenizer semantics: a SentencePiece/Llama-style BPE (byte fallback, ``▁`` spaces, BOS)
and a GPT-2-style byte-level BPE (``Ġ`` spaces, no BOS), trained here in seconds with the
``tokenizers`` library and wrapped around a tiny random Llama. ``score_checkpoints`` must
equal lm-eval's ``HFLM.loglikelihood`` within 1e-4 nats on every candidate; the tokenizer
hash must compare tokenizers by content."""

import json
import random
import shutil

import pytest
import torch

from probeselect import score_checkpoints
from probeselect.checkpoints import tokenizer_hash

WORDS = ("the capital of france is paris london she said wait and then left stayed quietly what numbers "
         "next list apples pears plums figs kiwis answer question city river north south big small cold hot "
         "one two three is a an of to in on at it was for with as by").split()


def _corpus(n=3000, seed=0):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        k = rng.randrange(len(words))
        words.insert(k, str(rng.randint(0, 999)))
        s = " ".join(words)
        s = s[0].upper() + s[1:] + rng.choice([".", ",", "?", "!", ":", " -"])
        lines.append(s)  # no newlines and no accented letters: those must go through byte fallback
    return lines


def _llama_style():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    t.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"],
                                                         show_progress=False))
    model = json.loads(t.to_str())["model"]
    # SentencePiece layout: specials, then the 256 byte pieces <0x00>..<0xFF>, then the learned pieces.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in sorted(model["vocab"], key=model["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _gpt2_style():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           show_progress=False))
    return tok, dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")


ITEMS = [  # leading-space answers, multi-digit numbers, punctuation, newlines inside prompts, multi-token answers
    ("The capital of France is", " Paris", " London", [" Paris, France."]),
    ("Q: What is 17 + 25?\nA:", " 42", " 1024", [" 17"]),
    ('She said, "wait!" and then', " left.", " stayed, quietly.", [" left!"]),
    ("Numbers:\n3.14, 2.71,\nnext:", " 1.41", " 123456", [" 0"]),
    ("Cafe names:", " Crème brûlée", " Naïve café", [" Paris"]),
    ("List:\n- apples\n- pears\n-", " plums and figs", " 7 kiwis", [" pears"]),
    ("It was cold and", " hot", " big", [" small (very)"]),
]


def _wrap(tok, special, folder, seed):
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(hf), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a non-flat random model: larger logits make differences visible
        model.lm_head.weight.mul_(40)
    model.save_pretrained(folder)
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["llama_sentencepiece", "gpt2_bytelevel"])
def trained(request, tmp_path_factory):
    tok, special = _llama_style() if request.param == "llama_sentencepiece" else _gpt2_style()
    folder = _wrap(tok, special, tmp_path_factory.mktemp(request.param) / "model", seed=0)
    return request.param, folder


def test_tokenizer_conventions(trained):
    from probeselect.score import load_tokenizer

    kind, folder = trained
    tok = load_tokenizer(folder)
    ids = tok.encode("Q: What is 17?\nA: Crème")
    pieces = tok.convert_ids_to_tokens(ids)
    if kind == "llama_sentencepiece":
        assert ids[0] == tok.bos_token_id  # BOS added
        assert any(p.startswith("▁") for p in pieces) and "<0x0A>" in pieces  # ▁ spaces, newline via bytes
        assert "<0xC3>" in pieces  # è through byte fallback
    else:
        assert ids[0] != tok.bos_token_id and tok.bos_token_id not in ids  # no BOS
        assert any(p.startswith("Ġ") for p in pieces) and "Ċ" in pieces  # Ġ spaces, Ċ newline
    assert tok.decode(ids, skip_special_tokens=True) == "Q: What is 17?\nA: Crème"


def test_score_matches_lm_eval(trained, tmp_path):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from probeselect.score import load_model, load_tokenizer

    kind, folder = trained
    rows = [{"item_id": f"i{k}", "prompt": p, "task_answer": t, "shortcut_answer": s, "candidates": [t, s, *c]}
            for k, (p, t, s, c) in enumerate(ITEMS)]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spec.yaml").write_text("family: user_tok\ndata: items.jsonl\n")
    res = score_checkpoints(folder, [tmp_path / "spec.yaml"], seeds=[0], audit_items=0, progress=False)
    assert len(res.scores) == len(ITEMS)
    reqs, ours = [], []
    for _, r in res.scores.sort_values("item_id").iterrows():
        k = int(r["item_id"].rsplit("/i", 1)[1])
        p, t, s, c = ITEMS[k]
        reqs += [(p, x) for x in (t, s, *c)]
        ours += list(r["candidate_logprobs"])
    lm = HFLM(pretrained=load_model(folder, torch.float32, torch.device("cpu")), tokenizer=load_tokenizer(folder),
              batch_size=4, device="cpu")
    theirs = lm.loglikelihood([Instance(request_type="loglikelihood", doc={}, arguments=q, idx=i)
                               for i, q in enumerate(reqs)], disable_tqdm=True)
    deltas = [abs(o - t[0]) for o, t in zip(ours, theirs)]
    print(f"{kind}: max |delta| vs lm-eval over {len(deltas)} requests: {max(deltas):.2e} nats "
          f"(logprobs range {min(ours):.1f}..{max(ours):.1f})")
    assert max(deltas) < 1e-4
    assert len({round(o, 3) for o in ours}) > len(ours) // 2  # non-degenerate numbers


def test_tokenizer_hash_by_content(trained, tmp_path):
    from transformers import AutoTokenizer

    _, folder = trained
    ref = tokenizer_hash(folder)
    # Re-saved through transformers: same content.
    AutoTokenizer.from_pretrained(folder, trust_remote_code=False).save_pretrained(tmp_path / "resaved")
    assert tokenizer_hash(tmp_path / "resaved") == ref
    # Reordered keys and different whitespace: same content.
    fmt = tmp_path / "formatted"
    shutil.copytree(folder, fmt, ignore=shutil.ignore_patterns("*.safetensors"))
    data = json.loads((fmt / "tokenizer.json").read_text())
    (fmt / "tokenizer.json").write_text(json.dumps(dict(reversed(list(data.items()))), indent=3))
    assert tokenizer_hash(fmt) == ref
    # Different merges: different content.
    other = tmp_path / "other"
    shutil.copytree(folder, other, ignore=shutil.ignore_patterns("*.safetensors"))
    data = json.loads((other / "tokenizer.json").read_text())
    data["model"]["merges"] = data["model"]["merges"][:-1]
    (other / "tokenizer.json").write_text(json.dumps(data))
    assert tokenizer_hash(other) != ref
    swapped = tmp_path / "swapped"
    shutil.copytree(folder, swapped, ignore=shutil.ignore_patterns("*.safetensors"))
    data = json.loads((swapped / "tokenizer.json").read_text())
    m = data["model"]["merges"]
    m[0], m[1] = m[1], m[0]  # same merges, different priority
    (swapped / "tokenizer.json").write_text(json.dumps(data))
    assert tokenizer_hash(swapped) != ref
