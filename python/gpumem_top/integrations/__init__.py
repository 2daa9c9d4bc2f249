"""Callbacks that publish to gpumem-top from the trainers users run most:
``gpumem_top.integrations.huggingface`` (``transformers.Trainer``) and
``gpumem_top.integrations.lightning`` (``lightning`` / ``pytorch_lightning``).
Each imports without its trainer installed and says so when used."""
