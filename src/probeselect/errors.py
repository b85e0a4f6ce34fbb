"""Errors that probeselect raises for bad input.

Every error names the offending file or object and says how to fix it. The CLI prints
these as one-line messages (no traceback); other exceptions are real bugs and keep
their traceback.
"""


class ProbeselectError(Exception):
    """Base class for user-facing errors (bad input, bad configuration)."""


class UsageError(ProbeselectError):
    """A command-line flag or argument has an invalid value (e.g. ``--device cuda`` without CUDA)."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM after saving its finished work units.

    A ``KeyboardInterrupt`` (so code that catches that still does); the CLI prints
    ``interrupted; N units saved; re-run the same command to resume`` and exits 130.
    """

    def __init__(self, units_saved: int | None = None, run_dir=None):
        super().__init__(f"interrupted; {units_saved} units saved")
        self.units_saved = units_saved
        self.run_dir = run_dir


class CheckpointError(ProbeselectError):
    """A checkpoint directory cannot be discovered, fingerprinted or loaded."""


class TokenizerMismatchError(CheckpointError):
    """Two checkpoints of one ladder do not share a tokenizer."""


class ProbeSpecError(ProbeselectError):
    """A probe spec (YAML) or probe data file is invalid."""


class CurriculumError(ProbeselectError):
    """A toy-ladder curriculum (YAML windows and mixtures) is invalid."""


class ScoringError(ProbeselectError):
    """An item cannot be scored as specified (e.g. a candidate tokenizes to nothing)."""


def did_you_mean(name: str, choices) -> str:
    """Return ' Did you mean "x"?' for the closest choice, or '' if nothing is close."""
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f' Did you mean "{close[0]}"?' if close else ""


class SelectionError(ProbeselectError):
    """Selection inputs (plan lock, pilot/transfer tables, shortlist) are missing or inconsistent."""


class PostHocError(SelectionError):
    """The selection would be post-hoc (plan changed after its lock, or results predate the lock)."""


class RecipeError(ProbeselectError):
    """An SFT recipe (YAML or key=value override) is invalid."""


class SFTDataError(ProbeselectError):
    """SFT training data cannot be loaded or encoded (missing file, zero supervised tokens, lost EOS)."""


class ManifestMismatchError(ProbeselectError):
    """Two runs that should be matched were trained on different data manifests."""


class NonfiniteGradientError(ProbeselectError):
    """A training step produced a nonfinite loss or gradient (fail-fast mode)."""


class ResumeError(ProbeselectError):
    """A saved training state does not belong to this run (different recipe, manifest or base)."""


class TransferError(ProbeselectError):
    """The held-out transfer suite (recipe ``transfer`` section or its data files) is invalid."""
