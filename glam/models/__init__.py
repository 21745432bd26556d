"""Model loading: embedded models, local folders and hub ids."""
