"""Candidate toy transfer kinds whose failures are the shortcut (issue 23 development tool).

The toy truth (matched LoRA SFT, then greedy exact answers on ``arrow_pattern`` /
``persona_tell_copy``) hardly ever fails with the shortcut (bench/late_harm_notes.md), so it
cannot reward shortcut resistance. This script draws candidate transfer items from a ladder's
toy world and counts, per (seed, checkpoint, model, kind, pattern), how many greedy answers are
the task answer, the shortcut (the demonstrated pattern's next value), a copy of another shown
value or a third answer, for the pretrained base and for each post-SFT adapter of a truth run
(bench/late_harm_truth.py).
The truth's SFT does not depend on the transfer items, so scoring new items on its adapters is
exactly "the truth with that kind"; nothing is retrained.

A kind is a spec ``DEMO:QUERY:PATTERNS:OPERANDS:NLO-NHI``:

* DEMO -- solved-line format of the demonstrations: ``arrow`` (``"12 + 5 -> 3"``, the
  ``arrow_pattern`` format; SFT's ``arrow_arith`` teaches it with true results) or ``gives``
  (``"12 + 5 gives 3"``, the late-harm curriculum's unseen form ``parrot_arith_unseen``; no
  SFT row, probe or transfer item uses it);
* QUERY -- ``compute`` (``"Q: Compute a op b. A:"``, the SFT's arrow question), ``whatis``
  (``"Q: What is a op b? A:"``, the SFT's question), ``gives`` (``"a op b gives"``, the
  pretraining form itself, no SFT marker), ``arrow`` (``"a op b ->"``) or ``eq`` (``"a op b ="``,
  the corpus's most frequent form), ``qgives`` (``"Q: What does a op b give? A:"``) or ``qgives2``
  (``"Q: a op b gives? A:"``): the planted verb inside the SFT's markers;
* PATTERNS -- ``+``-joined shown-result patterns (``count``, ``constant``, ``alternating``,
  ``countdown``, ``first_operand``, ``doubling``; ranges as in ``parrot_arith_unseen``) or
  ``all`` (``true``: the true results, a capability control without shortcut); items cycle
  through them and every count is also reported per pattern;
* OPERANDS -- query operands: ``small`` (both <= 20, where capability is high), ``large`` (one
  >= 21, as ``arrow_pattern``), ``any`` or ``demo`` (the triple of one of the solved lines, asked
  again); always a training triple (never held out);
* NLO-NHI -- demonstrations per item (inclusive).

A kind ``mismatch:CONTEXT:QUERY:ASKED:NLO-NHI`` is the ``tmpl_mismatch`` conflict in the SFT's
question form instead (:class:`MismatchSpec`).

At the end a summary prints, per kind and seed, the shares of task / shortcut / copy answers of the
base and of the adapters pooled, and whether the kind meets the criterion of a promising kind
(:data:`MIN_SHORTCUT` etc.; clean = the first checkpoint, harmed = the last).

Items are held out from the ladder's ``sft.jsonl`` prompts, its pilot ``transfer.jsonl`` and the
truth's ``truth_transfer.jsonl`` prompts; small-operand queries never use a triple that a probe
item of the ladder's scoring run queries, and :func:`probeselect.transfer.check_disjoint_from_probes`
is run on every kind. Deterministic: one seeded stream per (world seed, kind), 1 torch thread.

    nice -n 10 python bench/shortcut_kinds.py /tmp/h23/lh4c-s0 /tmp/h23/lh4c-s1 /tmp/h23/lh4c-s2 \\
        --checkpoints 1200 1600 2000 --kinds arrow:compute:constant:small:3-4 --n 60 --csv OUT.csv

Truth and score directories default to ``<ladder>-truth`` and ``<ladder>-score`` (the layout of
/tmp/h23/run_attempt.sh); ``--truth-dir`` / ``--score-dir`` take one per ladder.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

PATTERNS = ("count", "constant", "alternating", "countdown", "first_operand", "doubling")
DEMO_LINES = {"arrow": "{a} {op} {b} -> {c}", "gives": "{a} {op} {b} gives {c}"}
QUERIES = {"compute": "Q: Compute {a} {op} {b}. A:", "whatis": "Q: What is {a} {op} {b}? A:",
           "gives": "{a} {op} {b} gives", "arrow": "{a} {op} {b} ->", "eq": "{a} {op} {b} =",
           "qgives": "Q: What does {a} {op} {b} give? A:", "qgives2": "Q: {a} {op} {b} gives? A:"}
OPERANDS = ("small", "large", "any", "demo")
SMALL_MAX = 20  # the built-in arithmetic probes draw 0..20


MM_CONTEXTS = ("facts", "qa", "mixed")
MM_QUESTIONS = {"whatis": {"city": "Where does {name} live?", "job": "What is {name}'s job?"},
                "tell": {"city": "Tell me where {name} lives.", "job": "Tell me {name}'s job."}}
MM_SHOWN = ("city", "job", "pet", "hobby", "colour")


class MismatchSpec:
    """``mismatch:CONTEXT:QUERY:ASKED:NLO-NHI`` -- the ``tmpl_mismatch`` conflict in the SFT's question
    form: lines about other people's attribute X (``facts``: ``"Ana is a baker."``; ``qa``: questions
    about the asked attribute answered with X values, ``"Q: Where does Ana live? A: baker"``; ``mixed``:
    facts, then the planted documents' mismatched sentences ``"Bo lives in a tailor."``), then
    ``"Q: Where does Oda live? A:"`` (``whatis``, the SFT's ``person_city`` / ``person_job`` questions)
    or ``"Q: Tell me where Oda lives. A:"`` (``tell``, untaught). ASKED: ``city``, ``job`` or
    ``city+job``. The task is Oda's asked attribute; the shortcut is Oda's X value; ``copy`` counts
    any other X value (an answer of the shown type)."""

    def __init__(self, text: str):
        parts = text.split(":")
        if len(parts) != 5 or parts[1] not in MM_CONTEXTS or parts[2] not in MM_QUESTIONS:
            raise SystemExit(f"kind {text!r}: expected mismatch:{{{','.join(MM_CONTEXTS)}}}:{{whatis,tell}}:"
                             "ASKED:NLO-NHI, e.g. mismatch:facts:whatis:city+job:3-4")
        self.text = text
        _, self.context, self.query, asked, nd = parts
        self.asked = tuple(asked.split("+"))
        if any(x not in ("city", "job") for x in self.asked):
            raise SystemExit(f"kind {text!r}: ASKED must be city, job or city+job (the SFT's answer formats)")
        lo, hi = nd.split("-")
        self.n_demos = (int(lo), int(hi))
        self.patterns = tuple(f"{y}<-{x}" for y in self.asked for x in MM_SHOWN if x != y)


def _bare(p, attr: str) -> str:
    return str(getattr(p, attr))


def make_mismatch_items(world, spec: MismatchSpec, n: int, banned_prompts: set[str], probe_keys: set,
                        seed_tag: str) -> list[dict]:
    from probeselect.toy.world import FACT_TEMPLATES, rng_for
    from probeselect.transfer import query_key

    rng = rng_for(world.seed, f"shortcut-kinds/{seed_tag}/{spec.text}")
    persons = list(world.persons)
    rows, seen, i, tries = [], set(), 0, 0
    while len(rows) < n:
        tries += 1
        if tries > 1000 * n:
            raise SystemExit(f"kind {spec.text}: cannot draw {n} items (got {len(rows)})")
        pattern = spec.patterns[i % len(spec.patterns)]
        y, x = pattern.split("<-")
        k = rng.randint(*spec.n_demos)
        people = rng.sample(persons, k + 1)
        q, others = people[-1], people[:-1]
        if spec.context == "facts":
            lines = [o.fact(x) for o in others]
        elif spec.context == "qa":
            lines = [f"Q: {MM_QUESTIONS[spec.query][y].format(name=o.name)} A: {_bare(o, x)}" for o in others]
        else:
            j = max(1, k // 2)
            prefix = FACT_TEMPLATES[y].split(" {")[0]
            lines = [o.fact(x) for o in others[:j]]
            lines += [prefix.format(name=o.name) + " " + (o.fields()["a_" + x] if x in ("job", "pet") else _bare(o, x))
                      + "." for o in others[j:]]
        query = f"Q: {MM_QUESTIONS[spec.query][y].format(name=q.name)} A:"
        prompt = "\n".join(lines + [query])
        if prompt in seen or prompt in banned_prompts or (query_key(query), _bare(q, y).lower()) in probe_keys:
            continue  # "What is Oda's job?" -> tailor is also a tmpl_mismatch probe query
        seen.add(prompt)
        vocab = sorted({_bare(p, x) for p in persons} - {_bare(q, x)})
        rows.append({"id": f"sk-{len(rows):04d}", "kind": spec.text, "pattern": pattern, "prompt": prompt,
                     "response": " " + _bare(q, y), "shortcut": _bare(q, x), "shown": vocab})
        i += 1
    return rows


class Spec:
    def __init__(self, text: str):
        parts = text.split(":")
        if len(parts) != 5:
            raise SystemExit(f"kind {text!r}: expected DEMO:QUERY:PATTERNS:OPERANDS:NLO-NHI, e.g. "
                             "arrow:compute:constant:small:3-4")
        self.text = text
        self.demo, self.query, pats, self.operands, nd = parts
        self.patterns = PATTERNS if pats == "all" else tuple(pats.split("+"))
        bad = [p for p in self.patterns if p not in PATTERNS + ("true",)]
        if self.demo not in DEMO_LINES or self.query not in QUERIES or self.operands not in OPERANDS or bad:
            raise SystemExit(f"kind {text!r}: DEMO in {list(DEMO_LINES)}, QUERY in {list(QUERIES)}, OPERANDS in "
                             f"{list(OPERANDS)}, patterns in {list(PATTERNS)} or 'all'")
        lo, hi = nd.split("-")
        self.n_demos = (int(lo), int(hi))


def shown_values(pattern: str, triples, query, rng: random.Random) -> tuple[list[int], int]:
    """Shown results of the solved lines and the pattern's next value (the shortcut for ``query``):
    :func:`probeselect.toy.world.pattern_values` (the draws of ``parrot_arith_unseen``), plus the
    ``true`` control (the true results, no shortcut)."""
    from probeselect.toy.world import pattern_values

    if pattern == "true":
        return [_apply(*t) for t in triples], None
    return pattern_values(pattern, triples, query, rng)


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def make_items(world, spec: Spec, n: int, banned_prompts: set[str], banned_triples: set, seed_tag: str) -> list[dict]:
    from probeselect.toy.world import rng_for

    rng = rng_for(world.seed, f"shortcut-kinds/{seed_tag}/{spec.text}")
    train = list(world.arith_train)
    if spec.operands == "small":
        pool = [t for t in train if max(t[0], t[2]) <= SMALL_MAX and t not in banned_triples]
    elif spec.operands == "large":
        pool = [t for t in train if max(t[0], t[2]) > SMALL_MAX]
    else:
        pool = [t for t in train if t not in banned_triples]
    rows, seen, i, tries = [], set(), 0, 0
    while len(rows) < n:
        tries += 1
        if tries > 1000 * n:
            raise SystemExit(f"kind {spec.text}: cannot draw {n} items (got {len(rows)})")
        pattern = spec.patterns[i % len(spec.patterns)]
        demos = [rng.choice(train) for _ in range(rng.randint(*spec.n_demos))]
        q = rng.choice(demos) if spec.operands == "demo" else rng.choice(pool)
        if spec.operands == "demo" and q in banned_triples:
            continue
        shown, sc = shown_values(pattern, demos, q, rng)
        ans = _apply(*q)
        if pattern != "true" and (sc == ans or any(_apply(*d) == v for d, v in zip(demos, shown))):
            continue  # the pattern must disagree with the calculation on the query and on every solved line
        block = "\n".join(DEMO_LINES[spec.demo].format(a=a, op=op, b=b, c=c) for (a, op, b), c in zip(demos, shown))
        prompt = block + "\n" + QUERIES[spec.query].format(a=q[0], op=q[1], b=q[2])
        if prompt in seen or prompt in banned_prompts:
            continue
        seen.add(prompt)
        rows.append({"id": f"sk-{len(rows):04d}", "kind": spec.text, "pattern": pattern, "prompt": prompt,
                     "response": f" {ans}", "shortcut": "" if sc is None else str(sc),
                     "shown": [str(v) for v in shown]})
        i += 1
    return rows


def probe_query_keys(items_jsonl: Path) -> set:
    """(query_key of the last prompt line, normalised task answer) of every probe item."""
    from probeselect.generation import normalize_answer
    from probeselect.transfer import query_key

    return {(query_key(last), normalize_answer(row["task_answer"])) for row, last in _items_with_query(items_jsonl)}


def probe_triples(items_jsonl: Path) -> set:
    """Arithmetic triples queried (last prompt line) by the probe items of a scoring run."""
    from probeselect.toy.world import find_arith_triples

    out = set()
    for _, last in _items_with_query(items_jsonl):
        out |= find_arith_triples(last + " 0")  # the probe's query line lacks its result
    return out


def _items_with_query(items_jsonl: Path):
    """(row, last non-empty prompt line) of every probe item of an ``items.jsonl``."""
    for ln in items_jsonl.read_text().splitlines():
        if ln.strip():
            row = json.loads(ln)
            yield row, [x for x in row["prompt"].split("\n") if x.strip()][-1]


def classify(text: str, row: dict) -> str:
    from probeselect.generation import normalize_answer

    a = normalize_answer(text)
    for art in ("a ", "an "):  # "a baker" and "baker" are the same job
        a = a[len(art):] if a.startswith(art) else a
    if a == normalize_answer(row["response"]):
        return "task"
    if row["shortcut"] and a == normalize_answer(row["shortcut"]):
        return "shortcut"
    if a in {normalize_answer(v) for v in row.get("shown", ())}:
        return "copy"  # another value shown in the solved lines
    return "other"


#: The criterion of a promising kind (per seed; the kind needs it on MIN_SEEDS seeds): after SFT (the
#: adapters pooled) the shortcut share on the most harmed checkpoint is at least MIN_SHORTCUT and at least
#: RATIO x its share on the clean checkpoint, while the clean checkpoint answers the task on at least
#: MIN_CLEAN_TASK of the items (accuracy not floor-bound).
MIN_SHORTCUT, RATIO, MIN_CLEAN_TASK, MIN_SEEDS = 0.15, 3.0, 0.40, 2


def print_summary(out_rows: list[dict], clean: int, harmed: int) -> None:
    """Per kind and seed: base and post-SFT shares of task / shortcut / copy answers per checkpoint,
    then whether the kind meets the criterion above (clean = the first checkpoint, harmed = the last)."""
    agg: dict = collections.defaultdict(collections.Counter)
    for r in out_rows:
        key = (r["kind"], r["seed"], r["checkpoint"], "base" if r["model"] == "base" else "sft")
        agg[key].update({k: r[k] for k in ("n", "task", "shortcut", "copy", "other")})
    kinds = list(dict.fromkeys(r["kind"] for r in out_rows))
    seeds = sorted({r["seed"] for r in out_rows})
    cks = sorted({r["checkpoint"] for r in out_rows})
    print("\nsummary: % of items answered task / shortcut / copy (sft: the adapters pooled)")
    for kind in kinds:
        passed = 0
        for seed in seeds:
            cells = []
            for ck in cks:
                for m in ("base", "sft"):
                    c = agg.get((kind, seed, ck, m))
                    if c:
                        cells.append(f"{ck} {m} {100 * c['task'] / c['n']:3.0f}/{100 * c['shortcut'] / c['n']:3.0f}/"
                                     f"{100 * c['copy'] / c['n']:3.0f}")
            cl, hm = agg.get((kind, seed, clean, "sft")), agg.get((kind, seed, harmed, "sft"))
            ok = False
            if cl and hm:
                s_cl, s_hm = cl["shortcut"] / cl["n"], hm["shortcut"] / hm["n"]
                ok = s_hm >= MIN_SHORTCUT and s_hm >= RATIO * s_cl and cl["task"] / cl["n"] >= MIN_CLEAN_TASK
            passed += ok
            print(f"  {kind:34s} seed {seed}: " + " | ".join(cells) + ("  PASS" if ok else ""))
        print(f"  {kind:34s} meets the criterion on {passed} of {len(seeds)} seeds"
              + (" -> PROMISING" if passed >= MIN_SEEDS else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ladders", type=Path, nargs="+")
    ap.add_argument("--truth-dir", type=Path, nargs="*", help="one per ladder (default <ladder>-truth)")
    ap.add_argument("--score-dir", type=Path, nargs="*", help="one per ladder (default <ladder>-score)")
    ap.add_argument("--checkpoints", type=int, nargs="+", required=True)
    ap.add_argument("--adapters", nargs="*", default=["seed100", "seed101"])
    ap.add_argument("--kinds", nargs="+", required=True)
    ap.add_argument("--n", type=int, default=60, help="items per kind")
    ap.add_argument("--no-base", action="store_true", help="skip the pretrained base (adapters only)")
    ap.add_argument("--csv", type=Path, help="write the counts here (one row per seed/checkpoint/model/kind/pattern)")
    ap.add_argument("--show", type=int, default=0, help="print this many failed answers per kind and model")
    a = ap.parse_args(argv)

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from probeselect.toy.data import read_jsonl
    from probeselect.toy.world import ToyWorld
    from probeselect.transfer import _encoder, check_disjoint_from_probes, greedy_decode

    torch.set_num_threads(1)
    torch.manual_seed(0)
    specs = [MismatchSpec(k) if k.startswith("mismatch:") else Spec(k) for k in a.kinds]
    truths = a.truth_dir or [Path(f"{p}-truth") for p in a.ladders]
    scores = a.score_dir or [Path(f"{p}-score") for p in a.ladders]
    out_rows = []
    t0 = time.perf_counter()
    for lad, tdir, sdir in zip(a.ladders, truths, scores):
        meta = json.loads((lad / "ladder.json").read_text())
        seed = int(meta["seed"])
        world = ToyWorld.generate(seed, arith_max_operand=int(meta["arith_max_operand"]))
        banned = {r["prompt"] for r in read_jsonl(lad / "data" / "sft.jsonl")}
        banned |= {r["prompt"] for r in read_jsonl(lad / "data" / "transfer.jsonl")}
        if (tdir / "truth_transfer.jsonl").is_file():
            banned |= {r["prompt"] for r in read_jsonl(tdir / "truth_transfer.jsonl")}
        probe_items = sdir / "items.jsonl"
        if not probe_items.is_file():
            raise SystemExit(f"{probe_items}: probe items of the ladder's scoring run not found; pass --score-dir")
        ptrip = probe_triples(probe_items)
        pkeys = probe_query_keys(probe_items)
        items = {s.text: (make_mismatch_items(world, s, a.n, banned, pkeys, "v1") if isinstance(s, MismatchSpec)
                          else make_items(world, s, a.n, banned, ptrip, "v1")) for s in specs}
        for rows in items.values():
            check_disjoint_from_probes(rows, [probe_items])
        allrows = [r for rows in items.values() for r in rows]
        for ck in a.checkpoints:
            cdir = lad / f"checkpoint-{ck}"
            tok = AutoTokenizer.from_pretrained(cdir)
            enc = _encoder(tok, True)
            models = [] if a.no_base else [("base", None)]
            models += [(ad, tdir / "truth" / f"checkpoint-{ck}" / ad / "adapter") for ad in a.adapters]
            for tag, adapter in models:
                m = AutoModelForCausalLM.from_pretrained(cdir)
                if adapter is not None:
                    if not adapter.is_dir():
                        raise SystemExit(f"{adapter}: adapter not found (truth run of bench/late_harm_truth.py)")
                    m = PeftModel.from_pretrained(m, adapter)
                m.eval()
                gens = greedy_decode(m, enc, [r["prompt"] for r in allrows], max_new_tokens=8, batch_size=64)
                cnt = collections.defaultdict(collections.Counter)
                shown = collections.Counter()
                for g, r in zip(gens, allrows):
                    c = classify(g.text, r) if g.terminated else "other"
                    cnt[(r["kind"], r["pattern"])][c] += 1
                    if c != "task" and shown[r["kind"]] < a.show:
                        shown[r["kind"]] += 1
                        print(f"    {tag} {ck} {r['pattern']}: {r['prompt'][-60:]!r} task{r['response']} "
                              f"sc {r['shortcut']} got {g.text!r}")
                for (kind, pat), c in sorted(cnt.items()):
                    out_rows.append({"seed": seed, "checkpoint": ck, "model": tag, "kind": kind, "pattern": pat,
                                     "n": sum(c.values()), "task": c["task"], "shortcut": c["shortcut"],
                                     "copy": c["copy"], "other": c["other"]})
                for s in specs:
                    tot = collections.Counter()
                    per = []
                    for pat in s.patterns:
                        c = cnt[(s.text, pat)]
                        tot.update(c)
                        if len(s.patterns) > 1:
                            per.append(f"{pat} {c['task']}/{c['shortcut']}/{c['copy']}/{c['other']}")
                    print(f"seed {seed} ck {ck} {tag:8s} {s.text:34s} T/S/C/O {tot['task']:3d}/{tot['shortcut']:3d}/"
                          f"{tot['copy']:3d}/{tot['other']:3d}" + ("  [" + ", ".join(per) + "]" if per else ""),
                          flush=True)
    print_summary(out_rows, min(a.checkpoints), max(a.checkpoints))
    if a.csv:
        a.csv.parent.mkdir(parents=True, exist_ok=True)
        tmp = a.csv.with_name(a.csv.name + ".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out_rows[0]))
            w.writeheader()
            w.writerows(out_rows)
        tmp.replace(a.csv)
    print(f"seconds {time.perf_counter() - t0:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
