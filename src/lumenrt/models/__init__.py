"""Built-in models, built in code (nothing is downloaded)."""
