"""SFT recipes: one YAML file declares data, masking, budget, optimizer, method, seeds,
eval cadence, diagnostics and the transfer suite. ``load_recipe`` validates it strictly
(unknown keys, wrong types and missing files are errors naming the file and the fix) and
applies ``key=value`` overrides (dotted keys, YAML-parsed values).

Relative paths in a recipe resolve against the current working directory.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence


from .._io import canonical_json_hash
from .._yaml import apply_dotted_overrides, load_yaml
from ..errors import RecipeError, did_you_mean

__all__ = ["Recipe", "OptimizerConfig", "MethodConfig", "load_recipe", "recipe_from_dict", "apply_overrides",
           "training_view"]

# Defaults for optional keys; a key absent here and from the file is required.
_DEFAULTS: dict[str, Any] = {
    "data": {"chat_template": None, "max_length": 512},
    "masking": {"loss_on": "response"},
    "optimizer": {
        "betas": [0.9, 0.999],
        "eps": 1.0e-8,
        "weight_decay": 0.0,
        "warmup_steps": 0,
        "schedule": "cosine",
        "min_lr_ratio": 0.0,
        "clip": {"rule": "global_norm", "max_norm": 1.0},
        "grad_accum": 1,
    },
    "method": {"type": "lora"},
    "eval": {"every": 0, "max_items": 256},
    "diagnostics": {"spike_window": 201, "spike_threshold": 0.1, "spike_min_history": 10, "spike_z": 6.0,
                    "nonfinite": "fail"},
    "checkpointing": {"every": 0, "keep": 2},
    "precision": "fp32",
    "transfer": {},
}
# target_modules: every linear layer of the attention and MLP blocks (peft's "all-linear"; see sft/lora.py)
_LORA_DEFAULTS = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}

_SECTIONS = {
    "name": None,
    "data": {"train", "chat_template", "max_length"},
    "masking": {"loss_on"},
    "budget": {"optimizer_steps", "supervised_tokens"},
    "optimizer": {"lr", "betas", "eps", "weight_decay", "warmup_steps", "schedule", "min_lr_ratio", "clip",
                  "micro_batch_size", "grad_accum"},
    "method": {"type", "r", "alpha", "dropout", "target_modules"},
    "seeds": None,
    "eval": {"every", "max_items"},
    "diagnostics": {"spike_window", "spike_threshold", "spike_min_history", "spike_z", "nonfinite"},
    "checkpointing": {"every", "keep"},
    "precision": None,
    "transfer": None,  # validated by probeselect.transfer
    "batch_seeds": None,  # execution strategy, not part of the recipe hash (see Recipe.batch_seeds)
}


def training_view(raw: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved recipe that determines the trained weights of one (base, seed) run.

    Included: ``data`` (chat template, max_length; not the ``train`` path - the data bytes
    are pinned by the data manifest's sha256), ``masking``, ``budget``, ``optimizer``,
    ``method``, ``precision`` and ``diagnostics.nonfinite`` (skip mode changes the
    updates applied). Excluded: ``name``, the ``seeds`` list (each run's own seed is in its
    data manifest), ``eval``, the spike settings, ``checkpointing`` and ``transfer``:
    changing those never requires retraining.
    """
    data = {k: v for k, v in raw["data"].items() if k != "train"}
    return {"data": data, "masking": raw["masking"], "budget": raw["budget"], "optimizer": raw["optimizer"],
            "method": raw["method"], "precision": raw["precision"],
            "nonfinite": raw["diagnostics"]["nonfinite"]}


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW settings; ``max_norm`` is the global-norm clip threshold tau (None = no clipping)."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    warmup_steps: int
    schedule: str
    min_lr_ratio: float
    clip_rule: str
    max_norm: float | None
    micro_batch_size: int
    grad_accum: int

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer step, over all processes."""
        return self.micro_batch_size * self.grad_accum


@dataclass(frozen=True)
class MethodConfig:
    type: str  # "lora" | "full"
    r: int | None = None
    alpha: float | None = None
    dropout: float | None = None
    target_modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    """A validated recipe. ``raw`` is the resolved dict (defaults filled, overrides applied);
    ``sha256`` is its canonical hash (recorded everywhere); ``train_sha256`` hashes only the
    training-relevant sections (:func:`training_view`) and keys data manifests, full states
    and finished runs, so changing eval/transfer settings re-evaluates without retraining."""

    raw: dict[str, Any]
    sha256: str
    name: str
    train_path: Path
    chat_template: str | None
    max_length: int
    loss_on: str
    optimizer_steps: int | None
    supervised_tokens: int | None
    optimizer: OptimizerConfig
    method: MethodConfig
    seeds: tuple[int, ...]
    eval_every: int
    eval_max_items: int
    spike_window: int
    spike_threshold: float
    spike_min_history: int
    spike_z: float  # a spike exceeds the rolling median by > max(spike_threshold, spike_z x the run's step noise)
    nonfinite: str
    checkpoint_every: int
    checkpoint_keep: int
    precision: str
    transfer: dict[str, Any] = field(default_factory=dict)
    source: str = "<recipe>"
    # Train the seeds of one LoRA base together (probeselect.sft.batched); None = the default (True for
    # LoRA). An execution strategy like the device: kept out of ``raw`` and of both hashes, so a recipe
    # file without the key (recipes/pilot.yaml) hashes as before and states resume across the two paths.
    batch_seeds: bool | None = None

    @property
    def batch_seeds_effective(self) -> bool:
        """Whether LoRA seeds of one base are batched (the recipe key, default True for LoRA; never for full)."""
        return self.method.type == "lora" and self.batch_seeds is not False

    @property
    def train_sha256(self) -> str:
        return canonical_json_hash(training_view(self.raw))


def _merge(defaults: dict, given: dict) -> dict:
    out = copy.deepcopy(defaults)
    for k, v in given.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "transfer":
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


#: Recipe keys whose override value is a path or free text, taken literally (not parsed as YAML).
PATH_KEYS = frozenset({"data.train", "data.chat_template", "transfer.tasks", "transfer.robustness",
                       "transfer.heldout", "name"})


def apply_overrides(raw: dict, overrides: Sequence[str], *, source: str = "<recipe>") -> dict:
    """Return a copy of ``raw`` with ``a.b=value`` overrides applied (values parsed as YAML,
    except the paths of :data:`PATH_KEYS`, taken literally)."""
    return apply_dotted_overrides(
        raw, overrides, top_keys=_SECTIONS, error_cls=RecipeError, example="optimizer.lr=1e-3", path_keys=PATH_KEYS,
        unknown_key_message=lambda ov, top: (f"override {ov!r}: unknown recipe key {top!r}."
                                             f"{did_you_mean(top, _SECTIONS)} Known keys: {', '.join(_SECTIONS)}."))


def _err(src: str, where: str, msg: str) -> RecipeError:
    return RecipeError(f"{src}: {where}: {msg}")


def _int(src, where, v, *, minimum=None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _err(src, where, f"expected an integer, got {v!r}.")
    if minimum is not None and v < minimum:
        raise _err(src, where, f"must be >= {minimum}, got {v}.")
    return v


def _float(src, where, v, *, minimum=None, positive=False) -> float:
    if isinstance(v, str):  # YAML 1.1 reads 5e-4 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise _err(src, where, f"expected a finite number, got {v!r}.")
    v = float(v)
    if positive and v <= 0:
        raise _err(src, where, f"must be > 0, got {v}.")
    if minimum is not None and v < minimum:
        raise _err(src, where, f"must be >= {minimum}, got {v}.")
    return v


def _choice(src, where, v, choices) -> str:
    if v not in choices:
        raise _err(src, where, f"{v!r} is not one of {', '.join(choices)}.{did_you_mean(str(v), choices)}")
    return v


def _check_keys(src: str, section: str, value: Any, allowed: set[str]) -> dict:
    if not isinstance(value, dict):
        raise _err(src, section, f"expected a mapping, got {type(value).__name__}.")
    for k in value:
        if k not in allowed:
            raise _err(src, section, f"unknown key {k!r}.{did_you_mean(str(k), allowed)} "
                                     f"Allowed: {', '.join(sorted(allowed))}.")
    return value


def recipe_from_dict(given: Any, *, source: str = "<recipe>", check_files: bool = True) -> Recipe:
    """Validate a recipe mapping (as read from YAML, overrides applied) into a :class:`Recipe`.

    Checks run in section order and the first problem is raised: the keys, then ``name``,
    ``data`` and ``masking``, ``budget``, ``optimizer``, ``method``, ``seeds``, ``transfer``
    and ``eval``, the diagnostics, checkpointing and precision values; the data file last.
    """
    src = source
    _check_sections(given, src)
    raw, batch_seeds = _with_defaults(given, src)
    name = raw["name"]
    if not isinstance(name, str) or not name:
        raise _err(src, "name", "expected a non-empty string.")
    data = _parse_data(src, raw)
    steps, sup = _parse_budget(src, raw["budget"])
    opt = _parse_optimizer(src, raw["optimizer"])
    method = _parse_method(src, raw["method"])
    seeds = _parse_seeds(src, raw["seeds"])
    transfer, eval_every = _parse_transfer_and_eval(src, raw)
    ev, dg, ck = raw["eval"], raw["diagnostics"], raw["checkpointing"]
    recipe = Recipe(
        raw=raw,
        sha256=canonical_json_hash(raw),
        name=name,
        train_path=data.train_path,
        chat_template=data.chat_template,
        max_length=data.max_length,
        loss_on=data.loss_on,
        optimizer_steps=steps,
        supervised_tokens=sup,
        optimizer=opt,
        method=method,
        seeds=seeds,
        eval_every=eval_every,
        eval_max_items=_int(src, "eval.max_items", ev["max_items"], minimum=1),
        spike_window=_int(src, "diagnostics.spike_window", dg["spike_window"], minimum=1),
        spike_threshold=_float(src, "diagnostics.spike_threshold", dg["spike_threshold"], minimum=0.0),
        spike_min_history=_int(src, "diagnostics.spike_min_history", dg["spike_min_history"], minimum=1),
        spike_z=_float(src, "diagnostics.spike_z", dg["spike_z"], minimum=0.0),
        nonfinite=_choice(src, "diagnostics.nonfinite", dg["nonfinite"], ("fail", "skip")),
        checkpoint_every=_int(src, "checkpointing.every", ck["every"], minimum=0),
        checkpoint_keep=_int(src, "checkpointing.keep", ck["keep"], minimum=1),
        precision=_choice(src, "precision", raw["precision"], ("fp32", "bf16", "fp16")),
        transfer=transfer,
        source=src,
        batch_seeds=batch_seeds,
    )
    # Files last: every typo in the recipe is reported before a missing data file.
    if check_files and not data.train_path.exists():
        raise _err(src, "data.train", f"file not found: {data.train_path} (relative paths resolve against the "
                                      "current directory). Build the data, e.g. `probeselect toy-ladder "
                                      "results/demo/ladder`, or override data.train=PATH.")
    return recipe


def _check_sections(given: Any, src: str) -> None:
    """A mapping of known top-level keys, the required ones present, each section's keys known."""
    if not isinstance(given, dict):
        raise RecipeError(f"{src}: a recipe must be a YAML mapping with keys {', '.join(_SECTIONS)}.")
    for k in given:
        if k not in _SECTIONS:
            raise RecipeError(f"{src}: unknown top-level key {k!r}.{did_you_mean(str(k), _SECTIONS)} "
                              f"Allowed: {', '.join(_SECTIONS)}.")
    for k in ("name", "data", "budget", "optimizer", "seeds"):
        if k not in given:
            raise RecipeError(f"{src}: missing required key {k!r}. See recipes/pilot.yaml for a complete example.")
    for sec, allowed in _SECTIONS.items():
        if allowed is not None and sec in given:
            _check_keys(src, sec, given[sec], allowed)


def _with_defaults(given: dict, src: str) -> tuple[dict, bool | None]:
    """The recipe with the defaults (and LoRA's) filled in, and ``batch_seeds`` taken out of it."""
    given = dict(given)
    batch_seeds = given.pop("batch_seeds", None)
    if batch_seeds is not None and not isinstance(batch_seeds, bool):
        raise _err(src, "batch_seeds", f"expected true, false or null (the default: true for LoRA), got "
                                       f"{batch_seeds!r}.")
    raw = _merge(_DEFAULTS, given)
    if raw["method"].get("type", "lora") == "lora":
        raw["method"] = _merge(_LORA_DEFAULTS, raw["method"])
    return raw, batch_seeds


class _Data(NamedTuple):
    train_path: Path
    chat_template: str | None
    max_length: int
    loss_on: str


def _parse_data(src: str, raw: dict) -> _Data:
    """``data`` (the train path resolved, not yet checked on disk) and ``masking.loss_on``."""
    d = raw["data"]
    if "train" not in d or not isinstance(d["train"], str) or not d["train"]:
        raise _err(src, "data.train", "required: path to a JSONL, parquet or saved datasets folder.")
    train_path = Path(d["train"]).expanduser().resolve()
    if d["chat_template"] is not None and not isinstance(d["chat_template"], str):
        raise _err(src, "data.chat_template", "expected a Jinja template string or null.")
    max_length = _int(src, "data.max_length", d["max_length"], minimum=2)
    loss_on = _choice(src, "masking.loss_on", raw["masking"]["loss_on"], ("response", "all"))
    return _Data(train_path, d["chat_template"], max_length, loss_on)


def _parse_budget(src: str, b: dict) -> tuple[int | None, int | None]:
    """``budget``: (optimizer_steps, supervised_tokens), exactly one of them set."""
    if len(b) != 1:
        raise _err(src, "budget", "give exactly one of optimizer_steps or supervised_tokens.")
    steps = _int(src, "budget.optimizer_steps", b["optimizer_steps"], minimum=1) if "optimizer_steps" in b else None
    sup = _int(src, "budget.supervised_tokens", b["supervised_tokens"], minimum=1) if "supervised_tokens" in b else None
    return steps, sup


def _parse_optimizer(src: str, o: dict) -> OptimizerConfig:
    for req in ("lr", "micro_batch_size"):
        if req not in o:
            raise _err(src, f"optimizer.{req}", "required.")
    betas = o["betas"]
    if not (isinstance(betas, list) and len(betas) == 2):
        raise _err(src, "optimizer.betas", f"expected [beta1, beta2], got {betas!r}.")
    betas_t = tuple(_float(src, "optimizer.betas", x, minimum=0.0) for x in betas)
    if any(x >= 1 for x in betas_t):
        raise _err(src, "optimizer.betas", "each beta must be < 1.")
    clip = _check_keys(src, "optimizer.clip", o["clip"], {"rule", "max_norm"})
    clip_rule = _choice(src, "optimizer.clip.rule", clip.get("rule", "global_norm"), ("global_norm",))
    max_norm = clip.get("max_norm")
    max_norm = None if max_norm is None else _float(src, "optimizer.clip.max_norm", max_norm, positive=True)
    return OptimizerConfig(
        lr=_float(src, "optimizer.lr", o["lr"], positive=True),
        betas=betas_t,  # type: ignore[arg-type]
        eps=_float(src, "optimizer.eps", o["eps"], positive=True),
        weight_decay=_float(src, "optimizer.weight_decay", o["weight_decay"], minimum=0.0),
        warmup_steps=_int(src, "optimizer.warmup_steps", o["warmup_steps"], minimum=0),
        schedule=_choice(src, "optimizer.schedule", o["schedule"], ("cosine", "linear", "constant")),
        min_lr_ratio=_float(src, "optimizer.min_lr_ratio", o["min_lr_ratio"], minimum=0.0),
        clip_rule=clip_rule,
        max_norm=max_norm,
        micro_batch_size=_int(src, "optimizer.micro_batch_size", o["micro_batch_size"], minimum=1),
        grad_accum=_int(src, "optimizer.grad_accum", o["grad_accum"], minimum=1),
    )


def _parse_method(src: str, m: dict) -> MethodConfig:
    mtype = _choice(src, "method.type", m.get("type"), ("lora", "full"))
    if mtype == "lora":
        tm = m["target_modules"]
        if tm == "all-linear":
            tm = [tm]
        if not (isinstance(tm, list) and tm and all(isinstance(x, str) and x for x in tm)):
            raise _err(src, "method.target_modules", "expected `all-linear` (every linear layer of the attention and "
                       "MLP blocks, the default) or a non-empty list of module names, e.g. [q_proj, v_proj] "
                       "(Llama), [c_attn] (GPT-2), [query_key_value] (GPT-NeoX).")
        method = MethodConfig("lora", r=_int(src, "method.r", m["r"], minimum=1),
                              alpha=_float(src, "method.alpha", m["alpha"], positive=True),
                              dropout=_float(src, "method.dropout", m["dropout"], minimum=0.0), target_modules=tuple(tm))
        if method.dropout >= 1:
            raise _err(src, "method.dropout", "must be < 1.")
        return method
    extra = sorted(set(m) - {"type"})
    if extra:
        raise _err(src, "method", f"keys {extra} apply to LoRA only; remove them for type: full.")
    return MethodConfig("full")


def _parse_seeds(src: str, seeds: Any) -> tuple[int, ...]:
    if not (isinstance(seeds, list) and seeds) or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise _err(src, "seeds", f"expected a non-empty list of integers, got {seeds!r}.")
    if len(set(seeds)) != len(seeds):
        raise _err(src, "seeds", f"duplicate seeds in {seeds}.")
    return tuple(seeds)


def _parse_transfer_and_eval(src: str, raw: dict) -> tuple[dict, int]:
    """``transfer`` (null read as ``{}``, written back into ``raw`` before it is hashed; its keys and
    types checked now, its files by the pilot) and ``eval.every``, which needs ``transfer.heldout``."""
    transfer = raw["transfer"]
    if transfer is None:
        transfer = raw["transfer"] = {}
    if not isinstance(transfer, dict):
        raise _err(src, "transfer", "expected a mapping (tasks, robustness, heldout, max_new_tokens, ...).")
    eval_every = _int(src, "eval.every", raw["eval"]["every"], minimum=0)
    if eval_every and not transfer.get("heldout"):
        raise _err(src, "eval.every", "periodic held-out loss needs transfer.heldout (held-out SFT rows); "
                                      "set it or use eval.every=0.")
    if transfer:
        from ..transfer import validate_transfer_config

        validate_transfer_config(transfer, source=src)
    return transfer, eval_every


def load_recipe(path: str | Path, overrides: Sequence[str] = (), *, check_files: bool = True) -> Recipe:
    """Load, override and validate the recipe at ``path``."""
    path = Path(path)
    raw = load_yaml(path, RecipeError)
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping; see recipes/pilot.yaml.")
    src = str(path) + (f" (with overrides {' '.join(overrides)})" if overrides else "")
    return recipe_from_dict(apply_overrides(raw, overrides, source=src), source=src, check_files=check_files)
