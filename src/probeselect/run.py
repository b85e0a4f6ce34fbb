"""``probeselect run CONFIG``: the whole base-selection pipeline from one YAML config.

Stages, in order (``OUT`` = the config's ``out``; ``RUN`` = ``OUT/score``)::

    ladder     build the toy ladder (``ladder: {toy: {seed: 0}}``) into OUT/ladder, or use a folder,
               or Hub revisions (``ladder: {repo: ORG/NAME, revisions: [step1000, ...] | all,
               revision_pattern: 'stage1-step*'}``; see probeselect._hub)
    score      probeselect score -> RUN/summary.csv, scores.parquet, manifest.json
    average    optional (``average: {window: K}``): average K consecutive checkpoints into
               OUT/ladder-avgK and score them -> RUN/averaged/ (compared in the report)
    dynamics   RUN/dynamics/
    lock       RUN/plan.lock.json (only if absent: a lock is never moved past results); the
               WHOLE plan (proxies, constraints, k and the selection block) is locked before
               the shortlist, after every name in it is checked against the run and the pilot
               recipe; ``select: {allow_weak: true}`` locks a k whose proxy null is unbeatable
    shortlist  RUN/shortlist.csv, shortlist.json (the plan's shortlist part)
    pilot      matched pilot SFT + transfer of the shortlist -> RUN/pilot/
    select     RUN/selection.json, selection.csv
    confirm    top N (and `confirm.references`, the naive choices) retrained with the confirmation
               recipe -> RUN/confirm/, RUN/confirm.json
    replicate  optional (``replicate: {}``, or ``{seeds: [...], jobs: N}``): when the confirmation made a claim
               the pilot did not (probeselect.replicate), retrain it on fresh SFT seeds at the confirmation
               budget -> RUN/replicate/seeds-.../, RUN/replicate.json (trains nothing when there is no such
               claim)
    report     RUN/report.md, RUN/report.html

Resumable: ``OUT/run_state.json`` records, per stage, a hash of its inputs (its config
and the sha256 of the files it reads) and the sha256 of its outputs. A stage is skipped
when the inputs hash is unchanged and its outputs exist with the recorded hashes; an
upstream change therefore reruns every stage that reads the changed file. The lock
stage is the exception: it runs only when ``plan.lock.json`` is missing, so editing the
plan mid-run makes the selection POST-HOC (and stops the run unless
``select.allow_post_hoc``) instead of silently re-locking.

String values may use ``{out}``, ``{ladder}`` and ``{run}`` (the score folder) and are
substituted after ``key=value`` overrides. Relative paths resolve against the current
working directory. ``recipes/demo.yaml`` is the commented example.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ._io import atomic_write_json, canonical_json_hash, sha256_file
from ._yaml import apply_dotted_overrides, load_yaml
from .errors import ProbeselectError, did_you_mean

__all__ = ["RunConfigError", "StageResult", "RunResult", "load_run_config", "run_pipeline", "STAGES"]

STAGES = ("ladder", "score", "average", "dynamics", "lock", "shortlist", "pilot", "select", "confirm", "replicate",
          "report")
_TOP_KEYS = ("out", "ladder", "score", "average", "plan", "pilot", "select", "confirm", "replicate", "report",
             "device")
_SCORE_KEYS = ("probes", "seeds", "n_items", "heldout", "audit_items", "max_batch_tokens", "dtype", "max_length",
               "on_overflow", "calibrate")


class RunConfigError(ProbeselectError):
    """A pipeline config (``probeselect run CONFIG``) is invalid."""


@dataclass
class StageResult:
    name: str
    status: str        # ran | skipped | off
    seconds: float
    detail: str = ""


@dataclass
class RunResult:
    out_dir: Path
    run_dir: Path
    stages: list[StageResult] = field(default_factory=list)
    report: Path | None = None


#: Config keys whose override value is a path, taken literally (``ladder`` also takes a {toy: ...} mapping).
_PATH_KEYS = frozenset({"out", "ladder", "plan", "pilot.recipe", "confirm.recipe", "score.heldout", "average.out"})


def _apply_overrides(raw: dict, overrides: Sequence[str], src: str) -> dict:
    return apply_dotted_overrides(
        raw, overrides, top_keys=_TOP_KEYS, error_cls=RunConfigError, example="confirm.top=2", path_keys=_PATH_KEYS,
        unknown_key_message=lambda ov, top: f"{src}: override {ov!r}: unknown key {top!r}.{did_you_mean(top, _TOP_KEYS)}")


def _substitute(obj: Any, subs: dict[str, str]) -> Any:
    if isinstance(obj, str):
        for k, v in subs.items():
            obj = obj.replace("{" + k + "}", v)
        return obj
    if isinstance(obj, list):
        return [_substitute(x, subs) for x in obj]
    if isinstance(obj, dict):
        return {k: _substitute(v, subs) for k, v in obj.items()}
    return obj


def _check_substituted_override(src: str, section: str, ov: str, subs: dict[str, str]) -> None:
    """A recipe override whose value is parsed as YAML (not a path key) must still hold every
    substituted path whole: ``[{run}/items.jsonl]`` with ``{run}`` = ``/data/lad #1`` would be cut at
    ``#``. Path keys (``data.train=...``) are taken literally by the recipe, so they are always safe."""
    import yaml

    from .sft.recipe import PATH_KEYS

    key, sep, text = str(ov).partition("=")
    if not sep or key.strip() in PATH_KEYS:
        return
    used = [v for v in subs.values() if v in text]
    if not used:
        return

    def leaves(x):
        if isinstance(x, dict):
            return [s for v in x.values() for s in leaves(v)]
        if isinstance(x, list):
            return [s for v in x for s in leaves(v)]
        return [str(x)]

    try:
        got = leaves(yaml.safe_load(text))
    except yaml.YAMLError:
        got = []
    for v in used:
        if not any(v in g for g in got):
            raise RunConfigError(
                f"{src}: {section}.overrides: {ov!r}: after substituting the path {v!r}, the value no longer reads "
                "as written (it is parsed as YAML, and the path's characters cut it). Quote the value, e.g. "
                f"{key.strip()}=['{{run}}/items.jsonl'], or rename the folder.")


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read, override, validate and substitute a pipeline config; returns the resolved dict."""
    path = Path(path)
    raw = load_yaml(path, RunConfigError)
    src = str(path)
    if not isinstance(raw, dict):
        raise RunConfigError(f"{src}: a pipeline config must be a YAML mapping; see recipes/demo.yaml.")
    cfg = _apply_overrides(raw, overrides, src)
    for k in cfg:
        if k not in _TOP_KEYS:
            raise RunConfigError(f"{src}: unknown key {k!r}.{did_you_mean(str(k), _TOP_KEYS)} Allowed: {list(_TOP_KEYS)}.")
    for k in ("out", "ladder", "score", "plan", "pilot"):
        if cfg.get(k) is None:
            raise RunConfigError(f"{src}: `{k}:` is required (see recipes/demo.yaml).")
    out = Path(str(cfg["out"]))
    lad = cfg["ladder"]
    if isinstance(lad, dict) and "repo" in lad:  # Hub revisions (probeselect._hub)
        bad = [k for k in lad if k not in ("repo", "revisions", "revision_pattern")]
        if bad or not isinstance(lad["repo"], str) or not (lad.get("revisions") or lad.get("revision_pattern")):
            raise RunConfigError(f"{src}: `ladder: {{repo: ORG/NAME, revisions: [...] | all}}` (or revision_pattern: "
                                 f"GLOB) expected, got {lad!r}.")
        if cfg.get("average") is not None:
            raise RunConfigError(f"{src}: `average:` needs a local ladder folder, not Hub revisions; set average: null.")
        ladder_dir = out / "ladder"
    elif isinstance(lad, dict):
        if set(lad) != {"toy"} or not isinstance(lad["toy"], dict):
            raise RunConfigError(f"{src}: `ladder:` must be a folder path or {{toy: {{seed: 0}}}}.")
        bad = [k for k in lad["toy"] if k not in ("seed", "steps", "save_every", "curriculum", "tokenizer_corpus")]
        if bad:
            raise RunConfigError(f"{src}: ladder.toy: unknown key {bad[0]!r}; allowed: seed, steps, save_every, "
                                 "curriculum, tokenizer_corpus.")
        from .toy.ladder import TOKENIZER_CORPORA

        if lad["toy"].get("tokenizer_corpus", "curriculum") not in TOKENIZER_CORPORA:
            raise RunConfigError(f"{src}: ladder.toy.tokenizer_corpus must be {' or '.join(TOKENIZER_CORPORA)}, "
                                 f"got {lad['toy']['tokenizer_corpus']!r}.")
        ladder_dir = out / "ladder"
    elif isinstance(lad, str):
        ladder_dir = Path(lad)
    else:
        raise RunConfigError(f"{src}: `ladder:` must be a folder path or {{toy: {{seed: 0}}}}, got {lad!r}.")
    sc = cfg["score"]
    if not isinstance(sc, dict) or not sc.get("probes"):
        raise RunConfigError(f"{src}: `score:` needs `probes:` (a list of probe spec files).")
    bad = [k for k in sc if k not in _SCORE_KEYS]
    if bad:
        raise RunConfigError(f"{src}: score: unknown key {bad[0]!r}.{did_you_mean(bad[0], _SCORE_KEYS)} "
                             f"Allowed: {list(_SCORE_KEYS)}.")
    ovf = sc.get("on_overflow", "error")
    if ovf not in ("error", "truncate"):
        raise RunConfigError(f"{src}: score.on_overflow must be `error` (stop on a prompt longer than the context) or "
                             f"`truncate` (cut it from the left as lm-eval does); got {ovf!r}.")
    if not isinstance(sc.get("calibrate", False), bool):
        raise RunConfigError(f"{src}: score.calibrate must be true (also score each family's content-free reference, "
                             f"`probeselect score --calibrate`) or false; got {sc['calibrate']!r}.")
    ml = sc.get("max_length")
    if ml is not None and (isinstance(ml, bool) or not isinstance(ml, int) or ml < 2):
        raise RunConfigError(f"{src}: score.max_length must be an integer >= 2 (the context limit in tokens) or null "
                             f"for the model's own; got {ml!r}.")
    avg = cfg.get("average")
    if avg is not None:
        if not isinstance(avg, dict) or any(k not in ("window", "out") for k in avg):
            raise RunConfigError(f"{src}: `average:` must be a mapping with `window:` (an integer >= 2) and optional "
                                 f"`out:` (the averaged ladder folder), or null to skip; got {avg!r}.")
        w = avg.get("window", 5)
        if isinstance(w, bool) or not isinstance(w, int) or w < 2:
            raise RunConfigError(f"{src}: average.window must be an integer >= 2; got {w!r}.")
    sel = cfg.get("select")
    if sel is not None and (not isinstance(sel, dict) or any(k not in ("allow_post_hoc", "allow_weak") for k in sel)):
        raise RunConfigError(f"{src}: `select:` must be a mapping with allow_post_hoc / allow_weak (true|false); "
                             f"got {sel!r}.")
    for k in ("pilot", "confirm"):
        v = cfg.get(k)
        if v is None:
            continue
        if not isinstance(v, dict) or "recipe" not in v:
            raise RunConfigError(f"{src}: `{k}:` must be a mapping with `recipe:` (and optional overrides{', top' if k == 'confirm' else ''}).")
        if not isinstance(v.get("overrides", []) or [], list):
            raise RunConfigError(f"{src}: {k}.overrides must be a list of key=value strings.")
        known = ("recipe", "overrides", "jobs") + (("top", "references") if k == "confirm" else ())
        for key in v:
            if key not in known:
                raise RunConfigError(f"{src}: unknown key {k}.{key!r}; `{k}:` takes {', '.join(known)}.")
        refs = v.get("references") if k == "confirm" else None
        if refs is not None:
            from .confirm import valid_references
            from .plan import REFERENCES

            if not valid_references(refs):
                raise RunConfigError(f"{src}: confirm.references must be a list of distinct naive choices from "
                                     f"{list(REFERENCES)} (retrained next to the top N at the confirmation budget); "
                                     f"got {refs!r}.")
        j = v.get("jobs")
        if j is not None and (isinstance(j, bool) or not isinstance(j, int) or j < 1):
            raise RunConfigError(f"{src}: {k}.jobs must be an integer >= 1 (bases trained at once in worker "
                                 f"processes; the numbers do not depend on it); got {j!r}.")
    _check_replicate(src, cfg)
    run_dir = out / "score"
    subs = {"out": str(out), "ladder": str(ladder_dir), "run": str(run_dir)}
    cfg = _substitute(cfg, subs)
    for k in ("pilot", "confirm"):
        for ov in (cfg.get(k) or {}).get("overrides") or []:
            _check_substituted_override(src, k, ov, subs)
    cfg["_paths"] = {"out": str(out), "ladder": str(ladder_dir), "run": str(run_dir), "config": src}
    return cfg


def _check_replicate(src: str, cfg: dict) -> None:
    """``replicate:``: absent/null (off), or a mapping with optional ``seeds`` (distinct integers >= 0) and ``jobs``;
    it needs ``confirm:`` (it re-tests the confirmation's claim with the confirmation's recipe)."""
    rep = cfg.get("replicate")
    if rep is None:
        return
    if not isinstance(rep, dict) or any(k not in ("seeds", "jobs") for k in rep):
        raise RunConfigError(f"{src}: `replicate:` must be a mapping with optional seeds (fresh SFT seeds) and jobs, "
                             f"e.g. `replicate: {{}}` or `replicate: {{seeds: [12, 13, 14]}}`; got {rep!r}.")
    if cfg.get("confirm") is None:
        raise RunConfigError(f"{src}: `replicate:` re-tests a claim of the confirmation, so it needs `confirm:`.")
    seeds = rep.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not seeds or len(set(map(str, seeds))) != len(seeds)
                              or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in seeds)):
        raise RunConfigError(f"{src}: replicate.seeds must be a non-empty list of distinct integers >= 0 (SFT seeds "
                             f"neither the pilot nor the confirmation uses); got {seeds!r}.")
    j = rep.get("jobs")
    if j is not None and (isinstance(j, bool) or not isinstance(j, int) or j < 1):
        raise RunConfigError(f"{src}: replicate.jobs must be an integer >= 1; got {j!r}.")


# ---------------------------------------------------------------------------
# Stage machinery
# ---------------------------------------------------------------------------


def _hash_files(paths: Sequence[Path]) -> dict[str, str | None]:
    return {str(p): sha256_file(p) if Path(p).is_file() else None for p in paths}


@dataclass
class _Stage:
    name: str
    inputs: Callable[[], dict]          # evaluated just before the stage (upstream outputs exist by then)
    outputs: Callable[[], list[Path]]
    run: Callable[[], str]
    enabled: bool = True
    off_detail: str = "not configured"  # the run summary's note when the stage is off


def _select_summary(r) -> str:
    """One line for the run summary: the verdict and, only for a recommendation, the base it names
    (:class:`probeselect.select.Ranking` verdicts)."""
    p = f", P(top beats runner-up) {r.p_top_beats_runner_up:.2f}" if r.p_top_beats_runner_up is not None else ""
    if r.verdict == "winner":
        return f"clear winner: {r.recommended}{p}"
    if r.verdict == "single_eligible":
        return f"only eligible base: {r.recommended} (no comparison)"
    if r.verdict == "beats_default":
        lo = f" (interval lower end {r.default_ci[0]:.3g})" if r.default_ci else ""
        return f"better than the default {r.default}: {r.recommended}{lo}; {r.reason}"
    if r.verdict == "none_eligible" or r.top is None:
        return "no eligible base (none passes the transfer constraints)"
    return (f"no clear winner ({r.reason or 'intervals overlap'}); best seed mean {r.top}"
            + (f", runner-up {r.runner_up}" if r.runner_up else "") + p)


def _state_path(out: Path) -> Path:
    return out / "run_state.json"


def _load_state(out: Path) -> dict:
    import json

    p = _state_path(out)
    if p.is_file():
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            pass
    return {"stages": {}}


def _ladder_identity(ladder) -> dict:
    """What a scored ladder depends on: ladder.json (toy) or each checkpoint's fingerprint and weight files."""
    from .checkpoints import discover_checkpoints

    if not isinstance(ladder, Path):  # Hub revisions: the resolved checkpoints (commit + file fingerprints)
        return {"hub": [{"name": c.name, "commit": c.commit, "fingerprint": c.fingerprint} for c in ladder]}
    if (ladder / "ladder.json").is_file():
        return {"ladder.json": sha256_file(ladder / "ladder.json")}
    ckpts = discover_checkpoints(ladder)
    return {"checkpoints": [{"name": c.name, "fingerprint": c.fingerprint,
                             "files": {f.name: [f.stat().st_size, f.stat().st_mtime_ns]
                                       for f in sorted(Path(c.path).glob("*.safetensors"))}} for c in ckpts]}


def _find_lineage(run: Path):
    from .attribution import find_lineage

    return find_lineage(run)


def _load_specs(sc: dict, world_seed: int | None = None) -> list:
    """The run's probe specs (``n_items`` capped); toy-world families get ``world_seed`` (the
    toy ladder's seed) so that their items use the people and facts that ladder trained on."""
    from .probes import load_spec
    from .probes._registry import bind_world_seed

    from .probes._shipped import resolve_probe_args

    specs = bind_world_seed([load_spec(p) for p in resolve_probe_args(sc["probes"], where="score.probes:")], world_seed)
    n = sc.get("n_items")
    if n is not None:
        specs = [dataclasses.replace(s, n_items=min(int(n), s.n_items)) for s in specs]
    return specs


def _truncation_note(manifest: dict) -> str:
    """"; 3 of 96 scored prompts and 2 of 8 audit prompts cut to fit the context" or ""."""
    from ._report_blocks import truncation_counts

    parts = [f"{k} of {n} {what} prompts" for what, k, n in truncation_counts(manifest) if k]
    return f"; {' and '.join(parts)} cut from the left to fit the context" if parts else ""


def _spec_paths(sc: dict) -> list[Path]:
    from .probes._shipped import resolve_probe_args

    return [Path(p) for p in resolve_probe_args(sc["probes"], where="score.probes:")]


def run_pipeline(config: str | Path, *, overrides: Sequence[str] = (), force: Sequence[str] | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None) -> RunResult:
    """Run (or resume) the pipeline of ``config``; see the module docstring.

    ``force``: stage names to rerun even if up to date (an empty list = every stage).
    Returns :class:`RunResult` with one :class:`StageResult` per stage.
    """
    import sys

    cfg = load_run_config(config, overrides)
    log = log or (lambda m: print(m, file=sys.stderr))
    # `--force` with no names reruns every stage but the lock (a lock is replaced only when named).
    forced = set(STAGES) - {"lock"} if force is not None and len(force) == 0 else set(force or ())
    unknown = forced - set(STAGES)
    if unknown:
        raise RunConfigError(f"--force: unknown stage {sorted(unknown)[0]!r}; stages: {', '.join(STAGES)}.")
    pipe = _Pipeline(cfg, forced, progress, log)
    from .score import use_device

    use_device(pipe.device)  # a device the machine lacks is refused now; cuda:N: scoring and SFT both on GPU N
    pipe.out.mkdir(parents=True, exist_ok=True)
    from ._io import RunLock

    with RunLock(pipe.out, error_cls=RunConfigError):  # one `probeselect run` per OUT folder
        return _run_stages(pipe.stages(), pipe.out, pipe.run, cfg["_paths"], overrides, forced, pipe.plan, log)


class _Pipeline:
    """The stages of one resolved config (:func:`load_run_config`): what each does (``do_<stage>``,
    returning its line for the run summary) and, in :meth:`stages`, what it reads and writes."""

    def __init__(self, cfg: dict[str, Any], forced: set, progress: bool, log: Callable[[str], None]):
        paths = cfg["_paths"]
        self.out, self.ladder, self.run = Path(paths["out"]), Path(paths["ladder"]), Path(paths["run"])
        self.plan = Path(cfg["plan"])
        self.device = cfg.get("device") or "auto"  # null: auto, as when the key is absent
        self.forced, self.progress, self.log = forced, progress, log
        self.sc = cfg["score"]
        self.pilot_cfg = cfg["pilot"]
        self.conf_cfg = cfg.get("confirm")
        self.rep_cfg = cfg.get("replicate")
        self.sel_cfg = cfg.get("select") or {}
        self.avg_cfg = cfg.get("average") or None
        self.toy = cfg["ladder"].get("toy") if isinstance(cfg["ladder"], dict) else None
        self.hub = cfg["ladder"] if isinstance(cfg["ladder"], dict) and "repo" in cfg["ladder"] else None

    def world_seed(self) -> int | None:  # the toy world of the ladder (None: not a toy ladder)
        if self.toy is not None:
            return int(self.toy.get("seed", 0))
        if self.hub is not None:
            return None
        from .probes._registry import toy_ladder_seed

        return toy_ladder_seed(self.ladder)

    def ladder_source(self):  # a folder, or the resolved Hub revisions
        if self.hub is None:
            return self.ladder
        from ._hub import resolve_hub_ladder

        return resolve_hub_ladder(self.hub["repo"], self.hub.get("revisions"), self.hub.get("revision_pattern"))

    def files(self, *names: str) -> list[Path]:
        return [self.run / n for n in names]

    # -- stage bodies --------------------------------------------------------------------------
    def do_ladder(self) -> str:
        from .toy.ladder import build_toy_ladder

        toy, ladder = self.toy, self.ladder
        info = build_toy_ladder(ladder, seed=int(toy.get("seed", 0)), steps=toy.get("steps"),
                                save_every=toy.get("save_every"), curriculum=toy.get("curriculum"),
                                tokenizer_corpus=toy.get("tokenizer_corpus", "curriculum"), progress=self.progress)
        return f"toy ladder in {ladder} (held-out arithmetic accuracy {getattr(info, 'final_heldout_arith_accuracy', float('nan')):.1%})"

    def do_score(self) -> str:
        from .score import score_checkpoints

        sc = self.sc
        res = score_checkpoints(self.ladder_source(), _load_specs(sc, self.world_seed()),
                                seeds=sc.get("seeds", [0, 1, 2, 3]), out=self.run,
                                heldout=sc.get("heldout"), audit_items=int(sc.get("audit_items", 0)),
                                max_batch_tokens=int(sc.get("max_batch_tokens", 8192)),
                                max_length=sc.get("max_length"), on_overflow=sc.get("on_overflow", "error"),
                                dtype=sc.get("dtype", "float32"), device=self.device, progress=self.progress,
                                calibrate=bool(sc.get("calibrate", False)))
        return (f"scored {len(res.scored)} checkpoint(s) ({len(res.manifest['checkpoints']) - len(res.scored)} cached)"
                + _truncation_note(res.manifest))

    def do_average(self) -> str:
        from .average import average_checkpoints
        from .score import score_checkpoints

        sc, run, ladder = self.sc, self.run, self.ladder
        window = int(self.avg_cfg.get("window", 5))
        avg_dir = Path(self.avg_cfg.get("out") or self.out / f"ladder-avg{window}")
        average_checkpoints(ladder, window=window, out_dir=avg_dir, progress=self.progress)
        res = score_checkpoints(avg_dir, _load_specs(sc, self.world_seed()), seeds=sc.get("seeds", [0, 1, 2, 3]),
                                out=run / "averaged", heldout=sc.get("heldout"), audit_items=0,
                                max_batch_tokens=int(sc.get("max_batch_tokens", 8192)),
                                max_length=sc.get("max_length"), on_overflow=sc.get("on_overflow", "error"),
                                dtype=sc.get("dtype", "float32"), device=self.device, progress=self.progress)
        msg = f"{len(res.manifest['checkpoints'])} averaged checkpoint(s) (window {window}) scored into {run / 'averaged'}"
        lineage = Path(ladder) / "data_lineage.json"
        if lineage.is_file():
            from .toy.dip import write_averaging_dip

            path = write_averaging_dip(run, run / "averaged", lineage, window_size=window)
            if path is not None:
                msg += f"; planted-dip depth raw vs averaged in {path}"
        return msg

    def do_dynamics(self) -> str:
        from .dynamics import compute_dynamics

        compute_dynamics(self.run)
        from .attribution import write_attribution

        att = write_attribution(self.run)  # data windows from data_lineage.json next to the checkpoints, if any
        return f"{self.run / 'dynamics'}" + (f" (attribution to windows of {att['lineage']})" if att else "")

    def do_shortlist(self) -> str:
        from .shortlist import shortlist

        res = shortlist(self.run, self.plan)
        if not res.selected:
            raise ProbeselectError(f"{self.run / 'shortlist.csv'}: no checkpoint passed the plan {self.plan}; nothing "
                                   "to pilot. See the reasons in shortlist.csv.")
        return "shortlisted " + ", ".join(res.selected)

    def do_lock(self) -> str:
        from .plan import lock_plan

        rec = lock_plan(self.plan, self.run, force="lock" in self.forced,
                        allow_weak=bool(self.sel_cfg.get("allow_weak", False)), recipe=self.pilot_cfg["recipe"],
                        recipe_overrides=list(self.pilot_cfg.get("overrides") or []))
        for w in rec.get("warnings", []):
            self.log(f"[run] lock: warning: {w}")
        return f"locked {self.plan} (sha256 {rec['plan_sha256'][:12]})" + (
            f"; {len(rec['warnings'])} warning(s)" if rec.get("warnings") else "")

    def _jobs(self, stage: str, cfg: dict) -> int | None:
        """``{stage}.jobs`` of the config: bases trained at once in worker processes (CPU, or one CUDA
        device shared). On another accelerator it does not apply (it changes no number, only how many
        processes train), so the stage trains one base at a time and says so."""
        jobs = cfg.get("jobs")
        if jobs is not None and jobs > 1:
            from .pilot import JOBS_DEVICES
            from .score import resolve_device

            dev = resolve_device(self.device)
            if dev.type not in JOBS_DEVICES:
                self.log(f"[run] {stage}: {stage}.jobs: {jobs} is for CPU and CUDA runs; on {dev} the bases train "
                         "one at a time (the numbers are the same)")
                return 1
        return jobs

    def do_pilot(self) -> str:
        from .confirm import _load_pilot_fn

        run = self.run
        jobs = self._jobs("pilot", self.pilot_cfg)
        _load_pilot_fn()(run / "shortlist.csv", self.pilot_cfg["recipe"], run / "pilot", progress=self.progress,
                         device=self.device, overrides=list(self.pilot_cfg.get("overrides") or []),
                         **({"jobs": jobs} if jobs is not None else {}))
        return f"{run / 'pilot'}"

    def do_select(self) -> str:
        from .select import select

        res = select(self.run, plan_path=self.plan, allow_post_hoc=bool(self.sel_cfg.get("allow_post_hoc", False)))
        return ("POST-HOC; " if res.post_hoc else "") + _select_summary(res.ranking)

    def _confirm_key(self) -> dict:
        """The confirmation's inputs: the selection, its config (``jobs`` changes no number) and recipe, and
        with ``references`` (order-free; ``[]`` = none) the files the naive choices are read from."""
        conf_cfg = self.conf_cfg
        key = {"selection": _hash_files([self.run / "selection.json"]),
               "confirm": conf_cfg and {k: v for k, v in conf_cfg.items() if k not in ("jobs", "references")},
               "recipe": _hash_files([Path(conf_cfg["recipe"])]) if conf_cfg else None}
        refs = sorted(set((conf_cfg or {}).get("references") or []))
        if refs:
            key["references"] = refs
            key["naive_from"] = _hash_files([self.run / "manifest.json", self.run / "summary.csv"])
        return key

    def do_confirm(self) -> str:
        from .confirm import confirm

        conf_cfg = self.conf_cfg
        res = confirm(self.run, conf_cfg["recipe"], top=int(conf_cfg.get("top", 2)),
                      overrides=conf_cfg.get("overrides") or [], progress=self.progress, device=self.device,
                      jobs=self._jobs("confirm", conf_cfg), references=conf_cfg.get("references") or ())
        return res.statement

    def do_replicate(self) -> str:
        from .replicate import replicate

        rc = self.rep_cfg or {}
        res = replicate(self.run, seeds=rc.get("seeds"), progress=self.progress, device=self.device,
                        jobs=self._jobs("replicate", rc))
        return res.statement

    def do_report(self) -> str:
        from .report import write_report

        paths_ = write_report(self.run)
        return f"{paths_.md}"

    # -- the stage table -----------------------------------------------------------------------
    def stages(self) -> list[_Stage]:
        """Every stage in order, with its inputs (hashed to decide whether it is up to date) and outputs."""
        files, ladder, sc, plan, hub = self.files, self.ladder, self.sc, self.plan, self.hub
        pilot_cfg, conf_cfg, avg_cfg = self.pilot_cfg, self.conf_cfg, self.avg_cfg
        pilot_out = files("pilot/transfer.csv", "pilot/transfer_items.parquet", "pilot/diagnostics.csv")
        return [
            _Stage("ladder", lambda: {"toy": self.toy}, lambda: [ladder / "ladder.json"], self.do_ladder,
                   enabled=self.toy is not None,
                   off_detail=(f"Hub revisions of {hub['repo']} (nothing to build)" if hub is not None
                               else f"existing ladder {ladder} (nothing to build)")),
            _Stage("score", lambda: {"ladder": _ladder_identity(self.ladder_source()),
                                     "probes": [s.to_dict() for s in _load_specs(sc, self.world_seed())],
                                     "specs": _hash_files(_spec_paths(sc)),
                                     "heldout": _hash_files([Path(sc["heldout"])]) if sc.get("heldout") else None,
                                     "config": {k: v for k, v in sc.items() if k != "probes"}},
                   lambda: files("summary.csv", "scores.parquet", "manifest.json"), self.do_score),
            _Stage("average", lambda: {"score": _hash_files(files("manifest.json")), "average": avg_cfg},
                   lambda: files("averaged/summary.csv", "averaged/scores.parquet"), self.do_average,
                   enabled=avg_cfg is not None,
                   off_detail=("`average:` not set (off unless configured; e.g. average: {window: 5})" if hub is None
                               else "Hub revisions: averaging needs a local ladder folder")),
            _Stage("dynamics", lambda: {**_hash_files(files("summary.csv", "scores.parquet")),
                                        "lineage": _hash_files([p]) if (p := _find_lineage(self.run)) else None},
                   lambda: files("dynamics/dynamics.csv"), self.do_dynamics),
            _Stage("lock", lambda: {}, lambda: files("plan.lock.json"), self.do_lock),
            _Stage("shortlist", lambda: {**_hash_files(files("summary.csv")), "plan": _hash_files([plan]),
                                         # stratify: data_windows and references: [window_ends] read it
                                         "lineage": _hash_files([p]) if (p := _find_lineage(self.run)) else None},
                   lambda: files("shortlist.csv", "shortlist.json"), self.do_shortlist),
            _Stage("pilot", lambda: {"shortlist": _hash_files(files("shortlist.csv")),
                                     "recipe": _hash_files([Path(pilot_cfg["recipe"])]),
                                     "overrides": pilot_cfg.get("overrides") or [], "device": self.device},
                   lambda: pilot_out, self.do_pilot),
            _Stage("select", lambda: {"inputs": _hash_files(files("plan.lock.json", "shortlist.csv") + pilot_out),
                                      "plan": _hash_files([plan]), "select": self.sel_cfg},
                   lambda: files("selection.json", "selection.csv"), self.do_select),
            _Stage("confirm", self._confirm_key, lambda: files("confirm.json"), self.do_confirm,
                   enabled=conf_cfg is not None),
            _Stage("replicate", lambda: {"confirm": _hash_files(files("selection.json", "confirm.json")),
                                         "seeds": (self.rep_cfg or {}).get("seeds")},
                   lambda: files("replicate.json"), self.do_replicate,
                   enabled=conf_cfg is not None and self.rep_cfg is not None,
                   off_detail="`replicate:` not set (off unless configured; e.g. replicate: {})"),
            _Stage("report", lambda: _hash_files(files("selection.json", "selection.csv", "confirm.json",
                                                       "replicate.json",
                                                       "shortlist.json", "shortlist.csv", "summary.csv",
                                                       "averaged/summary.csv", "dynamics/dynamics.csv",
                                                       "dynamics/attribution_families.csv",
                                                       "confirm/diagnostics.csv") + pilot_out),
                   lambda: files("report.md", "report.html"), self.do_report),
        ]


def _run_stages(stages, out: Path, run: Path, paths: dict, overrides, forced: set, plan: Path, log) -> RunResult:
    state = _load_state(out)
    state["config"] = {"path": paths["config"], "sha256": sha256_file(Path(paths["config"])),
                       "overrides": list(overrides)}
    result = RunResult(out_dir=out, run_dir=run)
    for st in stages:
        t0 = time.perf_counter()
        if not st.enabled:
            result.stages.append(StageResult(st.name, "off", 0.0, st.off_detail))
            continue
        rec = state["stages"].get(st.name)
        outs = st.outputs()
        if st.name == "lock":
            up_to_date = (run / "plan.lock.json").is_file()
            key = None
        else:
            key = canonical_json_hash(st.inputs())
            up_to_date = bool(rec and rec.get("inputs_hash") == key and all(p.is_file() for p in outs)
                              and rec.get("outputs") == _hash_files(outs))
        if up_to_date and st.name not in forced:
            detail = "up to date"
            if st.name == "lock":
                from .plan import check_lock

                reasons = check_lock(run, plan).reasons
                detail = "lock exists" + (f"; selection will be POST-HOC: {'; '.join(reasons)}" if reasons else "")
            result.stages.append(StageResult(st.name, "skipped", time.perf_counter() - t0, detail))
            log(f"[run] {st.name}: skipped ({detail})")
            continue
        log(f"[run] {st.name}: running")
        detail = st.run()
        if key is None:
            key = canonical_json_hash(st.inputs())
        secs = time.perf_counter() - t0
        state["stages"][st.name] = {"inputs_hash": key, "outputs": _hash_files(outs), "seconds": round(secs, 2),
                                    "completed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "detail": detail}
        atomic_write_json(_state_path(out), state)
        result.stages.append(StageResult(st.name, "ran", secs, detail))
        log(f"[run] {st.name}: done in {secs:.1f}s: {detail}")
    result.report = run / "report.md"
    return result
