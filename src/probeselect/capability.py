"""Held-out negative log-likelihood in bits per byte (a general capability measure).

Each document is scored in full, the way lm-evaluation-harness scores
``loglikelihood_rolling`` requests (the perplexity tasks, e.g. wikitext):

* the document's tokens are ``tokenizer.encode(text, add_special_tokens=False)``, and a
  single *prefix token* -- the tokenizer's BOS token, or EOS when it has none (lm-eval's
  ``HFLM.prefix_token_id``) -- is the first context, so the first document token is
  scored too. The prefix token itself is never scored, and BOS is never doubled (with a
  tokenizer that adds BOS, lm-eval's default ``add_bos_token=None`` would encode BOS
  *and* prepend the prefix token; this module matches lm-eval run with
  ``add_bos_token=False``, whose prefix token is BOS);
* every document token is scored exactly once, in windows of at most ``max_length``
  model inputs (default: the config's ``max_position_embeddings``). The first window
  reads ``[prefix] + tokens[:max_length-1]`` and scores ``tokens[:max_length]``; every
  later window scores the next ``stride`` tokens (fewer in the last one) and reads the
  ``max_length`` tokens that end just before its last target as context.

With ``stride == max_length`` (the default) the windows are lm-eval's disjoint rolling
windows -- including its last window, which re-reads a full ``max_length`` of context
for its few remaining tokens -- so the per-document log-likelihoods equal
``HFLM(..., add_bos_token=False).loglikelihood_rolling``. With ``stride < max_length``
each window after the first re-reads ``max_length - stride`` or more tokens of context and
scores only its new tokens: the strided scheme of the Hugging Face guide "Perplexity of
fixed-length models" (more context per token, more compute).

Bits per byte = total NLL in nats / ln 2 / total UTF-8 bytes of the documents, so
checkpoints with different tokenizers are comparable (lm-eval's ``bits_per_byte``).

The LM head is applied only at scored positions (decoder hidden states -> output
embeddings, as in :mod:`probeselect.spans`), log-softmax is taken in float32, and
windows of all documents are batched together, longest first.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from ._io import reading
from .errors import ProbeSpecError, ScoringError
from .spans import _head_only_supported, _model_max_length, _score_targets

__all__ = [
    "NllResult",
    "heldout_nll",
    "load_heldout_texts",
    "rolling_loglikelihoods",
    "rolling_windows",
]


# ---------------------------------------------------------------------------
# Loading held-out text
# ---------------------------------------------------------------------------


def load_heldout_texts(path: str | Path) -> list[str]:
    """Load held-out documents from ``path``.

    * ``.txt``: one document per non-blank line (the line without its line break;
      whitespace-only lines are skipped). Line breaks are not part of any document, so
      they count neither as tokens nor as bytes.
    * ``.jsonl``: one JSON object per non-blank line with a string field ``text``.
    * a local ``datasets`` folder (``Dataset.save_to_disk``; a ``DatasetDict`` must have
      exactly one split) with a string column ``text``.

    Empty ``text`` values are skipped (they contain no bytes to predict). Raises
    :class:`ProbeSpecError` naming the file for a missing file, an unsupported format,
    a missing or non-string ``text`` field and a file with no documents.
    """
    path = Path(path)
    if not path.exists():
        raise ProbeSpecError(f"{path}: held-out text file not found.")
    if path.is_dir():
        texts = _load_datasets_folder(path)
    elif path.suffix.lower() == ".txt":
        with reading(path, ProbeSpecError), open(path, encoding="utf-8") as f:
            texts = [ln.rstrip("\r\n") for ln in f]
        texts = [t for t in texts if t.strip()]
    elif path.suffix.lower() == ".jsonl":
        with reading(path, ProbeSpecError):
            texts = _load_jsonl(path)
    else:
        raise ProbeSpecError(
            f"{path}: unsupported held-out text format {path.suffix or '(no suffix)'!r}; use a .txt file "
            "(one document per line), a .jsonl file (field `text`) or a `datasets` folder (column `text`)."
        )
    if not texts:
        raise ProbeSpecError(f"{path}: no held-out documents (the file has no non-empty text).")
    return texts


def _load_jsonl(path: Path) -> list[str]:
    texts = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProbeSpecError(f"{path}:{lineno}: invalid JSON ({exc.msg}).") from None
            if not isinstance(row, dict) or "text" not in row:
                raise ProbeSpecError(f"{path}:{lineno}: missing field `text` (each line must be an object with a `text` string).")
            if not isinstance(row["text"], str):
                raise ProbeSpecError(f"{path}:{lineno}: field `text` must be a string, got {type(row['text']).__name__}.")
            if row["text"]:
                texts.append(row["text"])
    return texts


def _load_datasets_folder(path: Path) -> list[str]:
    try:
        from datasets import DatasetDict, load_from_disk
    except ImportError:  # pragma: no cover - datasets ships with lm-eval
        raise ProbeSpecError(f"{path}: is a folder; reading a `datasets` folder needs `pip install datasets`.") from None
    try:
        ds = load_from_disk(str(path))
    except Exception as exc:  # datasets raises several types
        raise ProbeSpecError(
            f"{path}: not a `datasets` folder saved with save_to_disk ({type(exc).__name__}: {exc}). "
            "Use a .txt or .jsonl file, or a saved Dataset."
        ) from None
    if isinstance(ds, DatasetDict):
        if len(ds) != 1:
            raise ProbeSpecError(f"{path}: a DatasetDict with splits {sorted(ds)}; save the one split to score as a Dataset.")
        ds = next(iter(ds.values()))
    if "text" not in ds.column_names:
        raise ProbeSpecError(f"{path}: missing column `text` (columns: {ds.column_names}).")
    texts = ds["text"]
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ProbeSpecError(f"{path}: row {bad}: column `text` must be a string, got {type(texts[bad]).__name__}.")
    return [t for t in texts if t]


# ---------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------


def rolling_windows(n_tokens: int, max_length: int, stride: int | None = None) -> list[tuple[int, int, int]]:
    """The windows that score a document of ``n_tokens`` tokens.

    Positions refer to ``seq = [prefix] + tokens`` (so ``seq[j]`` is token ``j - 1``).
    Each window is ``(start, end, n_new)``: the model reads ``seq[start:end]``
    (``end - start <= max_length``) and its last ``n_new`` positions score the targets
    ``seq[end - n_new + 1 : end + 1]``. The targets of all windows are
    ``seq[1 : n_tokens + 1]``, each exactly once, in order.
    """
    stride = max_length if stride is None else stride
    if not (isinstance(max_length, int) and max_length >= 1):
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    if not (isinstance(stride, int) and 1 <= stride <= max_length):
        raise ValueError(f"stride must be an integer in [1, max_length={max_length}], got {stride!r}")
    if n_tokens <= 0:
        return []
    end = min(max_length, n_tokens)
    windows = [(0, end, end)]
    while end < n_tokens:
        new_end = min(end + stride, n_tokens)
        windows.append((max(0, new_end - max_length), new_end, new_end - end))
        end = new_end
    return windows


def _prefix_token_id(tokenizer) -> int:
    for attr in ("bos_token_id", "eos_token_id"):
        val = getattr(tokenizer, attr, None)
        if val is not None:
            return int(val)
    raise ScoringError(
        "the tokenizer has neither a BOS nor an EOS token; held-out NLL needs one as the prefix token "
        "that conditions the first document token."
    )


# ---------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NllResult:
    """Held-out NLL of a set of documents.

    ``bits_per_byte`` = ``total_nats / ln 2 / n_bytes``; ``nats_per_token`` =
    ``total_nats / n_tokens`` (tokenizer-dependent, for reference); ``total_nats`` is the
    summed negative log-likelihood of every document token; ``n_bytes`` the total UTF-8
    bytes of the documents; ``n_docs`` the number of documents.
    """

    bits_per_byte: float
    nats_per_token: float
    total_nats: float
    n_tokens: int
    n_bytes: int
    n_docs: int

    def to_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def rolling_loglikelihoods(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    device: torch.device | str | None = None,
    progress=None,
) -> tuple[list[float], list[int]]:
    """Per-document log-likelihood (nats) and token count of every document in ``texts``.

    See the module docstring for the tokenization and windowing convention. An empty
    document has log-likelihood 0 and 0 tokens (as in lm-eval). ``progress``, if given,
    is updated with the number of windows done.
    """
    if device is None:
        device = next(model.parameters()).device
    max_length = max_length or _model_max_length(model)
    stride = max_length if stride is None else stride
    if not (isinstance(stride, int) and 1 <= stride <= max_length):
        raise ScoringError(f"stride must be an integer in [1, max_length={max_length}], got {stride!r}.")
    if batch_size < 1:
        raise ScoringError(f"batch_size must be >= 1, got {batch_size!r}.")
    prefix = _prefix_token_id(tokenizer)
    head_only = _head_only_supported(model)
    pad_id = getattr(model.config, "pad_token_id", None)
    pad_id = 0 if pad_id is None else int(pad_id)

    seqs: list[list[int]] = []
    # (doc index, input ids, n_new targets at the end)
    windows: list[tuple[int, list[int], list[int]]] = []
    for d, text in enumerate(texts):
        if not isinstance(text, str):
            raise ScoringError(f"document {d}: expected a string, got {type(text).__name__}.")
        seq = [prefix] + list(tokenizer.encode(text, add_special_tokens=False))
        seqs.append(seq)
        for start, end, n_new in rolling_windows(len(seq) - 1, max_length, stride):
            windows.append((d, seq[start:end], seq[end - n_new + 1 : end + 1]))

    totals = [0.0] * len(texts)
    if progress is not None and getattr(progress, "total", 0) is None:  # a bar created before the windows were known
        progress.total = len(windows)
        progress.refresh()
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i][1]))
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        token_lp, _ = _score_targets(model, [windows[i][1:] for i in idx], pad_id, device, head_only)
        token_lp = token_lp.double().cpu()
        offset = 0
        for i in idx:
            n = len(windows[i][2])
            totals[windows[i][0]] += float(token_lp[offset : offset + n].sum())
            offset += n
        if progress is not None:
            progress.update(len(idx))
    return totals, [len(s) - 1 for s in seqs]


def heldout_nll(
    model,
    tokenizer,
    texts: Sequence[str],
    *,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    device: torch.device | str | None = None,
    progress=None,
) -> NllResult:
    """Held-out NLL of ``texts`` (scored in full, rolling windows; see the module docstring).

    ``max_length`` defaults to the model config's context length; ``stride`` defaults
    to ``max_length`` (disjoint windows, identical to lm-eval's ``loglikelihood_rolling``
    with ``add_bos_token=False``). ``batch_size`` counts windows per forward pass.
    """
    texts = list(texts)
    if not texts:
        raise ScoringError("held-out NLL: no documents to score.")
    lls, ntoks = rolling_loglikelihoods(
        model, tokenizer, texts, max_length=max_length, stride=stride, batch_size=batch_size,
        device=device, progress=progress,
    )
    total_nats = -math.fsum(lls)
    n_tokens = sum(ntoks)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    if n_bytes == 0:
        raise ScoringError("held-out NLL: every document is empty (0 bytes to predict).")
    return NllResult(
        bits_per_byte=total_nats / math.log(2) / n_bytes,
        nats_per_token=total_nats / n_tokens,
        total_nats=total_nats,
        n_tokens=n_tokens,
        n_bytes=n_bytes,
        n_docs=len(texts),
    )
