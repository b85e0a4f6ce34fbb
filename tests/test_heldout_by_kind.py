"""bench/heldout_by_kind.py: the split of a toy ladder's held-out bpb by kind of line (issue 23 notes)."""
import random

import pytest

from _bench import load_bench



@pytest.fixture(scope="module")
def hbk():
    return load_bench("heldout_by_kind")


@pytest.mark.parametrize("seed", [0, 7])
def test_every_generator_of_the_heldout_text_gets_its_own_kind(hbk, seed):
    from probeselect.toy.data import make_heldout_lines
    from probeselect.toy.world import (ARITH_TEMPLATES, SEQUENCE_KINDS, ToyWorld, format_arith,
                                       format_sequence, make_sequence)

    world = ToyWorld.generate(seed)
    rng = random.Random(seed)
    for a, op, b in world.arith_train[:200]:
        for fmt in ARITH_TEMPLATES:
            assert hbk.line_kind(format_arith(a, op, b, fmt)) == "arith", (a, op, b, fmt)
    for _ in range(300):
        assert hbk.line_kind(world.sample_fact_line(rng)) == "person"
        assert hbk.line_kind(world.sample_words_line(rng)) == "words"
        block = world.sample_persona_block(rng.choice(world.persons), rng)
        assert hbk.line_kind(block.split("\n")[0]) == "person", block
        assert hbk.line_kind(format_sequence(make_sequence(rng.choice(SEQUENCE_KINDS), rng))) == "sequence"
        assert hbk.line_kind(world.sample_news_line(rng)) == "news"
    # in the held-out text itself: exactly one arithmetic line per held-out triple; news lines only when asked
    lines = make_heldout_lines(world, [])
    kinds = [hbk.line_kind(ln) for ln in lines]
    assert kinds.count("arith") == len(world.arith_heldout)
    assert set(kinds) == set(hbk.KINDS) - {"news"}
    kinds = [hbk.line_kind(ln) for ln in make_heldout_lines(world, [], n_news=40)]
    assert kinds.count("news") == 40 and set(kinds) == set(hbk.KINDS)


def test_the_contributions_add_up_to_the_whole_files_bpb(hbk, tiny_ladder, ladder_checkpoints):
    """Every line counted once: the byte-weighted kinds give the file's bpb (as `probeselect score` reports it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probeselect.capability import heldout_nll

    ck = ladder_checkpoints[-1]
    lines = hbk.read_lines(tiny_ladder)
    model, tok = AutoModelForCausalLM.from_pretrained(ck).eval(), AutoTokenizer.from_pretrained(ck)
    t = hbk.by_kind(model, tok, lines)
    parts, whole = t[t.kind != "all"], t[t.kind == "all"].iloc[0]
    file_bpb = heldout_nll(model, tok, lines).bits_per_byte          # the whole file scored at once
    assert parts.lines.sum() == whole.lines == len(lines)
    assert parts.byte_share.sum() == pytest.approx(1.0, abs=1e-12)
    assert parts.contribution.sum() == pytest.approx(file_bpb, rel=1e-9)
    assert whole.bpb == pytest.approx(file_bpb, rel=1e-9)
    assert (parts.bpb > 0).all()


def test_a_missing_ladder_or_checkpoint_is_named(hbk, tmp_path, tiny_ladder):
    with pytest.raises(SystemExit, match="heldout.txt"):
        hbk.main([str(tmp_path), "--checkpoints", "1"])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "heldout.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(SystemExit, match="heldout.txt: no non-empty line"):
        hbk.main([str(tmp_path), "--checkpoints", "1"])
    with pytest.raises(SystemExit, match="checkpoint-999999"):
        hbk.main([str(tiny_ladder), "--checkpoints", "999999"])


def test_the_command_writes_its_table_as_csv(hbk, tmp_path, tiny_ladder, ladder_checkpoints, capsys):
    """`--out` writes the printed table (it raised a TypeError once: a regression test of the command itself)."""
    import pandas as pd

    step = int(ladder_checkpoints[-1].name.split("-")[-1])
    out = tmp_path / "sub" / "by_kind.csv"
    out.parent.mkdir()
    assert hbk.main([str(tiny_ladder), "--checkpoints", str(step), "--out", str(out)]) == 0
    t = pd.read_csv(out)
    assert list(t.columns) == ["checkpoint", "kind", "lines", "bytes", "byte_share", "bpb", "contribution"]
    assert set(t.checkpoint) == {step} and t.kind.iloc[-1] == "all"
    parts = t[t.kind != "all"]
    assert parts.contribution.sum() == pytest.approx(t.bpb.iloc[-1], abs=1e-5)  # 6 decimals in the CSV
    assert "all" in capsys.readouterr().out
    assert not list(out.parent.glob("*.tmp*"))


def test_news_lines_by_arrival_prints_each_line_in_order_of_arrival(hbk, tmp_path, tiny_ladder, ladder_checkpoints,
                                                                    capsys):
    """bench/news_lines_by_arrival.py: one column per held-out news line, sorted by its person's arrival, with the
    line's own bpb; a ladder without ``news_stream`` arrivals is a clear error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probeselect.capability import heldout_nll
    from probeselect.toy.world import ToyWorld, line_subject

    nla = load_bench("news_lines_by_arrival")
    with pytest.raises(SystemExit, match="no news_stream_arrivals; pass a ladder whose curriculum has news_stream"):
        nla.main([str(tiny_ladder), "--checkpoints", "1"])
    with pytest.raises(SystemExit, match="no news_stream_arrivals"):              # no such folder
        nla.main([str(tmp_path / "missing"), "--checkpoints", "1"])
    (tmp_path / "bad").mkdir()
    for text in ("{not json", "[1, 2]"):
        (tmp_path / "bad" / "data_lineage.json").write_text(text)
        with pytest.raises(SystemExit, match=r"data_lineage.json: not a ladder's data lineage .*rebuild the ladder"):
            nla.main([str(tmp_path / "bad"), "--checkpoints", "1"])
    world, rng = ToyWorld.generate(0), random.Random(0)
    lines = [world.sample_news_line(rng) for _ in range(3)] + [world.sample_fact_line(rng)]
    people = [line_subject(ln) for ln in lines[:3]]
    arrivals = {p.name: 100 * i for i, p in enumerate(reversed(world.news_persons))}
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "heldout.txt").write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    (tmp_path / "data_lineage.json").write_text(__import__("json").dumps({"news_stream_arrivals": arrivals}))
    ck = ladder_checkpoints[-1]
    (tmp_path / ck.name).symlink_to(ck)
    assert nla.main([str(tmp_path), "--checkpoints", ck.name.split("-")[1]]) == 0
    head, row = capsys.readouterr().out.strip().splitlines()
    order = sorted(range(3), key=lambda i: arrivals[people[i]])
    assert [int(x) for x in head.split()[1:]] == [arrivals[people[i]] for i in order]
    model, tok = AutoModelForCausalLM.from_pretrained(ck).eval(), AutoTokenizer.from_pretrained(ck)
    want = [heldout_nll(model, tok, [lines[i]]).bits_per_byte for i in order]
    assert [float(x) for x in row.split()[1:]] == pytest.approx(want, abs=0.006)   # printed with 2 decimals
