"""bench/shortcut_kinds.py: construction of the candidate transfer items and the criterion (no model)."""

import importlib.util
import re
from pathlib import Path

import pytest

from probeselect.toy.world import ToyWorld

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sk():
    spec = importlib.util.spec_from_file_location("shortcut_kinds", REPO / "bench" / "shortcut_kinds.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def world():
    return ToyWorld.generate(0)


@pytest.mark.parametrize("text", ["arrow:compute:constant:small:3-4", "gives:gives:all:demo:3-6",
                                  "gives:eq:count+first_operand:any:3-6", "gives:compute:true:small:3-4"])
def test_arith_items(sk, world, text):
    spec = sk.Spec(text)
    train = set(world.arith_train)
    banned_triples = {t for t in train if t[0] == 5}  # stands in for the probes' query triples
    first = sk.make_items(world, spec, 30, set(), banned_triples, "t")
    banned_prompts = {first[0]["prompt"]}
    rows = sk.make_items(world, spec, 30, banned_prompts, banned_triples, "t")
    assert rows == sk.make_items(world, spec, 30, banned_prompts, banned_triples, "t")  # deterministic
    assert len(rows) == 30 and len({r["prompt"] for r in rows}) == 30
    assert not banned_prompts & {r["prompt"] for r in rows}
    for r in rows:
        *demos, query = r["prompt"].split("\n")
        q = _triple(query)
        assert query == sk.QUERIES[spec.query].format(a=q[0], op=q[1], b=q[2])
        assert q in train and q not in banned_triples
        assert r["response"] == f" {sk._apply(*q)}"
        assert len(demos) == len(r["shown"]) and spec.n_demos[0] <= len(demos) <= spec.n_demos[1]
        if spec.operands == "small":
            assert max(q[0], q[2]) <= sk.SMALL_MAX
        if spec.operands == "demo":
            assert any(d.startswith(f"{q[0]} {q[1]} {q[2]} ") for d in demos)
        if r["pattern"] == "true":
            assert r["shortcut"] == ""
            continue
        assert r["shortcut"] != r["response"].strip()
        for d, v in zip(demos, r["shown"]):  # every solved line shows a wrong result
            assert str(sk._apply(*_triple(d))) != v


def _triple(line):
    a, op, b = re.match(r"^(?:Q: Compute |Q: What is )?(\d+) ([+-]) (\d+)", line).groups()
    return int(a), op, int(b)


def test_mismatch_items_skip_probe_queries(sk, world):
    from probeselect.transfer import query_key

    spec = sk.MismatchSpec("mismatch:qa:whatis:job:2-3")
    rows = sk.make_mismatch_items(world, spec, 20, set(), set(), "t")
    for r in rows:
        y, x = r["pattern"].split("<-")
        assert y == "job" and x != "job" and r["shortcut"] != r["response"].strip()
    # every job question of the world is a probe query: no item can be drawn
    keys = {(query_key(f"Q: What is {p.name}'s job? A:"), p.job) for p in world.persons}
    with pytest.raises(SystemExit, match="cannot draw"):
        sk.make_mismatch_items(world, sk.MismatchSpec("mismatch:facts:whatis:job:2-2"), 1, set(), keys, "t")


def test_summary_criterion(sk, capsys):
    def rows(seed, ck, task, shortcut, n=100):
        return [{"seed": seed, "checkpoint": ck, "model": m, "kind": "k", "pattern": "p", "n": n, "task": task,
                 "shortcut": shortcut, "copy": 0, "other": n - task - shortcut} for m in ("seed100", "seed101")]

    out = (rows(0, 1200, 50, 2) + rows(0, 2000, 30, 20)     # passes: 20% >= 15% and >= 3 x 2%
           + rows(1, 1200, 30, 0) + rows(1, 2000, 30, 20)   # clean task 30% < 40%
           + rows(2, 1200, 50, 10) + rows(2, 2000, 30, 20)  # 20% < 3 x 10%
           + rows(3, 1200, 50, 0) + rows(3, 2000, 30, 14))  # 14% < 15%
    sk.print_summary(out, 1200, 2000)
    text = capsys.readouterr().out
    assert [ln.split(":")[0].split()[-1] for ln in text.splitlines() if ln.endswith("PASS")] == ["0"]
    assert "meets the criterion on 1 of 4 seeds" in text and "PROMISING" not in text
    sk.print_summary(out + rows(4, 1200, 40, 1) + rows(4, 2000, 10, 15), 1200, 2000)
    assert "meets the criterion on 2 of 5 seeds -> PROMISING" in capsys.readouterr().out
