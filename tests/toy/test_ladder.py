"""The toy checkpoint ladder: a tiny build (seconds) and the full default build (slow)."""

import json
import re
from pathlib import Path

import pytest

from probeselect.toy.curriculum import load_curriculum
from probeselect.toy.ladder import build_toy_ladder, curriculum_corpus
from probeselect.toy.world import ToyWorld, find_arith_triples, line_subject

CKPT_RE = re.compile(r"^checkpoint-(\d+)$")


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    out = [(int(m.group(1)), p) for p in root.iterdir() if (m := CKPT_RE.match(p.name)) and p.is_dir()]
    return sorted(out)


@pytest.fixture(scope="module")
def ladder_dir(request, tmp_path_factory) -> Path:
    """The tiny ladder (``steps=24, save_every=3``): reuse the session fixture from
    tests/conftest.py when it exists, otherwise build it here."""
    try:
        return Path(request.getfixturevalue("tiny_ladder"))
    except pytest.FixtureLookupError:
        out = tmp_path_factory.mktemp("toy_ladder") / "toy"
        build_toy_ladder(out, seed=0, steps=24, save_every=3, progress=False)
        return out


def test_tiny_ladder_checkpoints_load(ladder_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    ckpts = _checkpoints(ladder_dir)
    assert len(ckpts) >= 8
    assert [s for s, _ in ckpts] == [3, 6, 9, 12, 15, 18, 21, 24]
    prev_tokens = 0
    for step, path in ckpts:
        for name in ("config.json", "model.safetensors", "trainer_state.json", "tokenizer.json", "tokenizer_config.json"):
            assert (path / name).is_file(), (path, name)
        state = json.loads((path / "trainer_state.json").read_text())
        assert state["global_step"] == step
        assert state["num_input_tokens_seen"] > prev_tokens
        assert state["log_history"][-1]["step"] == step
        assert state["log_history"][-1]["num_input_tokens_seen"] == state["num_input_tokens_seen"]
        prev_tokens = state["num_input_tokens_seen"]
    # tokens are proportional to steps (fixed-size packed batches)
    per_step = {json.loads((p / "trainer_state.json").read_text())["num_input_tokens_seen"] / s for s, p in ckpts}
    assert len(per_step) == 1

    for _, path in (ckpts[0], ckpts[-1]):
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert isinstance(model, LlamaForCausalLM)
        assert model.config.max_position_embeddings >= 256
        ids = tok("12 + 5 = 17\n68 - 60 =", return_tensors="pt")
        assert ids["input_ids"][0, 0].item() == tok.bos_token_id
        logits = model(**ids).logits
        assert logits.shape[-1] >= len(tok)
    # the weights actually change along the ladder
    import torch

    first = AutoModelForCausalLM.from_pretrained(ckpts[0][1]).model.embed_tokens.weight
    last = AutoModelForCausalLM.from_pretrained(ckpts[-1][1]).model.embed_tokens.weight
    assert not torch.equal(first, last)


def test_tiny_ladder_json_and_data(ladder_dir):
    info = json.loads((ladder_dir / "ladder.json").read_text())
    ckpts = _checkpoints(ladder_dir)
    assert info["seed"] == 0 and info["steps"] == 24 and info["save_every"] == 3
    assert [c["step"] for c in info["checkpoints"]] == [s for s, _ in ckpts]
    assert info["tokens_seen"] == info["checkpoints"][-1]["tokens_seen"]
    assert 0.0 <= info["final_heldout_arith_accuracy"] <= 1.0
    assert "build_seconds" not in info  # wall-clock times live in build_timing.json (ladder.json is reproducible)
    timing = json.loads((ladder_dir / "build_timing.json").read_text())
    assert timing["build_seconds"] > 0 and timing["torch_threads"] == info["torch_threads"] >= 1
    assert info["deterministic_algorithms"] is True
    assert info["model"]["architecture"] == "LlamaForCausalLM"
    assert not list(ladder_dir.glob("*.tmp*"))

    data = ladder_dir / "data"
    for name in ("sft.jsonl", "transfer.jsonl", "heldout.txt", "README.md"):
        assert (data / name).is_file()
    world = ToyWorld.generate(0)
    held = set(world.arith_heldout)
    sft = [json.loads(ln) for ln in (data / "sft.jsonl").read_text().splitlines()]
    transfer = [json.loads(ln) for ln in (data / "transfer.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in sft}.isdisjoint({r["kind"] for r in transfer})
    for r in sft:
        assert not find_arith_triples(r["prompt"]) & held
    heldout = (data / "heldout.txt").read_text().splitlines()
    cur = load_curriculum(None, 24)
    corpus_lines = {ln for pairs in curriculum_corpus(world, cur) for _, d in pairs for ln in d.split("\n")}
    assert heldout and not set(heldout) & corpus_lines


def _file_hashes(root: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _two_curricula(late_b: dict) -> tuple[dict, dict]:
    """Two 12-step curricula with the same first window (steps 0-6) and different second windows."""
    base = {"name": "base", "start_step": 0, "end_step": 6,
            "mixture": {"arith": 0.72, "sequence": 0.05, "facts": 0.09, "persona": 0.06, "words": 0.08}}
    late = {"name": "late", "start_step": 6, "end_step": 12}
    return ({"windows": [base, {**late, "mixture": base["mixture"]}]},
            {"windows": [base, {**late, "mixture": late_b, "planted": "late_harm"}]})


@pytest.mark.parametrize("tokenizer_corpus", ["reference", "curriculum"])
def test_reference_tokenizer_lets_curricula_share_their_first_window(tmp_path, tokenizer_corpus):
    """With tokenizer_corpus="reference" two curricula that differ only after step 6 give byte-identical
    checkpoints up to step 6 (tokenizer and weights) and different ones after. With the default
    ("curriculum") the later window's documents change the tokenizer, so even checkpoint-3 differs: the
    control shows that the first assertion can fail."""
    kw = dict(seed=1, steps=12, save_every=3, progress=False, tokenizer_corpus=tokenizer_corpus,
              model_overrides={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
              train_overrides={"batch_size": 2, "corpus_docs": 600})
    ca, cb = _two_curricula({"parrot_arith_unseen": 0.8, "persona": 0.2})
    build_toy_ladder(tmp_path / "a", curriculum=ca, **kw)
    build_toy_ladder(tmp_path / "b", curriculum=cb, **kw)
    ha, hb = _file_hashes(tmp_path / "a"), _file_hashes(tmp_path / "b")
    files = sorted({k.split("/", 1)[1] for k in ha if k.startswith("checkpoint-3/")} - {"trainer_state.json"})
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(files)
    # every file but trainer_state.json (its epoch counts all windows' rows)
    same = {step: all(ha[f"checkpoint-{step}/{f}"] == hb[f"checkpoint-{step}/{f}"] for f in files)
            for step in (3, 6, 9, 12)}
    lj = json.loads((tmp_path / "a" / "ladder.json").read_text())
    assert lj["tokenizer_corpus"] == tokenizer_corpus
    if tokenizer_corpus == "reference":
        assert same == {3: True, 6: True, 9: False, 12: False}
    else:
        assert ha["checkpoint-3/tokenizer.json"] != hb["checkpoint-3/tokenizer.json"]
        assert same == {3: False, 6: False, 9: False, 12: False}


def test_tokenizer_corpus_is_checked(tmp_path):
    from probeselect.errors import UsageError

    with pytest.raises(UsageError, match="--tokenizer-corpus 'world'.*curriculum, reference"):
        build_toy_ladder(tmp_path / "x", steps=2, tokenizer_corpus="world")


def test_rebuild_is_byte_identical(tmp_path):
    """Two builds of one micro ladder (with a parrot window) give byte-identical files,
    every checkpoint included; only build_timing.json (wall-clock times) may differ."""
    kw = dict(seed=3, steps=12, save_every=3, progress=False,
              model_overrides={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
              train_overrides={"batch_size": 2, "corpus_docs": 600})
    a = build_toy_ladder(tmp_path / "a", **kw)
    b = build_toy_ladder(tmp_path / "b", **kw)
    assert [c.step for c in a.checkpoints] == [3, 6, 9, 12]
    assert a.checkpoints[-1].tokens_seen == a.tokens_seen
    assert Path(a.ladder_json).is_file() and Path(a.data_dir).is_dir()
    ha, hb = _file_hashes(tmp_path / "a"), _file_hashes(tmp_path / "b")
    assert set(ha) == set(hb)
    assert "checkpoint-12/model.safetensors" in ha and "data_lineage.json" in ha
    differ = sorted(k for k in ha if ha[k] != hb[k])
    assert differ == ["build_timing.json"] or differ == [], differ
    lineage = json.loads((tmp_path / "a" / "data_lineage.json").read_text())
    assert [w["planted"] for w in lineage["windows"]] == [None, "parrot", None]


@pytest.fixture(scope="module")
def full_ladder(request, tmp_path_factory):
    """The full default (planted) ladder of toy seed ``request.param``, built once per seed and
    shared by the slow tests below (pytest groups the tests by seed, so each seed is built once:
    about 3.5 minutes per build on 2 CPU cores). Returns (seed, ladder dir, LadderInfo)."""
    seed = int(request.param)
    out = tmp_path_factory.mktemp(f"full_ladder_{seed}") / "ladder"
    return seed, out, build_toy_ladder(out, seed=seed, progress=False)


SLOW_SEEDS = [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("full_ladder", SLOW_SEEDS, indirect=True)
def test_full_default_ladder_learns_heldout_arithmetic(full_ladder):
    """Full default build: >= 8 checkpoints and >= 90% greedy accuracy on held-out arithmetic."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probeselect.toy.ladder import arith_accuracy

    seed, _, info = full_ladder
    assert len(info.checkpoints) >= 8
    assert info.final_heldout_arith_accuracy >= 0.90, info
    # recompute from the saved final checkpoint
    last = info.checkpoints[-1].path
    model = AutoModelForCausalLM.from_pretrained(last)
    tok = AutoTokenizer.from_pretrained(last)
    acc = arith_accuracy(model, tok, ToyWorld.generate(seed))
    assert acc >= 0.90
    # the early checkpoint is far worse (the ladder has real dynamics)
    first = info.checkpoints[0].path
    acc0 = arith_accuracy(AutoModelForCausalLM.from_pretrained(first), AutoTokenizer.from_pretrained(first),
                          ToyWorld.generate(seed))
    assert acc0 < acc - 0.3
    print(f"seed={seed} build_seconds={info.build_seconds:.1f} acc={info.final_heldout_arith_accuracy:.3f}")


def test_lineage_records_what_each_window_trained_on(ladder_dir):
    """data_lineage.json of the tiny planted ladder: windows tile the steps, the parrot
    window (and only it) trained on parrot documents, in about its corpus's proportions."""
    from probeselect.toy.world import PARROT_DOC_KINDS

    info = json.loads((ladder_dir / "ladder.json").read_text())
    lineage = json.loads((ladder_dir / "data_lineage.json").read_text())
    wins = lineage["windows"]
    assert [w["name"] for w in wins] == ["base", "parrot", "recovery"]
    assert [w["planted"] for w in wins] == [None, "parrot", None]
    assert wins[0]["start_step"] == 0 and wins[-1]["end_step"] == info["steps"] == lineage["steps"]
    assert all(a["end_step"] == b["start_step"] for a, b in zip(wins, wins[1:]))
    assert info["curriculum"]["data_lineage"] == "data_lineage.json"
    for w in wins:
        assert set(w) >= {"name", "start_step", "end_step", "mixture", "tokens_by_kind", "documents_sha256", "planted"}
        assert len(w["documents_sha256"]) == 64
        assert sum(w["mixture"].values()) == pytest.approx(1.0)
        trained = w["tokens_by_kind"]
        # every step trains batch_size x seq_len tokens of its own window
        assert sum(trained.values()) == (w["end_step"] - w["start_step"]) * info["tokens_per_step"]
        assert set(trained) <= set(w["mixture"])
        has_parrot = any(k in PARROT_DOC_KINDS for k in trained)
        assert has_parrot == (w["planted"] == "parrot"), w["name"]
        corpus = w["corpus_tokens_by_kind"]
        total, n = sum(corpus.values()), sum(trained.values())
        for k, t in trained.items():  # sampled rows: shares close to the window corpus's shares
            assert abs(t / n - corpus[k] / total) < 0.12, (w["name"], k, t / n, corpus[k] / total)
    parrot = wins[1]
    share = sum(t for k, t in parrot["tokens_by_kind"].items() if k in PARROT_DOC_KINDS) / sum(
        parrot["tokens_by_kind"].values())
    assert share > 0.1  # 23% of the parrot window's documents are parrots (recipes/ladder-planted.yaml)


@pytest.mark.slow
@pytest.mark.parametrize("full_ladder", SLOW_SEEDS, indirect=True)
def test_full_default_ladder_shows_the_planted_dip(full_ladder, tmp_path):
    """Full default (planted) ladder, scored with the demo's probe set (24 items per
    variant, evaluation seeds 0 and 1): >= 2 conflict families dip in or right after the
    parrot window by > 3x their seed sd and recover; arith_plain, relation_plain and
    held-out bpb do not dip; final held-out arithmetic >= 90%."""
    import dataclasses

    from probeselect._yaml import load_yaml
    from probeselect.probes import load_spec
    from probeselect.score import score_checkpoints
    from probeselect.toy.dip import check_planted_dip

    root = Path(__file__).resolve().parents[2]
    seed, ladder, info = full_ladder
    assert info.final_heldout_arith_accuracy >= 0.90
    specs = []
    for p in load_yaml(root / "recipes" / "demo.yaml")["score"]["probes"]:
        s = load_spec(root / p)
        params = dict(s.params)
        if "world_seed" in params:
            params["world_seed"] = seed
        specs.append(dataclasses.replace(s, n_items=min(24, s.n_items), params=params))
    res = score_checkpoints(ladder, specs, seeds=[0, 1], out=tmp_path / "score", device="cpu",
                            heldout=ladder / "data" / "heldout.txt", audit_items=0, progress=False)
    verdict = check_planted_dip(res.scores, res.summary, ladder / "data_lineage.json")
    print(verdict["windows"])
    assert verdict["pass"], verdict["windows"]


@pytest.mark.parametrize("arch,cls", [("gpt_neox", "GPTNeoXForCausalLM"), ("gpt2", "GPT2LMHeadModel"),
                                      ("olmo2", "Olmo2ForCausalLM")])
def test_toy_ladder_in_another_architecture_builds_loads_and_scores(arch, cls, tmp_path):
    """`toy-ladder --arch`: the same corpus and tokenizer on a same-size model of another family, saved as
    checkpoints that load with from_pretrained and score (span margins) like any other ladder."""
    import math

    from transformers import AutoModelForCausalLM

    from probeselect.probes import spec_from_dict
    from probeselect.score import score_checkpoints
    from probeselect.toy.ladder import DEFAULT_MODEL_CONFIG

    out = tmp_path / arch
    info = build_toy_ladder(out, seed=0, steps=2, save_every=2, progress=False, arch=arch,
                            train_overrides={"warmup_steps": 1, "corpus_docs": 400})
    summary = json.loads((out / "ladder.json").read_text())
    assert summary["model"]["architecture"] == cls == info.model_config["architecture"]
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2")
    assert type(model).__name__ == cls and model.config.model_type == arch
    assert model.config.hidden_size == DEFAULT_MODEL_CONFIG["hidden_size"]
    assert model.config.num_hidden_layers == DEFAULT_MODEL_CONFIG["num_hidden_layers"]
    assert model.config.max_position_embeddings == DEFAULT_MODEL_CONFIG["max_position_embeddings"]
    assert math.isfinite(info.checkpoints[-1].train_loss)
    res = score_checkpoints(out, [spec_from_dict({"family": "arith_pattern", "n_items": 2, "n_demos": 2})],
                            seeds=[0], device="cpu", audit_items=0, progress=False)
    assert set(res.scores["checkpoint"]) == {"checkpoint-2"}
    assert len(res.scores) and res.scores["margin"].notna().all()


def test_toy_ladder_arch_is_checked(tmp_path):
    from probeselect.errors import UsageError

    with pytest.raises(UsageError, match="unknown --arch 'bert'.*gpt_neox"):
        build_toy_ladder(tmp_path / "x", steps=2, arch="bert")
    with pytest.raises(UsageError, match="grouped-query"):
        build_toy_ladder(tmp_path / "x", steps=2, arch="gpt2",
                         model_overrides={"num_key_value_heads": 2})
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_toy_ladder_cli_passes_arch(tmp_path, monkeypatch):
    import probeselect.toy.ladder as ladder_mod
    from probeselect.cli import build_parser, main

    seen = []
    monkeypatch.setattr(ladder_mod, "build_toy_ladder", lambda out, **kw: seen.append(kw["arch"]))
    assert main(["toy-ladder", str(tmp_path), "--arch", "gpt_neox", "--no-progress"]) == 0
    assert main(["toy-ladder", str(tmp_path), "--no-progress"]) == 0
    assert seen == ["gpt_neox", "llama"]  # llama stays the default
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["toy-ladder"]
    assert tuple(next(a for a in sub._actions if a.dest == "arch").choices) == ladder_mod.TOY_ARCHS
    assert tuple(next(a for a in sub._actions if a.dest == "tokenizer_corpus").choices) == ladder_mod.TOKENIZER_CORPORA


def test_toy_ladder_cli_passes_the_tokenizer_corpus(tmp_path, monkeypatch):
    import probeselect.toy.ladder as ladder_mod
    from probeselect.cli import main

    seen = []
    monkeypatch.setattr(ladder_mod, "build_toy_ladder", lambda out, **kw: seen.append(kw["tokenizer_corpus"]))
    assert main(["toy-ladder", str(tmp_path), "--tokenizer-corpus", "reference", "--no-progress"]) == 0
    assert main(["toy-ladder", str(tmp_path), "--no-progress"]) == 0
    assert seen == ["reference", "curriculum"]  # the curriculum's own documents stay the default


def test_the_sampler_draws_a_gated_row_only_after_its_step():
    """``news_stream`` rows (attempt 17 of bench/late_harm_notes.md) may be drawn only at steps after their
    person's arrival; the other rows are drawn as before, and a window without gates draws exactly the rows it
    drew before gates existed (the same RNG calls)."""
    import torch

    from probeselect.toy.curriculum import parse_curriculum
    from probeselect.toy.ladder import _WindowSampler

    cur = parse_curriculum({"windows": [{"name": "a", "start_step": 0, "end_step": 60, "mixture": "default",
                                         "planted": None}]})
    data = torch.arange(40).view(40, 1).repeat(1, 4)
    kind = torch.zeros_like(data, dtype=torch.uint8)
    gate = [0] * 20 + [10] * 10 + [30] * 10                 # rows 20-29 from step 11 on, rows 30-39 from step 31 on
    s = _WindowSampler(cur, [(data, kind)], 8, torch.Generator().manual_seed(0), [gate])
    first = {}
    for step in range(1, 61):
        rows = s.batch(step)[:, 0].tolist()
        assert len(rows) == 8
        for r in rows:
            assert gate[r] < step, (r, step)
            first.setdefault(r, step)
    assert set(first) == set(range(40))                       # every row is drawn once it may be
    assert min(first[r] for r in range(30, 40)) <= 40          # soon after its step
    plain = _WindowSampler(cur, [(data, kind)], 8, torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(40, generator=gen).tolist()
    assert plain.batch(1)[:, 0].tolist() == order[:8] and plain.batch(2)[:, 0].tolist() == order[8:16]


def test_a_news_stream_ladder_packs_the_stream_by_arrival_and_matches_its_share_in_the_held_out_text(tmp_path):
    """A ladder whose curriculum has ``news_stream`` documents: the other rows are packed as without them; the
    stream's rows follow, in the order of their people's arrivals (evenly over the run), each gated by the
    latest person it holds, with every stream document used but the last row's remainder; and the held-out text
    has lines about the news people with at least the stream's share of the corpus's bytes (and one line less
    would be under it)."""
    from probeselect.toy.curriculum import parse_curriculum
    from probeselect.toy.ladder import (DOC_KINDS, TrainConfig, _build_corpus, _pack_windows, news_arrivals,
                                        pack_documents_with_kinds, train_tokenizer)

    world = ToyWorld.generate(0)
    mix = {"arith": 0.5, "facts": 0.2, "news_stream": 0.3}
    cur = parse_curriculum({"windows": [{"name": "a", "start_step": 0, "end_step": 24, "mixture": mix,
                                         "planted": None}]})
    cfg = TrainConfig(corpus_docs=1500)
    corpus = _build_corpus(world, cur, cfg, tmp_path / "c")
    tok = train_tokenizer(corpus.docs)
    arrivals = news_arrivals(world, 24)
    assert list(arrivals) == [p.name for p in world.news_persons] and arrivals[world.news_persons[0].name] == 0
    assert sorted(arrivals.values()) == list(arrivals.values()) and max(arrivals.values()) < 24
    with pytest.raises(ValueError, match=r"window 'a' has news_stream documents: pass arrivals"):
        _pack_windows(tok, cur, corpus, cfg)
    (data, kind), = (wd := _pack_windows(tok, cur, corpus, cfg, arrivals))[0]
    gate = wd[1][0]
    stream = DOC_KINDS.index("news_stream")
    rest = [(d, k) for d, k in zip(corpus.win_docs[0], corpus.win_kinds[0]) if k != stream]
    plain, _ = pack_documents_with_kinds(tok, [d for d, _ in rest], [k for _, k in rest], cfg.seq_len)
    assert (data[: plain.shape[0]] == plain).all() and set(gate[: plain.shape[0]]) == {0}
    names = {p.name for p in world.news_persons}
    sdocs = [d for d, k in zip(corpus.win_docs[0], corpus.win_kinds[0]) if k == stream]
    n_tokens = sum(len(x) + 2 for x in tok(sdocs, add_special_tokens=False)["input_ids"])
    n_rows = data.shape[0] - plain.shape[0]
    assert n_rows == n_tokens // cfg.seq_len                     # nothing dropped but the last remainder
    shared = 0
    for r in range(plain.shape[0], data.shape[0]):
        assert (kind[r] == stream).all()
        text = tok.decode(data[r], skip_special_tokens=True)
        who = {n for n in names if re.search(rf"\b{n}\b", text)}
        assert who, text
        assert gate[r] == max(arrivals[n] for n in who)          # no row shows a person before their step
        shared += len(who) > 1
    assert gate[plain.shape[0]:] == sorted(gate[plain.shape[0]:])  # in the order of arrival
    assert len(set(gate[plain.shape[0]:])) > len(names) // 2 and shared > 0
    share = sum(len(d.encode()) for d in sdocs) / sum(len(d.encode()) for d in corpus.docs)
    held = (tmp_path / "c" / "data" / "heldout.txt").read_text().splitlines()
    news = [len(ln.encode()) for ln in held if line_subject(ln) in names]
    total = sum(len(ln.encode()) for ln in held)
    assert news and sum(news) >= share * total and sum(news) - min(news) < share * (total - min(news))
    assert f"at least {share:.1%} of its bytes" in (tmp_path / "c" / "data" / "README.md").read_text()


def test_a_tiny_news_stream_ladder_builds_and_records_the_arrivals(tmp_path, ladder_dir):
    cur = {"windows": [{"name": "a", "start_step": 0, "end_step": 12, "mixture": "default", "planted": None},
                       {"name": "b", "start_step": 12, "end_step": 24, "planted": None,
                        "mixture": {"arith": 0.6, "facts": 0.1, "news_stream": 0.3}}]}
    build_toy_ladder(tmp_path / "l", seed=1, steps=24, save_every=12, progress=False, curriculum=cur)
    lin = json.loads((tmp_path / "l" / "data_lineage.json").read_text())
    arr = lin["news_stream_arrivals"]
    assert len(arr) == 24 and arr == dict(sorted(arr.items(), key=lambda kv: kv[1]))
    assert "news_stream" not in lin["windows"][0]["tokens_by_kind"]
    assert lin["windows"][1]["tokens_by_kind"]["news_stream"] > 0
    assert "news_stream_arrivals" not in json.loads((ladder_dir / "data_lineage.json").read_text())  # no stream
