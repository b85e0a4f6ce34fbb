"""Guards shared by scoring, the pilot and selection: nonfinite weights and values, and a
tokenizer larger than the model's embedding matrix.

* :func:`nonfinite_params` lists the parameters of a loaded model holding NaN or inf;
  :func:`note_nonfinite_weights` (called by :func:`probeselect.score.load_model`) warns
  once per checkpoint and remembers it for :func:`nonfinite_checkpoints`, which a score run
  records in its manifest (``nonfinite``) and the report flags.
* :func:`check_vocab`: a tokenizer with more ids than the embedding matrix has rows makes
  any of the extra ids an out-of-range lookup (a crash on CPU, undefined memory on GPU). It
  is an error when an extra id occurs in the encoded data (or is the pad/EOS id), and a
  warning, stating that the extra ids never occur in the data, otherwise.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger(__name__)

#: checkpoint path -> names of parameters with nonfinite values, for every model loaded in this process.
_NONFINITE_WEIGHTS: dict[str, list[str]] = {}


def nonfinite_params(model) -> list[str]:
    """Names of the model's parameters (and buffers of float type) that hold a NaN or inf."""
    import torch

    bad = []
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.is_floating_point() and not bool(torch.isfinite(p).all()):
                bad.append(name)
    return bad


def note_nonfinite_weights(model, path) -> list[str]:
    """Check a freshly loaded model; warn (naming the checkpoint and tensors) and remember it."""
    bad = nonfinite_params(model)
    key = str(Path(path))
    if bad:
        _NONFINITE_WEIGHTS[key] = bad
        log.warning("%s: %d weight tensor(s) hold NaN/inf values (e.g. %s); every score or training step of this "
                    "checkpoint is invalid. Re-copy or re-save it.", path, len(bad), bad[0])
    else:
        _NONFINITE_WEIGHTS.pop(key, None)
    return bad


def nonfinite_weights_of(path) -> list[str]:
    return list(_NONFINITE_WEIGHTS.get(str(Path(path)), []))


def nonfinite_checkpoints(scores, ckpts: Iterable[Any]) -> list[dict[str, Any]]:
    """Checkpoints of a score run with nonfinite weights (seen when loaded in this process) or
    nonfinite scores (any numeric column of ``scores``). Warns once per checkpoint; returns
    ``[{checkpoint, weights: [tensor names], nonfinite_scores: n rows}]`` for the manifest."""
    import numpy as np

    out = []
    bad_rows: dict[str, int] = {}
    cols = [c for c in _SCORE_VALUES if scores is not None and c in getattr(scores, "columns", ())]
    if cols and len(scores) and "checkpoint" in scores.columns:
        vals = scores[cols].astype(float).to_numpy()
        mask = (~np.isfinite(vals)).any(axis=1)
        if mask.any():
            bad_rows = scores.loc[mask, "checkpoint"].astype(str).value_counts().to_dict()
    for c in ckpts:
        name, path = getattr(c, "name", str(c)), getattr(c, "path", c)
        weights = nonfinite_weights_of(path)
        n = int(bad_rows.get(name, 0))
        if weights or n:
            out.append({"checkpoint": name, "weights": weights[:10], "n_weights": len(weights), "nonfinite_scores": n})
            if n:
                log.warning("%s: %d score row(s) are NaN/inf%s; its summary values are invalid, not comparable.",
                            name, n, " (its weights hold NaN/inf)" if weights else "")
    return out


#: Per-item score values computed from log-probabilities: NaN/inf in any of them is a broken forward pass.
_SCORE_VALUES = ("task_logprob", "shortcut_logprob", "margin", "margin_per_token")


def nonfinite_values(df, column: str = "value") -> Any:
    """Rows of ``df`` whose ``column`` is NaN or +-inf."""
    import numpy as np

    v = df[column].astype(float).to_numpy()
    return df[~np.isfinite(v)]


def check_vocab(tokenizer, model_path, data: dict[str, Iterable[Any]], *, error_cls: type[Exception]) -> str | None:
    """Refuse a tokenizer whose ids reach past the model's embedding matrix.

    ``data``: ``{source: encoded examples}`` (objects with ``input_ids``). Returns a warning
    text (also logged) when the tokenizer is larger but no extra id occurs in the data, the
    pad id or the EOS id; raises ``error_cls`` naming the example when one does.
    """
    cfg_path = Path(model_path) / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    n_emb = cfg.get("vocab_size")
    if n_emb is None and isinstance(cfg.get("text_config"), dict):
        n_emb = cfg["text_config"].get("vocab_size")
    if not isinstance(n_emb, int) or n_emb <= 0:
        return None
    n_tok = len(tokenizer)
    if n_tok <= n_emb:
        return None
    special = {"pad": tokenizer.pad_token_id, "EOS": tokenizer.eos_token_id}
    for what, tid in special.items():
        if tid is not None and tid >= n_emb:
            raise error_cls(f"{model_path}: the tokenizer has {n_tok} tokens but the model's embedding matrix has "
                            f"{n_emb} rows (config.json vocab_size), and its {what} id {tid} is past the last row. "
                            "Resize the embeddings (model.resize_token_embeddings) and re-save, or use the tokenizer "
                            "the model was trained with.")
    for source, examples in data.items():
        for e in examples:
            over = [t for t in e.input_ids if t >= n_emb]
            if over:
                raise error_cls(f"{source}: example {e.id} uses token id {over[0]}, but the model {model_path} has "
                                f"only {n_emb} embedding rows (its tokenizer has {n_tok} tokens). Resize the "
                                "embeddings (model.resize_token_embeddings) and re-save, or use the tokenizer the "
                                "model was trained with.")
    msg = (f"{model_path}: the tokenizer has {n_tok} tokens but the embedding matrix only {n_emb} rows; the "
           f"{n_tok - n_emb} extra id(s) never occur in the encoded SFT data ({', '.join(data)}) nor as pad/EOS, "
           "so training proceeds. A generated extra id would be out of range.")
    log.warning("%s", msg)
    return msg


def all_finite(values: Iterable[float]) -> bool:
    return all(v is not None and math.isfinite(float(v)) for v in values)
