"""transformers as specdec loads models and tokenizers through it (loading.py, conversion.py, a
served model's tokenizer): quiet, whichever of them imports it first."""


def quiet_transformers():
    """transformers, told to report errors only and draw no progress bars: process-wide settings, made
    where transformers loads a model or tokenizer for specdec rather than when a module is imported."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers
